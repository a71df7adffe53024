"""LG002's check within one adapter: its own MoE weights in more than one layout. Across a
set (against the pool's first layout): `check_adapters`; in a live pool: the guards."""

from __future__ import annotations

from lora_guard._checking.checks import check_moe_layouts
from lora_guard._checking.registry import adapter_check
from lora_guard._checking.rules.context import AdapterContext
from lora_guard._core.errors import Violation


@adapter_check("LG002", position=150)
def mixed_moe_layout(ctx: AdapterContext) -> list[Violation]:
    """A recipe found unmixed once (its `RecipeOutcome`) is not classified again."""
    if ctx.spec.moe_layout is None:
        return []
    tensors, shared = ctx.spec.tensors, ctx.shared
    if shared is not None and shared.unmixed:
        return []
    mixed = check_moe_layouts(ctx.subject, tensors)[1]
    if shared is not None and not mixed:
        shared.unmixed = True
    return mixed
