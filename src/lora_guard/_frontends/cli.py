"""The ``lora-guard`` command: ``check`` adapters, ``explain`` a code, list ``codes``, ``doctor``.

Exit status: 0 when no selected violation was found, 1 when one was, 2 for a usage error (bad
options, a path that does not exist, an unreadable base config, bad configuration in
``pyproject.toml``, an unknown code). No traceback reaches the user.

How it is put together, for the commands and options added to it:

- `_parser` builds every subcommand; `COMMANDS` maps a subcommand's name to the function that
  runs it (``args -> exit status``): a new subcommand is a parser in `_parser` and one entry
  there;
- every long option of ``check`` is also a ``[tool.lora-guard]`` key in ``pyproject.toml``: it
  is added through `ConfigKeys.add` (`lora_guard._frontends._config`), which records it as a
  key;
- `_run_check` builds the limits, runs the checker, applies ``--select``/``--ignore`` to the
  report, then hands it to one writer per ``--format`` (`WRITERS`), each in a module of its
  own: ``_output_text``, ``_output_json``, ``_output_github``, ``_output_sarif``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import pathlib
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, TYPE_CHECKING, Any, NoReturn

from lora_guard._core.errors import printable
from lora_guard._frontends._config import ConfigKeys, apply_config, find_config, load_config
from lora_guard._frontends._locations import DOCS_URL
from lora_guard._frontends._output_github import github_report
from lora_guard._frontends._output_json import codes_json, json_report, statistics_json
from lora_guard._frontends._output_sarif import sarif_report
from lora_guard._frontends._output_text import (
    Style,
    codes_text,
    render_markdown,
    statistics_text,
    text_report,
)
from lora_guard._frontends._usage import UsageError

if TYPE_CHECKING:
    from lora_guard._checking.check_adapters import Report

__all__ = ["COMMANDS", "DOCS_URL", "WRITERS", "UsageError", "main"]

PROGRESS_MIN_ADAPTERS = 50
"""Show a progress bar on a terminal's stderr from this many adapters on."""

FORMATS = ("text", "json", "github", "sarif")


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


def _parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser, ConfigKeys]:
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
    keys = ConfigKeys()
    check.add_argument("paths", nargs="*", metavar="PATH",
                       help="an adapter folder, a file in one, or a folder searched for "
                       "adapter folders (none when a serve command after -- names them)")
    served = check.add_argument_group("what the server serves")
    keys.add(served, "--engine", metavar="ENGINE[==VERSION]",
                        help="check for this engine release: vllm, sglang or peft, e.g. "
                        "vllm==0.31.0 (without ==VERSION: the installed release, else the "
                        "newest supported); its own serve flags go after "
                        "--, e.g. -- --max-lora-rank 64. Or paste a whole serve command after "
                        "--: -- vllm serve MODEL --enable-lora --lora-modules a=PATH ...")
    keys.add(served, "--max-rank", type=_positive, metavar="N",
                        help="largest rank the server serves (vLLM --max-lora-rank)")
    keys.add(served, "--allowed-ranks", type=_rank_list, metavar="R,R",
                        help="the only ranks the server serves, e.g. 8,16,32")
    keys.add(served, "--max-loras", type=_positive, metavar="N",
                        help="adapters the server must hold loaded at once (sglang "
                        "--max-loaded-loras); not vLLM --max-loras, whose slots adapters are "
                        "swapped through")
    keys.add(served, "--target-modules", type=_name_list, metavar="M,M",
                        help="module types the server applies LoRA to, e.g. q_proj,v_proj")
    keys.add(served, "--dtypes", type=_name_list, metavar="D,D",
                        help="allowed dtypes, e.g. bfloat16,float16, for a server that does "
                        "not cast (vLLM and sglang cast adapter weights to the model's dtype)")
    keys.add(served, "--base-config", metavar="FILE",
                        help="the base model's Hugging Face config.json (checks dims, layers, "
                        "experts, vocab)")
    keys.add(served, "--allow", type=_name_list, metavar="F,F",
                        help="features the server implements: dora, lora_bias, bias, "
                        "modules_to_save, trainable_tokens, peft_type, alora, "
                        "layer_replication, qalora, bdlora, added_tokens")
    keys.add(served, "--scan-values", action="store_true",
                        help="also read every tensor's values once (bounded memory): lora_B "
                        "all zeros (LG119, the adapter does nothing), NaN or Inf (LG120)")
    shown = check.add_argument_group("what is reported")
    keys.add(shown, "--select", type=_code_list, metavar="CODES",
                       help="report only these codes or prefixes, e.g. LG1,LG002 (default: all)")
    keys.add(shown, "--ignore", type=_code_list, metavar="CODES",
                       help="never report these codes or prefixes; the more specific of "
                       "--select and --ignore wins, --ignore on a tie")
    keys.add(shown, "--format", choices=FORMATS, default="text",
                       help="text (a table, then violations by adapter), json, github "
                       "(workflow commands that annotate files) or sarif (SARIF 2.1.0)")
    keys.add(shown, "--quiet", "-q", action="store_true",
                       help="text: print the violations only (no table, no summary)")
    keys.add(shown, "--statistics", action="store_true",
                       help="print how many violations of each code, not the violations "
                       "(text or json)")
    keys.add(shown, "--no-progress", action="store_true",
                       help="never show the progress bar (shown on a terminal only)")
    conf = check.add_argument_group("configuration")
    keys.add(conf, "--config", metavar="FILE",
                      help="read options from this file instead of the nearest pyproject.toml "
                      "([tool.lora-guard] of a pyproject.toml, the top level of another "
                      ".toml)")
    keys.add(conf, "--isolated", action="store_true",
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
        "doctor", help="for each installed engine (vLLM, sglang, PEFT): release, supported?, "
                       "each hook attached",
        description="For each installed engine (vLLM, sglang, PEFT): its version, whether "
                    "lora_guard supports it (the versions its engine tier tests), and each "
                    "hook attached or missing. Exit 1 when a supported engine misses a hook.")
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
    return parser, check, keys


# --- parsing ----------------------------------------------------------------------------------


def _split_engine_argv(argv: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """``check ... -- ENGINE FLAGS`` -> (lora-guard's own arguments, the engine's or None)."""
    words = list(argv)
    if "check" not in words or "--" not in words or words.index("--") < words.index("check"):
        return words, None
    cut = words.index("--")
    return words[:cut], words[cut + 1:]


_ENGINE_NAMES = {"max-loras", "config"}
"""Long options of ``check`` that the engines' serve commands have too (vLLM's --max-loras,
the engines' --config): after ``--`` they are the engine's."""


def _own_options_after_dash(engine_argv: Sequence[str], keys: ConfigKeys) -> None:
    """A ``check`` option after ``--`` (``-- vllm serve ... --format json``) would be taken
    as an engine flag and silently do nothing: refuse it, saying where it goes."""
    own = {*keys.actions, "isolated"} - _ENGINE_NAMES
    for word in engine_argv:
        name = word[2:].partition("=")[0] if word.startswith("--") else ""
        if name in own:
            raise UsageError(
                f"{word} after --: that is an option of lora-guard check, not of the engine; "
                "put it before --, e.g. lora-guard check --format json -- vllm serve ...")


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser, check, keys = _parser()
    argv, engine_argv = _split_engine_argv(argv)
    if engine_argv is not None:
        _own_options_after_dash(engine_argv, keys)
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
    apply_config(check, keys, load_config(source), source)
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


# --- check -------------------------------------------------------------------------------------


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
        try:
            os.lstat(path)
            is_file = path.is_file()
        except (FileNotFoundError, NotADirectoryError):
            raise UsageError(f"no such file or folder: {raw}") from None
        except OSError:  # a name too long, a loop: the checker says why (LG108)
            out[raw] = None
            continue
        if is_file and path.name.startswith("adapter_") and path.parent != path:
            out[str(path.parent)] = None
        else:
            out[raw] = None
    return list(out)


_GENERIC = ("max_rank", "allowed_ranks", "max_loras", "target_modules", "dtypes")
"""Options an engine's own flags set: with --engine they are refused (give the engine's flag).
``--allow`` is not one: it adds features to those the engine release serves (a build of the
engine that implements them), as LG105's fix says."""


def _engine_limits(args: argparse.Namespace) -> tuple[Any, list[str], tuple[str, ...]]:
    """--engine and/or the words after --: the engine's limits, the adapters it names and the
    checks it leaves out (the base-model check when MODEL's config.json cannot be had)."""
    from lora_guard._checking.engines import is_serve_command, parse_serve_command, profile
    from lora_guard._checking.limits import engine_limits, limits_for_engine
    from lora_guard._reading.basemodel import BaseConfigError

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
            ran = command.settings.release
            if args.engine and ran.engine != args.engine.split("==")[0].strip().lower():
                raise UsageError(f"--engine {args.engine} but the command after -- runs "
                                 f"{ran.label}")
            limits = engine_limits(command.settings, base_config=command.base_config)
            return limits, [path for _, path in command.adapters], command.skipped
        if not args.engine:
            raise UsageError(
                "the words after -- are not a serve command (vllm serve MODEL ... or python -m "
                "sglang.launch_server ...): give --engine vllm|sglang|peft for engine flags")
        return limits_for_engine(args.engine, *tail, base_config=args.base_config), [], ()
    except BaseConfigError as exc:
        raise UsageError(f"--base-config: {exc}" if args.base_config else str(exc)) from None
    except ValueError as exc:  # EngineOptionError, or a limit the engine's flags set wrong
        raise UsageError(str(exc)) from None


def _limits(args: argparse.Namespace) -> Any:
    from lora_guard._checking.check_adapters import ServingLimits
    from lora_guard._reading.basemodel import BaseConfigError

    try:
        return ServingLimits(
            max_rank=args.max_rank, allowed_ranks=args.allowed_ranks, max_loras=args.max_loras,
            target_modules=args.target_modules, dtypes=args.dtypes,
            base_config=args.base_config, allow=frozenset(args.allow or ()),
        )
    except BaseConfigError as exc:
        raise UsageError(f"--base-config: {exc}") from None
    except ValueError as exc:
        raise UsageError(str(exc).replace("ServingLimits(", "option (").replace("=...)", ")")
                         ) from None


def _run_check(args: argparse.Namespace) -> int:
    from lora_guard._checking.check_adapters import check_adapters

    if args.statistics and args.format not in ("text", "json"):
        raise UsageError("--statistics prints text or json; drop --format "
                         f"{args.format} or --statistics")
    named: list[str] = []
    skipped: tuple[str, ...] = ()
    if getattr(args, "engine", None) or getattr(args, "engine_argv", None) is not None:
        limits, named, skipped = _engine_limits(args)
        if args.allow:  # features this build of the engine serves beyond its release's
            limits = dataclasses.replace(limits, allow=limits.allow | frozenset(args.allow))
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
    if skipped:
        report = dataclasses.replace(report, skipped=(*report.skipped, *skipped))
    out: str | Iterator[str]
    if args.statistics:
        for note in report.skipped if args.format == "json" else ():  # a list of counts
            sys.stderr.write(f"lora-guard: {printable(note)}\n")
        out = statistics_json(report) if args.format == "json" else statistics_text(report)
    else:
        out = WRITERS[args.format](report, args)
    _write(out)
    return 0 if report.ok else 1


def _write(out: str | Iterator[str]) -> None:
    """Write a report: whole, or in pieces as they come (json: one adapter at a time, so
    100,000 adapters' report is never held as one text)."""
    for piece in (out,) if isinstance(out, str) else out:
        sys.stdout.write(piece)


WRITERS: dict[str, Callable[[Report, argparse.Namespace], str | Iterator[str]]] = {
    "text": lambda report, args: text_report(report, quiet=args.quiet),
    "json": lambda report, args: json_report(report),
    "github": lambda report, args: github_report(report),
    "sarif": lambda report, args: sarif_report(report),
}
"""``--format`` -> the writer of the report in that format."""


# --- explain, codes, doctor ----------------------------------------------------------------------


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
        text = render_markdown(text, style=Style(sys.stdout), width=width)
    sys.stdout.write(text)
    return 0


def _codes(fmt: str) -> int:
    sys.stdout.write(codes_json() if fmt == "json" else codes_text())
    return 0


def _doctor(output: str) -> int:
    from lora_guard._frontends.doctor import run

    return run(output)


def _verify(args: argparse.Namespace) -> int:
    """``lora-guard verify`` (`lora_guard._frontends.verify`: imports torch and the engine)."""
    import importlib.util

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


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "check": _run_check,
    "explain": lambda args: _explain(args.code, markdown=args.markdown),
    "codes": lambda args: _codes(args.format),
    "doctor": lambda args: _doctor(args.format),
    "verify": _verify,
}
"""Subcommand -> the function that runs it and returns the exit status."""


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
        return COMMANDS[args.command](args)
    except UsageError as exc:
        sys.stderr.write(f"lora-guard: error: {printable(str(exc))}\n")
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
            f"lora-guard: internal error: {type(exc).__name__}: {printable(str(exc))}\n"
            "Please report this at the lora_guard issue tracker with the command you ran.\n"
        )
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
