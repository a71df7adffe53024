"""LG107's check: zero-size tensors (placeholders of a sharded save)."""

from __future__ import annotations

from lora_guard._checking.registry import adapter_check
from lora_guard._checking.rules.context import AdapterContext
from lora_guard._core.errors import Violation, make_violation


@adapter_check("LG107", position=70)
def empty_tensor(ctx: AdapterContext) -> list[Violation]:
    empty = ctx.empty[0]
    if not empty:  # (most adapters)
        return []
    tensors = ctx.spec.tensors
    return [make_violation("LG107", "empty", ctx.subject, key=key, shape=tensors[key].shape)
            for key in empty]
