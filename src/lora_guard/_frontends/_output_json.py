"""``--format json``: the report (``Report.to_json``), ``--statistics`` and ``codes`` as JSON."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

from lora_guard._frontends._locations import help_uri
from lora_guard._frontends._output_text import statistics

if TYPE_CHECKING:
    from lora_guard._checking.check_adapters import Report

__all__ = ["codes_json", "json_report", "statistics_json"]


def json_report(report: Report) -> Iterator[str]:
    """The report's JSON form (``schema_version`` 1): `Report.to_json` and a newline, in
    pieces (`Report.json_chunks`) that the command writes as they come."""
    yield from report.json_chunks()
    yield "\n"


def statistics_json(report: Report) -> str:
    """``--statistics --format json``: code, name and count of each code found."""
    from lora_guard._core.catalogue import INVARIANTS

    data = [{"code": code, "name": INVARIANTS[code].slug, "count": n}
            for code, n in statistics(report)]
    return json.dumps(data, indent=2) + "\n"


def codes_json() -> str:
    """``lora-guard codes --format json``: every code with its severity, slug, title, summary,
    exception class and documentation URL."""
    from lora_guard._core.catalogue import INVARIANTS

    data = [{"code": c, "severity": inv.severity, "slug": inv.slug, "title": inv.title,
             "summary": inv.summary, "error": inv.error, "url": help_uri(inv.docs)}
            for c, inv in INVARIANTS.items()]
    return json.dumps(data, indent=2) + "\n"
