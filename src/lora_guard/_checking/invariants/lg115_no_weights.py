"""LG115's check: an adapter whose weights file holds no tensor serves the base model."""

from __future__ import annotations

from collections.abc import Iterator

from lora_guard._checking.registry import adapter_check
from lora_guard._checking.rules.context import AdapterContext
from lora_guard._core.errors import Violation, make_violation


@adapter_check("LG115", position=10)
def no_weights(ctx: AdapterContext) -> Iterator[Violation]:
    if not ctx.spec.tensors and ctx.spec.weights_file is not None:
        yield make_violation("LG115", "empty", ctx.subject, file=ctx.spec.weights_file)
