"""The ``lora-guard`` command: ``check`` adapters, ``explain`` a code, list ``codes``.

Exit status: 0 when no selected violation was found, 1 when one was, 2 for a usage error (bad
options, a path that does not exist, an unreadable base config, bad configuration in
``pyproject.toml``, an unknown code). No traceback reaches the user.

How ``check`` is put together, for the commands and options added to it:

- every long option of ``check`` is also a ``[tool.lora-guard]`` key in ``pyproject.toml``
  (`_apply_config` reads the parser's own actions, so a new option is a config key at once;
  an option whose metavar is ``FILE`` or ``DIR`` is resolved relative to the config file);
- `_run_check` builds the limits, runs the checker, applies ``--select``/``--ignore`` to the
  report, then hands it to one writer per ``--format`` (`_WRITERS`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import pathlib
import re
import shutil
import sys
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, NoReturn
from urllib.parse import quote

if TYPE_CHECKING:
    from lora_guard._checking.check_adapters import Report
    from lora_guard._core.errors import Violation

__all__ = ["DOCS_URL", "main"]

PROGRESS_MIN_ADAPTERS = 50
"""Show a progress bar on a terminal's stderr from this many adapters on."""

DOCS_URL = "https://lora-guard.readthedocs.io/en/latest/"
"""Where the documentation site is published (SARIF rules' ``helpUri`` point into it)."""

CONFIG_SECTION = "tool.lora-guard"
FORMATS = ("text", "json", "github", "sarif")
_NOT_CONFIG = {"config", "isolated", "help"}  # options that make no sense in a config file


class UsageError(Exception):
    """A problem with how ``lora-guard`` was called or configured: exit 2, no traceback."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own exit 2, with a hint
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _rank_list(text: str) -> list[int]:
    return [_positive(part.strip()) for part in text.split(",") if part.strip()] or [
        _positive(text)]


def _name_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give a comma-separated list such as q_proj,v_proj")
    return names


def _code_list(text: str) -> list[str]:
    """Codes or prefixes (``LG101``, ``LG1``, ``ALL``), each checked against the catalogue."""
    from lora_guard._core.catalogue import INVARIANTS

    out = []
    for part in _name_list(text):
        wanted = part.upper()
        if wanted != "ALL" and not any(code.startswith(wanted) for code in INVARIANTS):
            raise argparse.ArgumentTypeError(
                f"{part!r} is neither a code nor the start of one; codes: "
                f"{', '.join(INVARIANTS)} (lora-guard codes lists them)")
        out.append(wanted)
    return out


def _parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    from lora_guard import __version__

    parser = _Parser(
        prog="lora-guard",
        description="Check LoRA adapters on disk against what a server serves, from their "
        "config and safetensors headers only.",
    )
    parser.add_argument("--version", action="version", version=f"lora-guard {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    check = commands.add_parser(
        "check", help="check adapters (folders are searched for adapters)",
        description="Check adapters: exit 0 when none has a selected violation, 1 when one "
        "has, 2 for a usage error (bad option or configuration, a path that does not exist). "
        "Every long option is also a key of [tool.lora-guard] in pyproject.toml.",
    )
    check.add_argument("paths", nargs="*", metavar="PATH",
                       help="an adapter folder, a file in one, or a folder searched for "
                       "adapter folders (none when a serve command after -- names them)")
    served = check.add_argument_group("what the server serves")
    served.add_argument("--engine", metavar="ENGINE[==VERSION]",
                        help="check for this engine release: vllm, sglang or peft (newest "
                        "supported release without ==VERSION); its own serve flags go after "
                        "--, e.g. -- --max-lora-rank 64. Or paste a whole serve command after "
                        "--: -- vllm serve MODEL --enable-lora --lora-modules a=PATH ...")
    served.add_argument("--max-rank", type=_positive, metavar="N",
                        help="largest rank the server serves (vLLM --max-lora-rank)")
    served.add_argument("--allowed-ranks", type=_rank_list, metavar="R,R",
                        help="the only ranks the server serves, e.g. 8,16,32")
    served.add_argument("--max-loras", type=_positive, metavar="N",
                        help="adapters the server must hold loaded at once (sglang "
                        "--max-loaded-loras); not vLLM --max-loras, whose slots adapters are "
                        "swapped through")
    served.add_argument("--target-modules", type=_name_list, metavar="M,M",
                        help="module types the server applies LoRA to, e.g. q_proj,v_proj")
    served.add_argument("--dtypes", type=_name_list, metavar="D,D",
                        help="allowed dtypes, e.g. bfloat16,float16, for a server that does "
                        "not cast (vLLM and sglang cast adapter weights to the model's dtype)")
    served.add_argument("--base-config", metavar="FILE",
                        help="the base model's Hugging Face config.json (checks dims, layers, "
                        "experts, vocab)")
    served.add_argument("--allow", type=_name_list, metavar="F,F",
                        help="features the server implements: dora, lora_bias, bias, "
                        "modules_to_save, trainable_tokens, peft_type, alora, "
                        "layer_replication, qalora, bdlora, added_tokens")
    served.add_argument("--scan-values", action="store_true",
                        help="also read every tensor's values once (bounded memory): lora_B "
                        "all zeros (LG119, the adapter does nothing), NaN or Inf (LG120)")
    shown = check.add_argument_group("what is reported")
    shown.add_argument("--select", type=_code_list, metavar="CODES",
                       help="report only these codes or prefixes, e.g. LG1,LG002 (default: all)")
    shown.add_argument("--ignore", type=_code_list, metavar="CODES",
                       help="never report these codes or prefixes; the more specific of "
                       "--select and --ignore wins, --ignore on a tie")
    shown.add_argument("--format", choices=FORMATS, default="text",
                       help="text (a table, then violations by adapter), json, github "
                       "(workflow commands that annotate files) or sarif (SARIF 2.1.0)")
    shown.add_argument("--quiet", "-q", action="store_true",
                       help="text: print the violations only (no table, no summary)")
    shown.add_argument("--statistics", action="store_true",
                       help="print how many violations of each code, not the violations "
                       "(text or json)")
    shown.add_argument("--no-progress", action="store_true",
                       help="never show the progress bar (shown on a terminal only)")
    conf = check.add_argument_group("configuration")
    conf.add_argument("--config", metavar="FILE",
                      help="read options from this file instead of the nearest pyproject.toml "
                      "([tool.lora-guard] of a pyproject.toml, the top level of another "
                      ".toml)")
    conf.add_argument("--isolated", action="store_true",
                      help="ignore every configuration file")

    explain = commands.add_parser(
        "explain", help="explain an invariant code, e.g. LG101",
        description="Explain a code: rendered for a terminal, plain text when piped.")
    explain.add_argument("code", metavar="CODE", help="a code such as LG101, or its slug")
    explain.add_argument("--markdown", action="store_true",
                         help="print the Markdown source (as in the invariants reference)")
    codes = commands.add_parser("codes", help="list every code with its slug and title")
    codes.add_argument("--format", choices=("text", "json"), default="text",
                       help="text (a table) or json (code, slug, title, summary, url)")
    doctor = commands.add_parser(
        "doctor", help="for each installed engine: version, supported?, each hook attached",
        description="For each installed engine (vLLM, sglang): its version, whether lora_guard "
                    "supports it (the versions its engine tier tests), and each hook attached "
                    "or missing. Exit 1 when a supported engine misses a hook.")
    doctor.add_argument("--format", choices=("text", "json"), default="text",
                        help="text (one block per engine) or json")
    verify = commands.add_parser(
        "verify", help="run the installed engine's own LoRA layers against PEFT's, module by "
        "module, on the CPU (needs the engine, PEFT and the base's weights)",
        description="Build the installed engine's model and LoRA layers on the CPU, load the "
        "adapter with the engine's own loader and run every LoRA-wrapped module (prefill and "
        "decode) against PEFT's LoRA layers reloaded from the adapter's files; the base's "
        "weights are read one module at a time. Exit 0 when every module serves as trained, "
        "1 when one differs or the engine refuses the adapter, 2 when it cannot run.")
    verify.add_argument("adapter", metavar="ADAPTER", help="the adapter's folder")
    verify.add_argument("--engine", required=True, choices=("vllm", "sglang"),
                        help="the installed engine whose LoRA layers run")
    verify.add_argument("--base", required=True, metavar="MODEL_DIR",
                        help="the base model's folder: config.json and *.safetensors")
    verify.add_argument("--format", choices=("text", "json"), default="text",
                        help="text (modules that differ, then the verdict) or json (every "
                        "module)")
    verify.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser, check


# --- configuration -------------------------------------------------------------------------


def find_config(start: pathlib.Path) -> pathlib.Path | None:
    """The nearest ``pyproject.toml`` with a ``[tool.lora-guard]`` table, from ``start`` up."""
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            try:
                table = _read_toml(candidate)
            except UsageError:
                with contextlib.suppress(OSError, UnicodeDecodeError):
                    if "[tool.lora-guard]" in candidate.read_text("utf-8"):
                        raise  # ours, and broken
                continue  # another tool's broken file is not ours to refuse
            if isinstance(table.get("tool"), dict) and "lora-guard" in table["tool"]:
                return candidate
    return None


def _read_toml(path: pathlib.Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}") from None


def load_config(path: pathlib.Path) -> dict[str, Any]:
    """The lora-guard table of a config file (``[tool.lora-guard]`` of a pyproject.toml)."""
    data = _read_toml(path)
    if path.name != "pyproject.toml":
        return data
    tool = data.get("tool", {})
    table = tool.get("lora-guard", {}) if isinstance(tool, dict) else {}
    if not isinstance(table, dict):
        raise UsageError(f"{path}: [{CONFIG_SECTION}] must be a table")
    return table


def _config_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    keys = {}
    for action in parser._actions:
        for option in action.option_strings:
            if option.startswith("--") and option[2:] not in _NOT_CONFIG:
                keys[option[2:]] = action
    return keys


def _apply_config(parser: argparse.ArgumentParser, table: Mapping[str, Any],
                  source: pathlib.Path) -> None:
    """Make each key of ``table`` the default of its option: flags given still override."""
    actions = _config_actions(parser)
    where = f"{source} [{CONFIG_SECTION}]" if source.name == "pyproject.toml" else str(source)
    for key, value in table.items():
        action = actions.get(key)
        if action is None:
            known = ", ".join(sorted(actions))
            raise UsageError(f"{where}: unknown key {key!r}; keys are the long options of "
                             f"lora-guard check: {known}")
        parser.set_defaults(**{action.dest: _config_value(action, key, value, source, where)})


def _config_value(action: argparse.Action, key: str, value: Any, source: pathlib.Path,
                  where: str) -> Any:
    if action.nargs == 0:  # a flag
        if not isinstance(value, bool):
            raise UsageError(f"{where}: {key} takes true or false, not {value!r}")
        return value if action.const is True or action.const is None else not value
    if isinstance(value, list):
        if not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value):
            raise UsageError(f"{where}: {key} takes a list of names or numbers, not {value!r}")
        text = ",".join(str(v) for v in value)
    elif isinstance(value, (str, int)) and not isinstance(value, bool):
        text = str(value)
    else:
        raise UsageError(f"{where}: {key} takes a string, a number or a list, not {value!r}")
    if action.metavar in ("FILE", "DIR") and "://" not in text:
        text = str(source.parent / pathlib.Path(text).expanduser())
    if action.choices is not None and text not in action.choices:
        raise UsageError(f"{where}: {key} = {value!r} is not one of "
                         f"{', '.join(map(str, action.choices))}")
    convert = action.type
    if callable(convert):
        try:
            return convert(text)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise UsageError(f"{where}: {key}: {exc}") from None
    return text


def _split_engine_argv(argv: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """``check ... -- ENGINE FLAGS`` -> (lora-guard's own arguments, the engine's or None)."""
    words = list(argv)
    if "check" not in words or "--" not in words or words.index("--") < words.index("check"):
        return words, None
    cut = words.index("--")
    return words[:cut], words[cut + 1:]


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser, check = _parser()
    argv, engine_argv = _split_engine_argv(argv)
    args = parser.parse_args(argv)
    if args.command == "check":
        args.engine_argv = engine_argv
    if args.command != "check" or args.isolated:
        return args
    source = (pathlib.Path(args.config) if args.config
              else find_config(pathlib.Path.cwd()))
    if source is None:
        return args
    if args.config and not source.is_file():
        raise UsageError(f"--config: no such file: {args.config}")
    _apply_config(check, load_config(source), source)
    args = parser.parse_args(argv)  # again: flags given override the file's defaults
    args.engine_argv = engine_argv
    args.config_file = str(source)
    return args


# --- selection -----------------------------------------------------------------------------


def _selector(select: Iterable[str] | None,
              ignore: Iterable[str] | None) -> Callable[[str], bool]:
    """Whether a code is reported: the longest matching prefix decides, ignore on a tie."""
    rules = [(p, True) for p in (select or ["ALL"])] + [(p, False) for p in ignore or ()]

    def chosen(code: str) -> bool:
        best, keep = -1, False
        for prefix, on in rules:
            length = 0 if prefix == "ALL" else len(prefix)
            if (prefix == "ALL" or code.startswith(prefix)) and (
                    length > best or (length == best and not on)):
                best, keep = length, on
        return keep

    return chosen


def _filtered(report: Report, chosen: Callable[[str], bool]) -> Report:
    by_adapter = {key: kept for key, found in report.by_adapter.items()
                  if (kept := tuple(v for v in found if chosen(v.code)))}
    import types

    return dataclasses.replace(
        report, violations=tuple(v for v in report.violations if chosen(v.code)),
        by_adapter=types.MappingProxyType(by_adapter))


# --- output --------------------------------------------------------------------------------


class _Style:
    """ANSI styles on a terminal, none when piped or when ``NO_COLOR`` is set."""

    def __init__(self, stream: IO[str]) -> None:
        self.on = _colour_allowed(stream)

    def __call__(self, text: str, *codes: int) -> str:
        if not self.on or not codes:
            return text
        return f"\033[{';'.join(map(str, codes))}m{text}\033[0m"


def _colour_allowed(stream: IO[str]) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


BOLD, DIM, RED, CYAN = 1, 2, 31, 36


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"  # pragma: no cover


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines: list[str] = []
    for row in rows:
        cells = [cell.rjust(w) if i in right else cell.ljust(w)
                 for i, (cell, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    return lines


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _violation_lines(report: Report, style: _Style) -> list[str]:
    lines: list[str] = []
    for adapter_id in [*report.ids, "*"]:
        found = report.by_adapter.get(adapter_id, ())
        if not found:
            continue
        if lines:
            lines.append("")
        lines.append(style("adapter set" if adapter_id == "*" else adapter_id, BOLD))
        for v in found:
            prefix = f"{v.subject}: "
            message = v.message[len(prefix):] if v.message.startswith(prefix) else v.message
            lines.append(f"  {style(v.code, BOLD, RED)} {v.invariant}: {message}")
            lines.append(style(f"    fix: {v.hint}", DIM))
    return lines


def _text_report(report: Report, *, quiet: bool = False, style: _Style | None = None) -> str:
    style = style or _Style(sys.stdout)
    if quiet:
        lines = _violation_lines(report, style)
        return "\n".join(lines) + "\n" if lines else ""
    rows = [["ADAPTER", "RANK", "DTYPE", "LAYOUT", "TARGETS", "SIZE", "RESULT"]]
    for adapter_id in report.ids:
        spec = report.spec(adapter_id)
        found = report.by_adapter.get(adapter_id, ())
        result = "ok" if not found else ", ".join(dict.fromkeys(v.code for v in found))
        if spec is None:
            rows.append([adapter_id, "-", "-", "-", "-", "-", result])
            continue
        rows.append([
            adapter_id, str(spec.rank), ",".join(spec.dtypes) or "-", spec.layout,
            _short(",".join(spec.target_modules) or "-", 40), _size(spec.size), result,
        ])
    from lora_guard._core.errors import printable

    rows = [[printable(cell) for cell in row] for row in rows]  # names come from files
    lines = _table(rows, right={1, 5})
    failed = sum(1 for i in report.ids if report.by_adapter.get(i))
    lines.append("")
    count = len(report.ids)
    lines.append(
        f"{count} adapter{'s' * (count != 1)} checked: "
        + ("all pass." if report.ok else
           f"{failed} failed, {len(report.violations)} violation"
           f"{'s' * (len(report.violations) != 1)}.")
    )
    found_lines = _violation_lines(report, style)
    if found_lines:
        lines += ["", *found_lines]
    if not report.ok:
        codes = sorted({v.code for v in report.violations})
        lines.append("")
        lines.append("More on a code: lora-guard explain " + codes[0])
    return "\n".join(lines) + "\n"


def _statistics(report: Report) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for v in report.violations:
        counts[v.code] = counts.get(v.code, 0) + 1
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def _statistics_text(report: Report) -> str:
    from lora_guard._core.catalogue import INVARIANTS

    stats = _statistics(report)
    rows = [[str(n), code, INVARIANTS[code].slug, INVARIANTS[code].title] for code, n in stats]
    text = "\n".join(_table(rows, right={0})) + "\n" if rows else ""
    return text + _transferred_text(report)


def _transferred_text(report: Report) -> str:
    """For remote adapters: the bytes each one's check read over the network, and the total."""
    remote = [s for s in report.adapters if s.transferred is not None]
    if not remote:
        return ""
    rows = [["TRANSFERRED", "SIZE", "REMOTE ADAPTER"]]
    rows += [[_size(s.transferred), _size(s.size), s.url or str(s.path)] for s in remote]
    total = sum(s.transferred or 0 for s in remote)
    held = sum(s.size for s in remote)
    return ("\n" if report.violations else "") + "\n".join(_table(rows, right={0, 1})) + (
        f"\n{len(remote)} remote adapters: {_size(total)} transferred for {_size(held)} "
        "held (config and safetensors header only)\n")


def _statistics_json(report: Report) -> str:
    from lora_guard._core.catalogue import INVARIANTS

    data = [{"code": code, "name": INVARIANTS[code].slug, "count": n}
            for code, n in _statistics(report)]
    return json.dumps(data, indent=2) + "\n"


def _location(report: Report, adapter_id: str, v: Violation | None) -> str | None:
    """The file an annotation points at: the file named by the violation, else the adapter's
    ``adapter_config.json``, else the adapter itself; None for the set as a whole."""
    if adapter_id == "*" or "://" in adapter_id:
        return None if adapter_id == "*" else adapter_id
    folder = pathlib.Path(adapter_id)
    file = v.details.get("file") if v is not None else None
    if isinstance(file, str) and file and not pathlib.PurePath(file).is_absolute() \
            and ".." not in pathlib.PurePath(file).parts:
        return str(folder / file)
    config = folder / "adapter_config.json"
    if folder.is_dir() and config.exists():
        return str(config)
    return str(folder)


def _github_escape(text: str, *, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


def _github_report(report: Report) -> str:
    lines: list[str] = []
    for adapter_id in [*report.ids, "*"]:
        for v in report.by_adapter.get(adapter_id, ()):
            where = _location(report, adapter_id, v)
            props = [f"file={_github_escape(where, prop=True)}"] if where else []
            props.append(f"title={v.code}")
            body = f"{v.invariant}: {v.message} Fix: {v.hint}"
            lines.append(f"::error {','.join(props)}::{_github_escape(body)}")
    return "\n".join(lines) + "\n" if lines else ""


def _help_uri(docs: str) -> str:
    page, _, anchor = docs.partition("#")
    page = page.removesuffix(".md") + "/"
    return DOCS_URL + page + (f"#{anchor}" if anchor else "")


def _artifact_uri(path: str) -> str:
    if "://" in path:
        return path
    p = pathlib.Path(path)
    if p.is_absolute():
        return p.as_uri()
    return quote(p.as_posix())


def sarif_log(report: Report) -> dict[str, Any]:
    """The report as a SARIF 2.1.0 log: one rule per catalogue code, one result per violation."""
    from lora_guard import __version__
    from lora_guard._core.catalogue import INVARIANTS

    codes = list(INVARIANTS)
    rules = [{
        "id": code,
        "name": inv.slug,
        "shortDescription": {"text": inv.title},
        "fullDescription": {"text": inv.summary},
        "help": {"text": "\n".join(f"{i}. {fix}" for i, fix in enumerate(inv.fixes, 1)),
                 "markdown": inv.explain()},
        "helpUri": _help_uri(inv.docs),
        "defaultConfiguration": {"level": "error"},
    } for code, inv in INVARIANTS.items()]
    results = []
    readable = [i for i in report.ids if report.spec(i) is not None] or list(report.ids)
    for adapter_id in [*report.ids, "*"]:
        for v in report.by_adapter.get(adapter_id, ()):
            targets = [adapter_id] if adapter_id != "*" else readable
            locations = []
            for target in targets:
                where = _location(report, target, v if adapter_id != "*" else None)
                if where:
                    locations.append({"physicalLocation": {
                        "artifactLocation": {"uri": _artifact_uri(where)}}})
            result: dict[str, Any] = {
                "ruleId": v.code,
                "ruleIndex": codes.index(v.code),
                "level": "error",
                "message": {"text": f"{v.message} Fix: {v.hint}"},
                "locations": locations,
            }
            if v.details:
                result["properties"] = {"details": v.to_dict()["details"]}
            results.append(result)
    return {
        "$schema": "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "lora-guard",
                "version": __version__,
                "informationUri": DOCS_URL,
                "rules": rules,
            }},
            "results": results,
        }],
    }


def _sarif_report(report: Report) -> str:
    return json.dumps(sarif_log(report), indent=2) + "\n"


class _Progress:
    """A one-line progress bar on a terminal's stderr."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.shown = False

    def __call__(self, done: int, total: int) -> None:
        if total < PROGRESS_MIN_ADAPTERS:
            return
        if done != total and done % max(1, total // 100):
            return
        width = 30
        filled = width * done // total
        self.stream.write(f"\rchecking [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()


def _wants_progress(args: argparse.Namespace) -> bool:
    stream = sys.stderr
    return (not args.no_progress and not args.quiet
            and bool(getattr(stream, "isatty", None)) and stream.isatty())


# --- commands ------------------------------------------------------------------------------


def _is_remote(raw: str) -> bool:
    from lora_guard._reading.remote import is_remote

    return is_remote(raw)


def _local_paths(paths: Sequence[str]) -> list[str]:
    """Each PATH as the checker takes it: a file of an adapter stands for its folder (what
    pre-commit passes), each adapter once; a local path that does not exist is a usage error."""
    out: dict[str, None] = {}
    for raw in paths:
        if "://" in raw or _is_remote(raw):  # a remote adapter (or a bare Hub id that names
            # no local path): its reader says whether it exists
            out[raw] = None
            continue
        path = pathlib.Path(raw)
        if not path.exists() and not path.is_symlink():
            raise UsageError(f"no such file or folder: {raw}")
        if path.is_file() and path.name.startswith("adapter_") and path.parent != path:
            out[str(path.parent)] = None
        else:
            out[raw] = None
    return list(out)


_GENERIC = ("max_rank", "allowed_ranks", "max_loras", "target_modules", "dtypes", "allow")


def _engine_limits(args: argparse.Namespace) -> tuple[Any, list[str]]:
    """--engine and/or the words after --: the engine's limits and the adapters it names."""
    from lora_guard._checking.engines import (
        EngineOptionError,
        is_serve_command,
        limits_for_engine,
        parse_serve_command,
        profile,
    )

    tail: list[str] = args.engine_argv or []
    given = [f"--{name.replace('_', '-')}" for name in _GENERIC if getattr(args, name)]
    if given:
        raise UsageError(
            f"{', '.join(given)} with an engine: give the engine's own flags after -- "
            "instead (e.g. -- --max-lora-rank 64); see docs/engines/")
    try:
        if is_serve_command(tail):
            version = None
            if args.engine:
                release = profile(args.engine)
                version = release.version
            command = parse_serve_command(tail, version=version, base_config=args.base_config)
            ran = str(command.limits.engine).split("==")[0]
            if args.engine and ran != args.engine.split("==")[0].strip().lower():
                raise UsageError(f"--engine {args.engine} but the command after -- runs "
                                 f"{command.limits.engine}")
            return command.limits, [path for _, path in command.adapters]
        if not args.engine:
            raise UsageError(
                "the words after -- are not a serve command (vllm serve MODEL ... or python -m "
                "sglang.launch_server ...): give --engine vllm|sglang|peft for engine flags")
        return limits_for_engine(args.engine, *tail, base_config=args.base_config), []
    except EngineOptionError as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:
        if args.base_config and "base config" in str(exc):
            raise UsageError(f"--base-config: {exc}") from None
        raise UsageError(str(exc)) from None


def _limits(args: argparse.Namespace) -> Any:
    from lora_guard._checking.check_adapters import ServingLimits

    try:
        return ServingLimits(
            max_rank=args.max_rank, allowed_ranks=args.allowed_ranks, max_loras=args.max_loras,
            target_modules=args.target_modules, dtypes=args.dtypes,
            base_config=args.base_config, allow=frozenset(args.allow or ()),
        )
    except ValueError as exc:
        message = str(exc)
        if args.base_config and "base config" in message:
            raise UsageError(f"--base-config: {message}") from None
        raise UsageError(message.replace("ServingLimits(", "option (").replace("=...)", ")")
                         ) from None


def _run_check(args: argparse.Namespace) -> int:
    from lora_guard._checking.check_adapters import check_adapters

    if args.statistics and args.format not in ("text", "json"):
        raise UsageError("--statistics prints text or json; drop --format "
                         f"{args.format} or --statistics")
    named: list[str] = []
    if getattr(args, "engine", None) or getattr(args, "engine_argv", None) is not None:
        limits, named = _engine_limits(args)
    else:
        limits = _limits(args)
    if not args.paths and not named:
        raise UsageError("no adapters to check: give PATHs, or a serve command after -- that "
                         "names them (--lora-modules / --lora-paths)")
    paths = _local_paths([*args.paths, *named])
    progress = _Progress(sys.stderr) if _wants_progress(args) else None
    from lora_guard._reading.remote import RemoteSetupError

    try:
        report = check_adapters(paths, limits, progress=progress,
                                scan_values=bool(getattr(args, "scan_values", False)))
    except RemoteSetupError as exc:  # remote paths without the extra, or a bad setting
        raise UsageError(str(exc)) from None
    finally:
        if progress is not None:
            progress.close()
    report = _filtered(report, _selector(args.select, args.ignore))
    if args.statistics:
        out = _statistics_json(report) if args.format == "json" else _statistics_text(report)
    else:
        out = _WRITERS[args.format](report, args)
    sys.stdout.write(out)
    return 0 if report.ok else 1


_WRITERS: dict[str, Callable[[Report, argparse.Namespace], str]] = {
    "text": lambda report, args: _text_report(report, quiet=args.quiet),
    "json": lambda report, args: report.to_json() + "\n",
    "github": lambda report, args: _github_report(report),
    "sarif": lambda report, args: _sarif_report(report),
}


_INLINE = re.compile(r"``(.+?)``|`([^`]+)`|\*\*(.+?)\*\*")


def _plain(text: str) -> str:
    """Inline Markdown without its markers."""
    return _INLINE.sub(lambda m: m.group(1) or m.group(2) or m.group(3), text)


def _wrap(text: str, first: str, rest: str, width: int) -> list[str]:
    return textwrap.wrap(text, width=width, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False, break_long_words=False) or [first]


def _render_line(line: str, style: _Style, width: int) -> list[str]:
    """One Markdown line outside a code block, for a terminal."""
    if line.startswith("## "):
        title = line[3:]
        return [style(title, BOLD)] if style.on else [title, "=" * min(len(title), width)]
    bullet = re.match(r"^(- |\d+\. )(.*)$", line)
    if bullet:
        marker = bullet.group(1)
        # wrap the plain text, then style: styles must not count towards the width
        lines = _wrap(_plain(bullet.group(2)), "  " + marker, "  " + " " * len(marker), width)
        return _restyle(lines, bullet.group(2), style) if style.on else lines
    if not line.strip():
        return [""]
    if style.on and line.startswith("**") and line.endswith("**"):
        return [style(_plain(line), BOLD)]
    return _wrap(_plain(line), "", "", width)


def render_markdown(markdown: str, *, style: _Style | None = None, width: int = 100) -> str:
    """The catalogue's Markdown for a terminal: headings set off, code indented, paragraphs
    wrapped, no Markdown markers; ANSI styles only when ``style`` allows them."""
    style = style or _Style(sys.stdout)
    out: list[str] = []
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif in_code:
            out.append("    " + style(line, CYAN))
        else:
            out.extend(_render_line(line, style, width))
    return "\n".join(out).rstrip() + "\n"


def _restyle(lines: list[str], source: str, style: _Style) -> list[str]:
    """Colour the code spans of wrapped lines (spans that were split keep no colour)."""
    spans = [m.group(1) or m.group(2) for m in _INLINE.finditer(source)
             if m.group(3) is None]
    styled = []
    for line in lines:
        for span in dict.fromkeys(spans):
            if span in line:
                line = line.replace(span, style(span, CYAN))
        styled.append(line)
    return styled


def _explain(code: str, *, markdown: bool) -> int:
    from lora_guard._core.catalogue import INVARIANTS

    wanted = code.strip()
    by_slug = {inv.slug: c for c, inv in INVARIANTS.items()}
    key = wanted.upper() if wanted.upper() in INVARIANTS else by_slug.get(wanted.lower())
    if key is None:
        raise UsageError(
            f"explain: unknown code {code!r}; known codes: "
            f"{', '.join(INVARIANTS)} (see: lora-guard codes)"
        )
    text = INVARIANTS[key].explain()
    if not markdown:
        width = min(shutil.get_terminal_size((100, 24)).columns, 100)
        text = render_markdown(text, style=_Style(sys.stdout), width=width)
    sys.stdout.write(text)
    return 0


def _codes(fmt: str) -> int:
    from lora_guard._core.catalogue import INVARIANTS

    if fmt == "json":
        data = [{"code": c, "slug": inv.slug, "title": inv.title, "summary": inv.summary,
                 "error": inv.error, "url": _help_uri(inv.docs)}
                for c, inv in INVARIANTS.items()]
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return 0
    rows = [["CODE", "SLUG", "TITLE"]]
    rows += [[c, inv.slug, inv.title] for c, inv in INVARIANTS.items()]
    sys.stdout.write("\n".join(_table(rows, right=set())) + "\n")
    return 0


DOCTOR_ENGINES = ("vllm", "sglang")


def _doctor(output: str) -> int:
    """``lora-guard doctor``: each installed engine's hooks, attached or missing."""
    from lora_guard.integrations import get

    reports = {name: get(name).diagnose() for name in DOCTOR_ENGINES}  # type: ignore[attr-defined]
    failing = [name for name, r in reports.items()
               if r is not None and r.supported and (r.missing or r.pending)]
    if output == "json":
        data = {name: (None if r is None else r.as_dict()) for name, r in reports.items()}
        sys.stdout.write(json.dumps({"engines": data, "ok": not failing}, indent=2) + "\n")
        return 1 if failing else 0
    lines: list[str] = []
    for name, r in reports.items():
        if r is None:
            lines.append(f"{name}: not installed")
            continue
        state = "supported" if r.supported else "NOT supported (hooks attach only where the " \
            "signatures match)"
        lines.append(f"{name} {r.version}: {state}; tested: {name} {r.supported_range}")
        lines += [f"  attached  {hook}" for hook in r.attached]
        lines += [f"  MISSING   {hook}: {why}" for hook, why in r.missing.items()]
        lines += [f"  pending   {module} (not imported)" for module in r.pending]
    if failing:
        lines.append(f"lora-guard doctor: {', '.join(failing)} supported but missing hooks: "
                     "lora_guard does not guard those paths; report it with this output.")
    sys.stdout.write("\n".join(lines) + "\n")
    return 1 if failing else 0


def _verify(args: argparse.Namespace) -> int:
    """``lora-guard verify`` (`lora_guard._frontends.verify`: imports torch and the engine)."""
    if importlib.util.find_spec("torch") is None:
        raise UsageError("[torch-missing] verify runs the engine's LoRA layers and needs "
                         "torch: pip install 'lora-guard[torch]' and the engine")
    from lora_guard._frontends import verify

    try:
        return verify.run(args.adapter, engine=args.engine, base=args.base, out=sys.stdout,
                          err=sys.stderr, progress=not args.no_progress,
                          as_json=args.format == "json")
    except verify.VerifyError as exc:
        raise UsageError(str(exc)) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``lora-guard``; returns the exit status (0 pass, 1 violations, 2 usage error).

    Example:
        >>> from lora_guard._frontends.cli import main
        >>> main(["explain", "LG110", "--markdown"])  # doctest: +ELLIPSIS
        ## LG110 too-many-adapters: More adapters than the served slot count
        ...
        0
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parse(argv)
        if args.command == "check":
            return _run_check(args)
        if args.command == "explain":
            return _explain(args.code, markdown=args.markdown)
        if args.command == "doctor":
            return _doctor(args.format)
        if args.command == "verify":
            return _verify(args)
        return _codes(args.format)
    except UsageError as exc:
        sys.stderr.write(f"lora-guard: error: {exc}\n")
        return 2
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else 2
    except KeyboardInterrupt:
        sys.stderr.write("lora-guard: interrupted\n")
        return 130
    except BrokenPipeError:  # e.g. piped into head
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        return 1
    except Exception as exc:  # never a traceback: say what happened and where to report it
        sys.stderr.write(
            f"lora-guard: internal error: {type(exc).__name__}: {exc}\n"
            "Please report this at the lora_guard issue tracker with the command you ran.\n"
        )
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
