"""LG117's check of one adapter: ``peft_type`` spelled as the engine does not read LoRA's.

A ``peft_type`` naming another PEFT method is the reader's `NotLoRA` on every engine; which
spellings of LoRA's own one load is the engine's: PEFT (and lmdeploy, through its pinned
PEFT) looks the string up in ``PeftType`` (only ``"LORA"``; a missing field fails too),
sglang compares ``peft_type.lower() == "lora"`` (``peft-type-any-case``), vLLM does not read
it (``peft-type-unread``). Without an engine the check holds configs to PEFT's form."""

from __future__ import annotations

from lora_guard._checking.registry import adapter_check
from lora_guard._checking.rules.context import AdapterContext
from lora_guard._core.errors import Violation, make_violation
from lora_guard._reading.adapters import CONFIG_NAME

_MISSING = object()


@adapter_check("LG117", position=15)
def peft_type_spelling(ctx: AdapterContext) -> list[Violation]:
    rules = ctx.limits.engine_rules
    value = ctx.spec.config.get("peft_type", _MISSING)
    if "peft-type-unread" in rules or (isinstance(value, str) and value == "LORA"):
        return []
    any_case = "peft-type-any-case" in rules
    if any_case and isinstance(value, str) and value.lower() == "lora":
        return []
    found = "no peft_type" if value is _MISSING else (
        "peft_type null" if value is None else f"peft_type {value!r}")
    reads = ("as a string whose lower case is 'lora'" if any_case
             else "only as 'LORA' (PEFT's PeftType)")
    return [make_violation("LG117", "spelling", ctx.subject, file=CONFIG_NAME, found=found,
                           engine=ctx.limits.engine or "PEFT",
                           reads=reads)]
