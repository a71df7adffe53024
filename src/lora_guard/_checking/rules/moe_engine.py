"""The engines' own rules of an MoE adapter's expert weights (``ServingLimits.engine_rules``):
experts of one projection at different ranks (LG111, vLLM packs one rank per projection), an
rsLoRA scaling the experts do not get (LG112, vLLM 0.29's ``pack_moe``), and indexed
shared-expert weights (LG104: sglang writes them over the routed experts before 0.5.23 and
refuses them from 0.5.23)."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

from lora_guard._checking.rules.shared import MAX_PER_KIND, more
from lora_guard._core.errors import Violation, make_violation
from lora_guard._reading.adapters import AdapterSpec, LoRAModuleSpec

__all__ = ["MOE_RULES", "moe_engine_rules"]

MOE_RULES = ("moe-expert-ranks", "moe-rslora-alpha-r", "indexed-shared-overwrites",
             "indexed-shared-refused")
"""The engine rules this module checks (`ServingLimits.engine_rules` names)."""

_EXPERT = re.compile(r"^(?P<layer>.*?)(?:^|\.)experts\.(?P<index>\d+)\.(?P<proj>.+)$")
_SHARED = re.compile(r"(?:^|\.)shared_experts\.(?P<index>\d+)\.")


def moe_engine_rules(subject: str, spec: AdapterSpec, engine: str,
                     rules: Collection[str]) -> list[Violation]:
    """The MoE rules of `MOE_RULES` that ``rules`` turns on, for one adapter."""
    if spec.moe_layout is None and not any("experts." in m for m in spec.modules):
        return []
    found: list[Violation] = []
    if "moe-expert-ranks" in rules:
        found.extend(_expert_ranks(subject, spec.modules, engine))
    if "moe-rslora-alpha-r" in rules:
        found.extend(_rslora_experts(subject, spec, engine))
    for rule, variant in (("indexed-shared-overwrites", "shared-experts-overwritten"),
                          ("indexed-shared-refused", "shared-experts-refused")):
        if rule in rules:
            found.extend(_indexed_shared(subject, spec.modules, engine, variant))
    return found


def _per_expert(modules: Mapping[str, LoRAModuleSpec]) -> dict[tuple[str, str], dict[int, int]]:
    """(layer, projection) -> {expert: rank} of the routed experts' 2-D weights."""
    groups: dict[tuple[str, str], dict[int, int]] = {}
    for m in modules.values():
        hit = _EXPERT.match(m.module)
        if hit is None or m.kind != "moe-per-expert" or not m.rank or _SHARED.search(m.module):
            continue
        groups.setdefault((hit["layer"], hit["proj"]), {})[int(hit["index"])] = int(m.rank)
    return groups


def _expert_ranks(subject: str, modules: Mapping[str, LoRAModuleSpec],
                  engine: str) -> list[Violation]:
    """LG111: the experts of one MoE projection at different ranks (vLLM stacks them into one
    tensor per projection, ``PackedLoRALayerWeights.pack_moe``)."""
    bad = [(key, ranks) for key, ranks in _per_expert(modules).items()
           if len(set(ranks.values())) > 1]
    return [make_violation(
        "LG111", "experts", subject, packed=f"{layer}.experts.*.{proj}" if layer else proj,
        ranks=", ".join(f"expert {e}={r}" for e, r in sorted(ranks.items())), engine=engine)
        for (layer, proj), ranks in bad[:MAX_PER_KIND]]


def _rslora_experts(subject: str, spec: AdapterSpec, engine: str) -> list[Violation]:
    """LG112: an rsLoRA adapter's routed experts, which vLLM 0.29's ``pack_moe`` scales by
    ``lora_alpha / r`` (its other modules get ``lora_alpha / sqrt(r)``)."""
    config = spec.config
    if not config.get("use_rslora"):
        return []
    try:
        r, alpha = int(config["r"]), float(config.get("lora_alpha", 8))
    except (KeyError, TypeError, ValueError):
        return []
    experts = [m.module for m in spec.modules.values()
               if m.kind == "moe-per-expert" and m.rank and not _SHARED.search(m.module)]
    if r <= 0 or not experts:
        return []
    return [make_violation(
        "LG112", "experts", subject, module=more(experts[0], len(experts)),
        expected=f"{alpha / r ** 0.5:.4g}", engine=engine, served=f"{alpha / r:.4g}")]


def _indexed_shared(subject: str, modules: Mapping[str, LoRAModuleSpec], engine: str,
                    variant: str) -> list[Violation]:
    """LG104: weights under ``shared_experts.<i>.``, which sglang's memory pool takes for
    routed expert ``<i>`` (``LoRAMemoryPool.load_lora_weight_to_buffer``)."""
    shared = [(m.module, _SHARED.search(m.module)) for m in modules.values()]
    hits = [(name, hit) for name, hit in shared if hit is not None]
    return [make_violation("LG104", variant, subject, module=name, index=hit["index"],
                           engine=engine) for name, hit in hits[:MAX_PER_KIND]]
