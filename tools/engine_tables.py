"""Write the release and rule tables of docs/engines/<engine>.md from the engine profiles.

    python tools/engine_tables.py           # rewrite the tables between their markers
    python tools/engine_tables.py --check   # exit 1 when a page is not what the profiles say

The profiles (`lora_guard._checking.engines.SPECS`) are the one place each rule, the releases it
holds for and its source are written; the pages show them. tests/test_engine_releases.py runs
``--check``.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from lora_guard._checking.engines import SPECS, Engine

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "engines"
NAMES = {"vllm": "vLLM", "sglang": "sglang", "lmdeploy": "lmdeploy", "peft": "PEFT"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def releases_table(spec: Engine) -> list[str]:
    rows = ["| release | `--engine` | its rules that hold only for some releases |",
            "|---|---|---|"]
    for version in spec.releases:
        bound = [f"{r.code} ({r.releases})" for r in spec.at(version).rules
                 if r.since or r.until]
        pin = f"`--engine {spec.name}=={version}`"
        if version == spec.releases[0]:
            pin += f" (`--engine {spec.name}` when none is installed)"
        rows.append(f"| {version} | {pin} | {_cell(', '.join(bound)) or '-'} |")
    return rows


def rules_table(spec: Engine) -> list[str]:
    name = NAMES[spec.name]
    rows = [f"| code | releases | rule | source | {name} itself | lora_guard |",
            "|---|---|---|---|---|---|"]
    for rule in spec.rules:
        sources = "; ".join(f"`{s}`" for s in rule.source.split("; "))
        itself = "refuses" if rule.engine_refuses else "silent: loads, serves wrongly"
        checked = "checks" if rule.checked else "**not modelled yet**"
        rows.append(f"| {rule.code} | {rule.releases} | {_cell(rule.text)} | {sources} | "
                    f"{itself} | {checked} |")
    return rows


def _replace(page: str, marker: str, rows: list[str]) -> str:
    start, end = f"<!-- {marker}: start -->", f"<!-- {marker}: end -->"
    if start not in page or end not in page:
        raise SystemExit(f"markers {start} ... {end} missing")
    head, rest = page.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n" + "\n".join(rows) + f"\n{end}{tail}"


def render(engine: str, page: str) -> str:
    spec = SPECS[engine]
    page = _replace(page, "releases", releases_table(spec))
    return _replace(page, "rules", rules_table(spec))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether pages are current")
    args = parser.parse_args(argv)
    stale = []
    for engine in ("vllm", "sglang", "lmdeploy"):
        path = DOCS / f"{engine}.md"
        page = path.read_text()
        new = render(engine, page)
        if new != page:
            stale.append(str(path))
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print("not current (run python tools/engine_tables.py):", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
