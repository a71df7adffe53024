"""``--format sarif``: a SARIF 2.1.0 log for GitHub code scanning and other SARIF viewers."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from lora_guard._frontends._locations import DOCS_URL, artifact_uri, help_uri, location

if TYPE_CHECKING:
    from lora_guard._checking.check_adapters import Report

__all__ = ["sarif_log", "sarif_report"]

SARIF_SCHEMA = ("https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/"
                "sarif-schema-2.1.0.json")


def _rules() -> list[dict[str, Any]]:
    from lora_guard._core.catalogue import INVARIANTS

    return [{
        "id": code,
        "name": inv.slug,
        "shortDescription": {"text": inv.title},
        "fullDescription": {"text": inv.summary},
        "help": {"text": "\n".join(f"{i}. {fix}" for i, fix in enumerate(inv.fixes, 1)),
                 "markdown": inv.explain()},
        "helpUri": help_uri(inv.docs),
        "defaultConfiguration": {"level": inv.severity},
    } for code, inv in INVARIANTS.items()]


def _results(report: Report) -> list[dict[str, Any]]:
    from lora_guard._core.catalogue import INVARIANTS

    codes = list(INVARIANTS)
    results = []
    readable = [i for i in report.ids if report.spec(i) is not None] or list(report.ids)
    for adapter_id in [*report.ids, "*"]:
        for v in report.by_adapter.get(adapter_id, ()):
            targets = [adapter_id] if adapter_id != "*" else readable
            locations = []
            for target in targets:
                where = location(target, v if adapter_id != "*" else None)
                if where:
                    locations.append({"physicalLocation": {
                        "artifactLocation": {"uri": artifact_uri(where)}}})
            result: dict[str, Any] = {
                "ruleId": v.code,
                "ruleIndex": codes.index(v.code),
                "level": INVARIANTS[v.code].severity,
                "message": {"text": f"{v.message} Fix: {v.hint}"},
                "locations": locations,
            }
            if v.details:
                result["properties"] = {"details": v.to_dict()["details"]}
            results.append(result)
    return results


def sarif_log(report: Report) -> dict[str, Any]:
    """The report as a SARIF 2.1.0 log: one rule per catalogue code, one result per violation;
    a skipped check is a ``toolExecutionNotifications`` entry of level ``warning``."""
    from lora_guard import __version__

    run: dict[str, Any] = {
        "tool": {"driver": {
            "name": "lora-guard",
            "version": __version__,
            "informationUri": DOCS_URL,
            "rules": _rules(),
        }},
        "results": _results(report),
    }
    if report.limits is not None and report.limits.engine:
        run["properties"] = {"engine": report.limits.engine}  # the release checked for
    if report.skipped:
        run["invocations"] = [{
            "executionSuccessful": True,
            "toolExecutionNotifications": [
                {"level": "warning", "message": {"text": note}} for note in report.skipped],
        }]
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}


def sarif_report(report: Report) -> str:
    """`sarif_log` as JSON text."""
    return json.dumps(sarif_log(report), indent=2) + "\n"
