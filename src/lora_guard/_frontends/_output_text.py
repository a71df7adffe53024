"""``--format text``: the table of adapters, the violations by adapter, the statistics, and
the catalogue's Markdown rendered for a terminal (``lora-guard explain``, ``codes``).

Every name printed here comes from files a user was handed (folder names, S3 keys, Hub
paths): each goes through `lora_guard._core.errors.printable`, so a control character, an
escape sequence or a bidi override is shown escaped, never sent to the terminal.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
from typing import IO, TYPE_CHECKING

from lora_guard._core.errors import printable

if TYPE_CHECKING:
    from lora_guard._checking.check_adapters import Report

__all__ = ["Style", "codes_text", "render_markdown", "statistics", "statistics_text",
           "table", "text_report"]

BOLD, DIM, RED, CYAN = 1, 2, 31, 36


class Style:
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


def size(n: int | None) -> str:
    """A byte count for people: ``1.2 MB``; ``-`` when unknown."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"  # pragma: no cover


def table(rows: list[list[str]], right: set[int]) -> list[str]:
    """Rows as aligned columns (``right``: the columns aligned right), each cell escaped."""
    rows = [[printable(cell) for cell in row] for row in rows]  # names come from files
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines: list[str] = []
    for row in rows:
        cells = [cell.rjust(w) if i in right else cell.ljust(w)
                 for i, (cell, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    return lines


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _violation_lines(report: Report, style: Style) -> list[str]:
    lines: list[str] = []
    for adapter_id in [*report.ids, "*"]:
        found = report.by_adapter.get(adapter_id, ())
        if not found:
            continue
        if lines:
            lines.append("")
        heading = "adapter set" if adapter_id == "*" else printable(adapter_id)
        lines.append(style(heading, BOLD))
        for v in found:
            prefix = f"{v.subject}: "
            message = v.message[len(prefix):] if v.message.startswith(prefix) else v.message
            lines.append(f"  {style(v.code, BOLD, RED)} {v.invariant}: {printable(message)}")
            lines.append(style(f"    fix: {printable(v.hint)}", DIM))
    return lines


def _skipped_lines(report: Report) -> list[str]:
    return [f"skipped: {printable(note)}" for note in report.skipped]


def text_report(report: Report, *, quiet: bool = False, style: Style | None = None) -> str:
    """The text report: a table of the adapters, a summary line, the violations by adapter."""
    style = style or Style(sys.stdout)
    if quiet:
        lines = _violation_lines(report, style) + _skipped_lines(report)
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
            _short(",".join(spec.target_modules) or "-", 40), size(spec.size), result,
        ])
    lines = table(rows, right={1, 5})
    failed = sum(1 for i in report.ids if report.by_adapter.get(i))
    lines.append("")
    if report.limits is not None and report.limits.engine:
        lines.append(f"checked for {report.limits.engine}")
    count = len(report.ids)
    lines.append(
        f"{count} adapter{'s' * (count != 1)} checked: "
        + ("all pass." if report.ok else
           f"{failed} failed, {len(report.violations)} violation"
           f"{'s' * (len(report.violations) != 1)}.")
    )
    lines += _skipped_lines(report)
    found_lines = _violation_lines(report, style)
    if found_lines:
        lines += ["", *found_lines]
    if not report.ok:
        codes = sorted({v.code for v in report.violations})
        lines.append("")
        lines.append("More on a code: lora-guard explain " + codes[0])
    return "\n".join(lines) + "\n"


def statistics(report: Report) -> list[tuple[str, int]]:
    """(code, count) of the report's violations, the most frequent first."""
    counts: dict[str, int] = {}
    for v in report.violations:
        counts[v.code] = counts.get(v.code, 0) + 1
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def statistics_text(report: Report) -> str:
    """``--statistics``: one row per code with its count."""
    from lora_guard._core.catalogue import INVARIANTS

    stats = statistics(report)
    rows = [[str(n), code, INVARIANTS[code].slug, INVARIANTS[code].title] for code, n in stats]
    text = "\n".join(table(rows, right={0})) + "\n" if rows else ""
    skipped = _skipped_lines(report)
    return text + _transferred_text(report) + ("\n".join(skipped) + "\n" if skipped else "")


def _transferred_text(report: Report) -> str:
    """For remote adapters: the bytes each one's check read over the network, and the total."""
    remote = [s for s in report.adapters if s.transferred is not None]
    if not remote:
        return ""
    rows = [["TRANSFERRED", "SIZE", "REMOTE ADAPTER"]]
    rows += [[size(s.transferred), size(s.size), s.url or str(s.path)] for s in remote]
    total = sum(s.transferred or 0 for s in remote)
    held = sum(s.size for s in remote)
    return ("\n" if report.violations else "") + "\n".join(table(rows, right={0, 1})) + (
        f"\n{len(remote)} remote adapters: {size(total)} transferred for {size(held)} "
        "held (config and safetensors header only)\n")


def codes_text() -> str:
    """``lora-guard codes``: a table of every code with its slug and title."""
    from lora_guard._core.catalogue import INVARIANTS

    rows = [["CODE", "SLUG", "TITLE"]]
    rows += [[c, inv.slug, inv.title] for c, inv in INVARIANTS.items()]
    return "\n".join(table(rows, right=set())) + "\n"


# --- the catalogue's Markdown on a terminal ---------------------------------------------------

_INLINE = re.compile(r"``(.+?)``|`([^`]+)`|\*\*(.+?)\*\*")


def _plain(text: str) -> str:
    """Inline Markdown without its markers."""
    return _INLINE.sub(lambda m: m.group(1) or m.group(2) or m.group(3), text)


def _wrap(text: str, first: str, rest: str, width: int) -> list[str]:
    return textwrap.wrap(text, width=width, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False, break_long_words=False) or [first]


def _render_line(line: str, style: Style, width: int) -> list[str]:
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


def render_markdown(markdown: str, *, style: Style | None = None, width: int = 100) -> str:
    """The catalogue's Markdown for a terminal: headings set off, code indented, paragraphs
    wrapped, no Markdown markers; ANSI styles only when ``style`` allows them."""
    style = style or Style(sys.stdout)
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


def _restyle(lines: list[str], source: str, style: Style) -> list[str]:
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
