"""``--format github``: workflow commands that annotate the adapters' files in a pull request.

Names from files go through `lora_guard._core.errors.printable` (control characters escaped)
and then the workflow-command escaping (``%``, CR, LF; ``:`` and ``,`` in properties)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lora_guard._core.errors import printable
from lora_guard._frontends._locations import location

if TYPE_CHECKING:
    from lora_guard._checking.check_adapters import Report

__all__ = ["github_escape", "github_report"]


def github_escape(text: str, *, prop: bool = False) -> str:
    """``text`` as a workflow command's message (or, with ``prop``, a property) takes it."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


def github_report(report: Report) -> str:
    """One ``::error`` per violation (and one ``::warning`` per skipped check)."""
    lines: list[str] = []
    for adapter_id in [*report.ids, "*"]:
        for v in report.by_adapter.get(adapter_id, ()):
            where = location(adapter_id, v)
            props = [f"file={github_escape(printable(where), prop=True)}"] if where else []
            props.append(f"title={v.code}")
            body = printable(f"{v.invariant}: {v.message} Fix: {v.hint}")
            lines.append(f"::error {','.join(props)}::{github_escape(body)}")
    lines += [f"::warning title=lora-guard skipped a check::{github_escape(printable(note))}"
              for note in report.skipped]
    if lines and report.limits is not None and report.limits.engine:
        lines.insert(0, f"::notice title=lora-guard::checked for {report.limits.engine}")
    return "\n".join(lines) + "\n" if lines else ""
