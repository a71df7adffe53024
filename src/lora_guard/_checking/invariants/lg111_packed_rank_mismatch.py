"""LG111's check: the parts of one packed module (q/k/v, gate/up) at different ranks, where the
engine packs them into one LoRA of one rank (``packed-ranks-uniform``); the routed experts of
one MoE projection at different ranks, where the engine packs them into one tensor or pool
slice of one rank (``moe-expert-ranks``: vLLM's ``pack_moe``, sglang's memory pool)."""

from __future__ import annotations

import re

from lora_guard._checking.registry import adapter_check
from lora_guard._checking.rules.context import AdapterContext
from lora_guard._checking.rules.shared import MAX_PER_KIND, PART_OF
from lora_guard._core.errors import Violation, make_violation
from lora_guard._reading.adapters import LoRAModuleSpec


def _packed_parent(module: LoRAModuleSpec) -> tuple[str, str] | None:
    packed = PART_OF.get(module.target)
    if packed is None or not module.module.endswith(module.target):
        return None
    return module.module[: -len(module.target)].rstrip("."), packed


@adapter_check("LG111", position=100)
def packed_rank_mismatch(ctx: AdapterContext) -> list[Violation]:
    """Modules without a rank are not compared; a recipe found uniform once (its
    `RecipeOutcome`) is not grouped again (its experts are compared for every adapter)."""
    experts = _expert_ranks(ctx) if "moe-expert-ranks" in ctx.limits.engine_rules else []
    if "packed-ranks-uniform" not in ctx.limits.engine_rules:
        return experts
    modules, shared = ctx.spec.modules, ctx.shared
    if shared is not None and shared.packed_uniform:
        return experts
    # each packed module's parts at one rank over the whole adapter: at one rank in each layer
    families = {(PART_OF.get(m.target), m.rank) for m in modules.values() if m.rank}
    named = [family for family, _ in families if family is not None]
    if len(named) == len(set(named)):
        if shared is not None:
            shared.packed_uniform = True
        return experts
    groups: dict[tuple[str, str], dict[str, int]] = {}
    for m in modules.values():
        parent = _packed_parent(m) if m.rank else None
        if parent is not None:
            groups.setdefault(parent, {})[m.target] = int(m.rank or 0)
    bad = [(k, v) for k, v in groups.items() if len(set(v.values())) > 1]
    if shared is not None and not bad:
        shared.packed_uniform = True
    engine = ctx.limits.engine or "the server"
    return [make_violation(
        "LG111", "packed", ctx.subject, packed=packed, layer=layer or "the model",
        parts=", ".join(sorted(parts)),
        ranks=", ".join(f"{k}={v}" for k, v in sorted(parts.items())), engine=engine)
        for (layer, packed), parts in bad[:MAX_PER_KIND]] + experts


_EXPERT = re.compile(r"^(?P<layer>.*?)(?:^|\.)experts\.(?P<index>\d+)\.(?P<proj>.+)$")


def _expert_ranks(ctx: AdapterContext) -> list[Violation]:
    """The routed experts' 2-D halves (``experts.<i>.<proj>``, not ``shared_experts``) of one
    layer and projection at more than one rank."""
    groups: dict[tuple[str, str], dict[int, int]] = {}
    for m in ctx.spec.modules.values():
        hit = _EXPERT.match(m.module) if m.kind == "moe-per-expert" and m.rank else None
        if hit is not None and not hit["layer"].endswith("shared_experts") and (
                ".shared_experts." not in m.module):
            groups.setdefault((hit["layer"], hit["proj"]), {})[int(hit["index"])] = int(m.rank or 0)
    if not groups:  # no routed expert of its own rank (most adapters)
        return []
    bad = [(key, ranks) for key, ranks in groups.items() if len(set(ranks.values())) > 1]
    engine = ctx.limits.engine or "the server"
    return [make_violation(
        "LG111", "experts", ctx.subject, packed=f"{layer}.experts.*.{proj}" if layer else proj,
        ranks=", ".join(f"expert {e}={r}" for e, r in sorted(ranks.items())), engine=engine)
        for (layer, proj), ranks in bad[:MAX_PER_KIND]]
