"""LG202's check of one adapter: ``target_modules`` saved as a string (a regex) where the
engine reads a list (``target-modules-list``)."""

from __future__ import annotations

from collections.abc import Iterator

from lora_guard._checking.registry import adapter_check
from lora_guard._checking.rules.context import AdapterContext
from lora_guard._core.errors import Violation, make_violation


@adapter_check("LG202", position=160)
def engine_config_form(ctx: AdapterContext) -> Iterator[Violation]:
    targets = ctx.spec.config.get("target_modules")
    if "target-modules-list" in ctx.limits.engine_rules and isinstance(targets, str) and (
            targets not in ("all", "all-linear")):
        yield make_violation("LG202", "target-string", ctx.subject, value=targets,
                             engine=ctx.limits.engine or "the server")
