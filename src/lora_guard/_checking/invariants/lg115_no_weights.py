"""LG115's check: an adapter whose weights file holds no tensor serves the base model."""

from __future__ import annotations

from lora_guard._checking.registry import adapter_check
from lora_guard._checking.rules.context import AdapterContext
from lora_guard._core.errors import Violation, make_violation


@adapter_check("LG115", position=10)
def no_weights(ctx: AdapterContext) -> list[Violation]:
    if ctx.spec.tensors or ctx.spec.weights_file is None:
        return []
    return [make_violation("LG115", "empty", ctx.subject, file=ctx.spec.weights_file)]
