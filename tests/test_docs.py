"""The documentation cannot drift from the code.

- Every Python example in the docs and the README runs here, page by page, in order, in one
  namespace per page: a ```pycon / ```python block of ``>>>`` lines runs as a doctest (its
  output is compared, with the project's doctest flags); a ```python block without prompts is
  executed as a script. A block right after a ``<!-- docs-test: skip -->`` line is not run
  (for the rare example that needs a GPU, a cluster or a real server).
- Every code of ``lg.INVARIANTS`` has its section, anchored at the lower-case code, holding the
  text ``lora-guard explain CODE`` prints.
- Every public name has a docstring with an example and appears in the API reference.
- The overhead plot script turns the benchmark's JSON into a PNG.
"""

from __future__ import annotations

import doctest
import importlib.util
import json
import re
import subprocess
import sys
import textwrap
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import lora_guard as lg
from lora_guard._core.catalogue import fix_as_documented

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# These tests provoke violations on purpose: under `pytest --lora-guard` they are expected.
pytestmark = pytest.mark.lora_guard(allow=tuple(lg.INVARIANTS))


def _load_hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "lora_guard_docs_hook", DOCS / "hooks" / "lora_guard_docs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hook = _load_hook()


# --- every example runs ------------------------------------------------------------------

_FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*\{?\.?(?P<lang>[\w+-]*)[^\n]*\n"
    r"(?P<body>.*?)"
    r"^(?P=indent)(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
_SKIP = "<!-- docs-test: skip -->"
_GENERATED = re.compile(r"<!-- lora-guard: (\w+) -->.*?<!-- /lora-guard: \1 -->", re.DOTALL)
_PYTHON = {"python", "py", "pycon", "python3"}


@dataclass(frozen=True)
class Block:
    """One fenced Python block of a page."""

    path: Path
    lineno: int  # 1-based line of the block's first code line
    source: str
    skipped: bool

    @property
    def is_doctest(self) -> bool:
        return any(line.lstrip().startswith(">>>") for line in self.source.splitlines())


def python_blocks(path: Path) -> list[Block]:
    """The Python blocks of a Markdown page, in order."""
    text = path.read_text(encoding="utf-8")
    # generated parts (the catalogue's before/after fragments) are the docs hook's: not run
    generated = [m.span() for m in _GENERATED.finditer(text)]
    blocks = []
    for match in _FENCE.finditer(text):
        if match["lang"].lower() not in _PYTHON:
            continue
        before = text[: match.start()].rstrip().splitlines()
        skipped = (bool(before) and before[-1].strip() == _SKIP) or any(
            start <= match.start() < end for start, end in generated)
        body = textwrap.dedent(
            "\n".join(
                line[len(match["indent"]):] if line.startswith(match["indent"]) else line
                for line in match["body"].splitlines()
            )
        )
        lineno = text.count("\n", 0, match.start("body")) + 1
        blocks.append(Block(path, lineno, body, skipped))
    return blocks


def doc_pages() -> list[Path]:
    pages = sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.parts)
    return [*pages, ROOT / "README.md"]


def _page_id(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return path.name


_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE | doctest.IGNORE_EXCEPTION_DETAIL


def run_page(path: Path) -> None:
    """Run every Python block of ``path`` in one namespace; fail with the first broken one."""
    # A real module, so that dataclasses, pickling and inspect work on the page's classes.
    module = ModuleType("docs_page_" + re.sub(r"\W", "_", path.stem))
    module.__file__ = str(path)
    sys.modules[module.__name__] = module
    try:
        _run_blocks(path, module.__dict__)
    finally:
        del sys.modules[module.__name__]


def _run_blocks(path: Path, namespace: dict[str, Any]) -> None:
    parser = doctest.DocTestParser()
    for block in python_blocks(path):
        if block.skipped:
            continue
        where = f"{_page_id(path)}:{block.lineno}"
        if block.is_doctest:
            test = parser.get_doctest(block.source, namespace, where, str(path), block.lineno - 1)
            runner = doctest.DocTestRunner(optionflags=_FLAGS)
            out: list[str] = []
            runner.run(test, out=out.append, clear_globs=False)
            namespace.update(test.globs)  # DocTest works on a copy: carry its names on
            if runner.failures:
                pytest.fail(f"doctest in {where} failed:\n{''.join(out)}", pytrace=False)
        else:
            # Pad so that a traceback points at the page's own line numbers.
            code = compile("\n" * (block.lineno - 1) + block.source, str(path), "exec")
            try:
                exec(code, namespace)
            except Exception as exc:
                trace = "".join(traceback.format_exception(exc))
                pytest.fail(
                    f"example in {where} raised {type(exc).__name__}: {exc}\n\n{trace}",
                    pytrace=False,
                )


def _instrumented() -> set[str]:
    try:
        from lora_guard import integrations
    except ImportError:
        return set()
    found = set()
    for name in ("peft", "sglang", "vllm"):
        try:
            if getattr(integrations.get(name), "instrumented", False):
                found.add(name)
        except (ImportError, ValueError, AttributeError):
            continue
    return found


@pytest.fixture
def docs_state() -> Iterator[None]:
    """A page may switch modes, filters or integrations for its story: undo them afterwards."""
    mode = lg.get_mode()
    before = _instrumented()
    with warnings.catch_warnings():
        try:
            yield
        finally:
            lg.configure(mode=mode)
            added = _instrumented() - before
            if added:
                from lora_guard import integrations

                integrations.uninstrument(sorted(added))


@pytest.mark.parametrize("page", doc_pages(), ids=_page_id)
@pytest.mark.usefixtures("docs_state")
def test_every_example_on_the_page_runs(page: Path) -> None:
    run_page(page)


def test_the_example_runner_reports_a_wrong_output(tmp_path: Path) -> None:
    page = tmp_path / "wrong.md"
    page.write_text("```pycon\n>>> 1 + 1\n3\n```\n", encoding="utf-8")
    with pytest.raises(pytest.fail.Exception, match=r"wrong.md:2 failed"):
        run_page(page)


def test_the_example_runner_reports_a_failing_script_with_its_line(tmp_path: Path) -> None:
    page = tmp_path / "broken.md"
    page.write_text(
        "# A page\n\n!!! note\n\n    ```python\n    x = 1\n    y = x.missing\n    ```\n",
        encoding="utf-8",
    )
    with pytest.raises(pytest.fail.Exception, match=r"broken.md:6 raised AttributeError"):
        run_page(page)


def test_the_example_runner_shares_one_namespace_and_honours_skip(tmp_path: Path) -> None:
    page = tmp_path / "story.md"
    page.write_text(
        "```python\nsize = 16\n```\n\ntext\n\n"
        "<!-- docs-test: skip -->\n```python\nraise SystemExit('needs a GPU')\n```\n\n"
        "```pycon\n>>> size * 2\n32\n```\n\n```bash\nexit 1\n```\n",
        encoding="utf-8",
    )
    blocks = python_blocks(page)
    assert [b.skipped for b in blocks] == [False, True, False]
    run_page(page)


def test_the_readme_links_lead_to_files() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    assert targets
    missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


# --- the invariants reference --------------------------------------------------------------


@pytest.fixture(scope="module")
def invariants_page() -> str:
    stub = (DOCS / "reference" / "invariants.md").read_text(encoding="utf-8")
    assert hook.INVARIANTS_MARKER in stub, "invariants.md lost the marker the hook renders"
    return str(hook.render_markers(stub))


def _sections(page: str) -> dict[str, str]:
    """Anchor -> text of each '## ... { #anchor }' section."""
    found = {}
    parts = re.split(r"^## (.*)$", page, flags=re.MULTILINE)
    for heading, body in zip(parts[1::2], parts[2::2], strict=True):
        anchor = re.search(r"\{ #([\w-]+) \}\s*$", heading)
        if anchor:
            found[anchor[1]] = heading + body
    return found


@pytest.mark.parametrize("code", list(lg.INVARIANTS))
def test_every_code_has_its_section_with_what_explain_prints(
    code: str, invariants_page: str
) -> None:
    inv = lg.INVARIANTS[code]
    sections = _sections(invariants_page)
    assert inv.docs == f"reference/invariants.md#{code.lower()}"
    assert code.lower() in sections, f"{code} has no section anchored at #{code.lower()}"
    section = sections[code.lower()]
    # exactly what `lora-guard explain CODE` prints, with only the anchor added
    assert section.replace(f" {{ #{code.lower()} }}", "").strip() == (
        inv.explain().removeprefix("## ").strip()
    )
    fixes = [fix_as_documented(fix) for fix in inv.fixes]  # LG105's <feature>
    for text in (inv.slug, inv.title, inv.summary, *inv.triggers, *fixes, inv.error):
        assert text in section
    for situation in inv.situations:
        assert situation in section
    for reporter in inv.raised_by:
        assert f"`{reporter}`" in section
    # the table at the top links to it
    assert f"[{code}](#{code.lower()})" in invariants_page


def test_a_new_code_gets_its_section_without_editing_the_docs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    new = lg.Invariant(
        code="LG999", slug="made-up", title="A made-up invariant", summary="s",
        triggers=("t",), fixes=("f",), error="RegistryError", messages={"m": "{subject}"},
    )
    codes = dict(lg.INVARIANTS)
    codes["LG999"] = new
    monkeypatch.setattr(lg, "INVARIANTS", codes)
    sections = _sections(hook.render_markers(hook.INVARIANTS_MARKER))
    assert list(sections) == [code.lower() for code in codes]
    assert "A made-up invariant" in sections["lg999"]


# --- the API reference and the docstrings --------------------------------------------------


def test_every_public_name_appears_in_the_api_reference() -> None:
    stub = (DOCS / "reference" / "api.md").read_text(encoding="utf-8")
    assert hook.API_MARKER in stub
    page = hook.render_markers(stub)
    missing = [n for n in lg.__all__ if f"::: lora_guard.{n}\n" not in page + "\n"]
    assert not missing, f"not in the API reference: {missing}"


def _docstring(name: str) -> str:
    """The docstring mkdocstrings renders for ``lora_guard.<name>`` (static, via Griffe)."""
    griffe = pytest.importorskip("griffe")
    package = _griffe_package(griffe)
    obj = package[name]
    return obj.docstring.value if obj.docstring is not None else ""


_GRIFFE_CACHE: dict[str, Any] = {}


def _griffe_package(griffe: Any) -> Any:
    if "pkg" not in _GRIFFE_CACHE:
        _GRIFFE_CACHE["pkg"] = griffe.load("lora_guard", search_paths=[str(ROOT / "src")])
    return _GRIFFE_CACHE["pkg"]


@pytest.mark.parametrize("name", lg.__all__)
def test_every_public_name_has_a_docstring_with_an_example(name: str) -> None:
    doc = _docstring(name)
    assert doc.strip(), f"lora_guard.{name} has no docstring"
    assert re.search(r"^\s*Examples?:\s*$", doc, re.MULTILINE) and ">>>" in doc, (
        f"lora_guard.{name}'s docstring has no 'Example:' section with a >>> example"
    )


def test_public_submodules_appear_in_the_modules_reference() -> None:
    stub = (DOCS / "reference" / "modules.md").read_text(encoding="utf-8")
    assert hook.MODULES_MARKER in stub
    page = hook.render_markers(stub)
    for module in hook.public_modules():
        assert f"::: {module}\n" in page


def test_the_site_config_wires_the_generators() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "docs/hooks/lora_guard_docs.py" in config
    assert "docs/hooks/lora_guard_griffe.py" in config
    for page in ("reference/invariants.md", "reference/api.md", "reference/modules.md"):
        assert page in config


# --- the overhead plot ---------------------------------------------------------------------


def test_the_plot_script_draws_the_benchmark_json(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    results = tmp_path / "guards.json"
    results.write_text(json.dumps({"rows": [
        {"name": "plain call", "ns_per_call": 26.0},
        {"name": "hand-written checks", "ns_per_call": 573.0},
        {"name": "lg.shapes (4 tensors, frozen)", "ns_per_call": 610.0},
        {"name": "jaxtyping + beartype", "ns_per_call": 18294.0},
    ]}), encoding="utf-8")
    png = tmp_path / "overhead.png"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "plot_guard_overhead.py"), str(results),
         "--out", str(png)],
        capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(png) in done.stdout


def test_the_plot_script_says_what_is_wrong_with_its_input(tmp_path: Path) -> None:
    results = tmp_path / "bad.json"
    results.write_text(json.dumps({"rows": [{"name": "x"}]}), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "plot_guard_overhead.py"), str(results),
         "--out", str(tmp_path / "x.png")],
        capture_output=True, text=True, check=False,
    )
    assert done.returncode == 2
    assert "ns_per_call" in done.stderr
