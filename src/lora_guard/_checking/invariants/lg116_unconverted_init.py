"""LG116's check: an initialisation that rewrote the base weights (PiSSA, OLoRA, ...), never
converted to a plain LoRA."""

from __future__ import annotations

from lora_guard._checking.registry import adapter_check
from lora_guard._checking.rules.context import AdapterContext
from lora_guard._core.errors import Violation, make_violation
from lora_guard._reading.adapters import init_method

_RERUN_INITS = ("pissa", "olora")  # deterministic: PEFT's loading rewrites the base again


@adapter_check("LG116", position=20)
def unconverted_init(ctx: AdapterContext) -> list[Violation]:
    method = init_method(ctx.spec.config)
    if method is None:
        return []
    value = ctx.spec.config.get("init_lora_weights")
    if "init-rerun" in ctx.limits.engine_rules and str(value).lower() in _RERUN_INITS:
        return []  # PEFT redoes the init when it loads
    return [make_violation("LG116", "init", ctx.subject, method=method, value=value)]
