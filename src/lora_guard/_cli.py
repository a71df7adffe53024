"""The ``lora-guard`` command: ``check`` adapters, ``explain`` a code, list ``codes``.

Exit status: 0 when every adapter passes, 1 when any violation was found, 2 for a usage error
(bad options, an unreadable base config, an unknown code). No traceback reaches the user.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from typing import IO, Any, NoReturn

__all__ = ["main"]

PROGRESS_MIN_ADAPTERS = 50
"""Show a progress bar on a terminal's stderr from this many adapters on."""


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


def _parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    from . import __version__

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
        description="Check adapters: exit 0 when all pass, 1 when any violation, 2 for a "
        "usage error.",
    )
    check.add_argument("paths", nargs="+", metavar="PATH",
                       help="an adapter folder, or a folder searched for adapter folders")
    check.add_argument("--max-rank", type=_positive, metavar="N",
                       help="largest rank the server serves (vLLM --max-lora-rank)")
    check.add_argument("--allowed-ranks", type=_rank_list, metavar="R,R",
                       help="the only ranks the server serves, e.g. 8,16,32")
    check.add_argument("--max-loras", type=_positive, metavar="N",
                       help="adapter slots (vLLM --max-loras, sglang --max-loras-per-batch)")
    check.add_argument("--target-modules", type=_name_list, metavar="M,M",
                       help="module types the server applies LoRA to, e.g. q_proj,v_proj")
    check.add_argument("--dtypes", type=_name_list, metavar="D,D",
                       help="allowed dtypes, e.g. bfloat16,float16")
    check.add_argument("--base-config", metavar="FILE",
                       help="the base model's Hugging Face config.json (checks dims, layers, "
                       "experts, vocab)")
    check.add_argument("--allow", type=_name_list, metavar="F,F",
                       help="features the server implements: dora, lora_bias, bias, "
                       "modules_to_save, trainable_tokens, peft_type, alora, "
                       "layer_replication, qalora")
    check.add_argument("--format", choices=("text", "json"), default="text",
                       help="text (a table, then violations by adapter) or json")
    check.add_argument("--no-progress", action="store_true",
                       help="never show the progress bar")

    explain = commands.add_parser("explain", help="explain an invariant code, e.g. LG101")
    explain.add_argument("code", metavar="CODE", help="a code such as LG101, or its slug")
    commands.add_parser("codes", help="list every code with its slug and title")
    return parser, check


# --- output helpers ------------------------------------------------------------------------


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
    lines = []
    for row in rows:
        cells = [cell.rjust(w) if i in right else cell.ljust(w)
                 for i, (cell, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    return lines


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _text_report(report: Any) -> str:
    from ._check_adapters import Report

    assert isinstance(report, Report)
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
    for adapter_id in [*report.ids, "*"]:
        found = report.by_adapter.get(adapter_id, ())
        if not found:
            continue
        lines.append("")
        lines.append("adapter set" if adapter_id == "*" else adapter_id)
        for v in found:
            prefix = f"{v.subject}: "
            message = v.message[len(prefix):] if v.message.startswith(prefix) else v.message
            lines.append(f"  {v.code} {v.invariant}: {message}")
            lines.append(f"    fix: {v.hint}")
    if not report.ok:
        codes = sorted({v.code for v in report.violations})
        lines.append("")
        lines.append("More on a code: lora-guard explain " + codes[0])
    return "\n".join(lines) + "\n"


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


# --- commands ------------------------------------------------------------------------------


def _check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ._check_adapters import ServingLimits, check_adapters

    try:
        limits = ServingLimits(
            max_rank=args.max_rank, allowed_ranks=args.allowed_ranks, max_loras=args.max_loras,
            target_modules=args.target_modules, dtypes=args.dtypes,
            base_config=args.base_config, allow=frozenset(args.allow or ()),
        )
    except ValueError as exc:
        message = str(exc)
        if args.base_config and "base config" in message:
            parser.error(f"--base-config: {message}")
        parser.error(message.replace("ServingLimits(", "option (").replace("=...)", ")"))
    progress = None
    if not args.no_progress and args.format == "text" and sys.stderr.isatty():
        progress = _Progress(sys.stderr)
    from ._remote import RemoteSetupError

    try:
        report = check_adapters(args.paths, limits, progress=progress)
    except RemoteSetupError as exc:  # remote paths without the extra, or a bad setting
        parser.error(str(exc))
    finally:
        if progress is not None:
            progress.close()
    if args.format == "json":
        sys.stdout.write(json.dumps(report.to_dict(), indent=2) + "\n")
    else:
        sys.stdout.write(_text_report(report))
    return 0 if report.ok else 1


def _explain(code: str) -> int:
    from ._catalogue import INVARIANTS

    wanted = code.strip()
    by_slug = {inv.slug: c for c, inv in INVARIANTS.items()}
    key = wanted.upper() if wanted.upper() in INVARIANTS else by_slug.get(wanted.lower())
    if key is None:
        sys.stderr.write(
            f"lora-guard explain: unknown code {code!r}; known codes: "
            f"{', '.join(INVARIANTS)} (see: lora-guard codes)\n"
        )
        return 2
    sys.stdout.write(INVARIANTS[key].explain())
    return 0


def _codes() -> int:
    from ._catalogue import INVARIANTS

    rows = [["CODE", "SLUG", "TITLE"]]
    rows += [[c, inv.slug, inv.title] for c, inv in INVARIANTS.items()]
    sys.stdout.write("\n".join(_table(rows, right=set())) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``lora-guard``; returns the exit status (0 pass, 1 violations, 2 usage error).

    Example:
        >>> from lora_guard._cli import main
        >>> main(["explain", "LG110"])  # doctest: +ELLIPSIS
        ## LG110 too-many-adapters: More adapters than the served slot count
        ...
        0
    """
    parser, check_parser = _parser()
    try:
        args = parser.parse_args(argv)
        if args.command == "check":
            return _check(args, check_parser)
        if args.command == "explain":
            return _explain(args.code)
        return _codes()
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
