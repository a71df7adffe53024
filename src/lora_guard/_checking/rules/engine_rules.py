"""The engines' own rules of one adapter (``ServingLimits.engine_rules``): LG111 (packed parts
at one rank), LG112 (one scaling), LG202 (target_modules as a string), LG104 (embeddings saved
under a name the engine does not read); and which modules a server serves (LG104)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from lora_guard._checking.limits import ServingLimits
from lora_guard._checking.rules.recipe_outcome import RecipeOutcome
from lora_guard._checking.rules.shared import MAX_PER_KIND, PACKED, PART_OF, more
from lora_guard._core.errors import Violation, make_violation
from lora_guard._reading.adapters import AdapterSpec, LoRAModuleSpec, pattern_value

__all__ = ["engine_rules", "is_served"]


def is_served(module: LoRAModuleSpec, served: Collection[str], slices: bool = False) -> bool:
    if module.target in served or any(
        module.module == s or module.module.endswith("." + s) for s in served
    ):
        return True
    # A packed target whose parts are all served, and a part whose packed module is served
    # (an engine that packs q/k/v applies LoRA to qkv_proj whichever names the adapter uses).
    if module.target in PACKED and PACKED[module.target].issubset(served):
        return True
    if PART_OF.get(module.target) in served:
        return True
    if slices:  # the engine wraps the whole packed module when any part is targeted
        packed = module.target if module.target in PACKED else PART_OF.get(module.target)
        if packed is not None and not PACKED[packed].isdisjoint(served):
            return True
    return module.kind in ("moe-flat", "moe-packed") and "experts" in served


def _packed_parent(module: LoRAModuleSpec) -> tuple[str, str] | None:
    packed = PART_OF.get(module.target)
    if packed is None or not module.module.endswith(module.target):
        return None
    return module.module[: -len(module.target)].rstrip("."), packed


def _scaling(alpha: float, rank: int, rslora: bool) -> float:
    return float(alpha) / (rank ** 0.5 if rslora else rank)


def engine_rules(subject: str, spec: AdapterSpec, limits: ServingLimits,
                  found: list[Violation], shared: RecipeOutcome | None = None) -> None:
    """The engine's own rules of one adapter (LG111, LG112, LG202)."""
    engine = limits.engine or "the server"
    rules = limits.engine_rules
    targets = spec.config.get("target_modules")
    if "target-modules-list" in rules and isinstance(targets, str) and (
            targets not in ("all", "all-linear")):
        found.append(make_violation("LG202", "target-string", subject, value=targets,
                                    engine=engine))
    if "packed-ranks-uniform" in rules:
        found.extend(_packed_ranks(subject, spec.modules, engine, shared))
    if "one-scaling" in rules or "one-scaling-rslora" in rules:
        found.extend(_one_scaling(subject, spec.config, spec.modules, engine,
                                  rslora_aware="one-scaling-rslora" in rules))
    if "plain-embeddings-refused" in rules:
        found.extend(_plain_embeddings(subject, spec, engine))


def _plain_embeddings(subject: str, spec: AdapterSpec, engine: str) -> list[Violation]:
    """LG104: full embedding weights saved as ``<module>.weight`` (``save_embedding_layers`` of
    an embedding that is no LoRA target), which an engine that reads saved embeddings only as
    ``<module>.base_layer.weight`` refuses (vLLM)."""
    return [make_violation(
        "LG104", "saved-embedding", subject, key=key, engine=engine,
        module=key.removesuffix(".weight").rsplit(".", 1)[-1])
        for key, what in spec.extra_keys.items()
        if what == "embedding-base" and not key.endswith(".base_layer.weight")][:MAX_PER_KIND]


def _packed_ranks(subject: str, modules: Mapping[str, LoRAModuleSpec], engine: str,
                  shared: RecipeOutcome | None = None) -> list[Violation]:
    """LG111: the parts of one packed module at different ranks (modules without a rank are
    not compared); a recipe found uniform once is not grouped again."""
    if shared is not None and shared.packed_uniform:
        return []
    groups: dict[tuple[str, str], dict[str, int]] = {}
    for m in modules.values():
        parent = _packed_parent(m) if m.rank else None
        if parent is not None:
            groups.setdefault(parent, {})[m.target] = int(m.rank or 0)
    bad = [(k, v) for k, v in groups.items() if len(set(v.values())) > 1]
    if shared is not None and not bad:
        shared.packed_uniform = True
    return [make_violation(
        "LG111", "packed", subject, packed=packed, layer=layer or "the model",
        parts=", ".join(sorted(parts)),
        ranks=", ".join(f"{k}={v}" for k, v in sorted(parts.items())), engine=engine)
        for (layer, packed), parts in bad[:MAX_PER_KIND]]


def _one_scaling(subject: str, config: Mapping[str, Any],
                 modules: Mapping[str, LoRAModuleSpec], engine: str, *,
                 rslora_aware: bool = False) -> list[Violation]:
    """LG112: a module (with a rank) whose own rank or alpha gives another scaling than the
    one the engine applies to every module (``lora_alpha / r``; ``lora_alpha / sqrt(r)`` for
    rsLoRA where the engine reads ``use_rslora``, ``rslora_aware``)."""
    try:
        r, alpha = int(config["r"]), float(config.get("lora_alpha", 8))
    except (KeyError, TypeError, ValueError):
        return []
    if r <= 0:
        return []
    rslora = bool(config.get("use_rslora"))
    served = _scaling(alpha, r, rslora and rslora_aware)
    ranks = config.get("rank_pattern") or {}
    alphas = config.get("alpha_pattern") or {}
    if ranks or alphas:
        wrong = _own_scalings(modules, ranks, alphas, r, alpha, rslora, served)
    else:  # every module at r and lora_alpha: one scaling, compared once
        expected = _scaling(alpha, r, rslora)
        wrong = [] if not _scaling_differs(expected, served) else [
            (m.module, expected, "rsLoRA" if rslora else "") for m in modules.values()
            if m.rank]
    if not wrong:
        return []
    name, expected, why = wrong[0]
    return [make_violation(
        "LG112", "scaling", subject, module=more(name, len(wrong)),
        expected=f"{expected:.4g}", why=why, engine=engine, served=f"{served:.4g}")]


def _scaling_differs(expected: float, served: float) -> bool:
    return abs(expected - served) > 1e-6 * max(abs(served), 1.0)


def _own_scalings(modules: Mapping[str, LoRAModuleSpec], ranks: Mapping[str, Any],
                  alphas: Mapping[str, Any], r: int, alpha: float, rslora: bool,
                  served: float) -> list[tuple[str, float, str]]:
    """(module, its scaling, why) of each module whose patterns give another scaling."""
    wrong: list[tuple[str, float, str]] = []
    for m in modules.values():
        if not m.rank:
            continue
        rank = pattern_value(ranks, m.module) if ranks else None
        own_alpha = pattern_value(alphas, m.module) if alphas else None
        rank = int(rank) if isinstance(rank, (int, float)) and rank > 0 else r
        a = float(own_alpha) if isinstance(own_alpha, (int, float)) else alpha
        expected = _scaling(a, rank, rslora)
        if _scaling_differs(expected, served):
            why = ", ".join(x for x in (
                f"rank {rank}" if rank != r else "", f"alpha {a:g}" if a != alpha else "",
                "rsLoRA" if rslora else "") if x)
            wrong.append((m.module, expected, why))
    return wrong
