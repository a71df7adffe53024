"""The engines' own rules of one adapter (``ServingLimits.engine_rules``): LG111 (packed parts
at one rank), LG112 (one scaling), LG202 (target_modules as a string), LG104 (embeddings saved
under a name the engine does not read); and which modules a server serves (LG104)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from lora_guard._checking.engines.lmdeploy import PEFT_0_14_LORA_KEYS
from lora_guard._checking.limits import ServingLimits
from lora_guard._checking.rules.memo import Memo, remember
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
                  found: list[Violation], memo: Memo | None = None) -> None:
    """The engine's own rules of one adapter (LG111, LG112, LG202)."""
    engine = limits.engine or "the server"
    rules = limits.engine_rules
    targets = spec.config.get("target_modules")
    if "target-modules-list" in rules and isinstance(targets, str) and (
            targets not in ("all", "all-linear")):
        found.append(make_violation("LG202", "target-string", subject, value=targets,
                                    engine=engine))
    if "packed-ranks-uniform" in rules:
        found.extend(_packed_ranks(subject, spec.modules, engine, memo))
    if "one-scaling" in rules or "one-scaling-rslora" in rules:
        found.extend(_one_scaling(subject, spec.config, spec.modules, engine,
                                  rslora_aware="one-scaling-rslora" in rules))
    if "plain-embeddings-refused" in rules:
        found.extend(_plain_embeddings(subject, spec, engine))
    if "saved-embeddings-refused" in rules:
        found.extend(_plain_embeddings(subject, spec, engine, any_form=True))
    if "peft-0.14-config" in rules:
        unknown = sorted(set(spec.config) - PEFT_0_14_LORA_KEYS)
        if unknown:
            keys = ", ".join(unknown[:3]) + (
                f" (and {len(unknown) - 3} more)" if len(unknown) > 3 else "")
            found.append(make_violation("LG202", "unknown-keys", subject, engine=engine,
                                        keys=keys))
    if "target-modules-by-name" in rules:
        found.extend(_targets_by_name(subject, targets, engine))
    if "slots-in-every-layer" in rules:
        found.extend(_unfilled_slots(subject, spec, limits, engine))


def _unfilled_slots(subject: str, spec: AdapterSpec, limits: ServingLimits,
                    engine: str) -> list[Violation]:
    """LG103: a ``target_modules`` name the engine gives a slot in every layer of the base
    (lmdeploy: every module whose name ends with it) with no weights for it in some layer
    (``layers_to_transform``, ``layers_pattern``, a weight missing): that slot is never
    written and serves uninitialised memory. Needs the base's layer count."""
    targets = spec.config.get("target_modules")
    layers = limits.base.num_layers if limits.base is not None else None
    if not isinstance(targets, (list, tuple)) or not layers:
        return []
    served = limits.target_modules
    have: dict[str, set[int | None]] = {}
    for m in spec.modules.values():
        have.setdefault(m.target, set()).add(m.layer)
    for leaf in sorted({str(t).rsplit(".", 1)[-1] for t in targets}):
        if served is not None and leaf not in served:
            continue  # no slot: another rule (LG104) speaks for it
        found = have.get(leaf, set())
        if None in found:
            continue  # a module outside the layers (lm_head) with its weights
        missing = [i for i in range(layers) if i not in found]
        if missing:
            return [make_violation(
                "LG103", "unfilled-slot", subject, module=leaf, engine=engine,
                layers=more(f"layer {missing[0]}", len(missing)), rank=spec.config.get("r"))]
    return []


def _targets_by_name(subject: str, targets: Any, engine: str) -> list[Violation]:
    """LG202: ``target_modules`` read as a set of module names (lmdeploy): a string is read
    letter by letter; two entries whose last part names one module that is not packed find
    the first one's LoRA module by its name."""
    if isinstance(targets, str):
        return [make_violation("LG202", "target-string-any", subject, value=targets,
                               engine=engine)]
    seen: dict[str, str] = {}
    for target in targets if isinstance(targets, (list, tuple)) else ():
        leaf = str(target).rsplit(".", 1)[-1]
        if leaf in PART_OF or leaf in PACKED:
            continue
        if leaf in seen:
            return [make_violation("LG202", "repeated-target", subject, first=seen[leaf],
                                   second=str(target), module=leaf, engine=engine)]
        seen[leaf] = str(target)
    return []


def _plain_embeddings(subject: str, spec: AdapterSpec, engine: str, *,
                      any_form: bool = False) -> list[Violation]:
    """LG104: full embedding weights saved as ``<module>.weight`` (``save_embedding_layers`` of
    an embedding that is no LoRA target), which an engine that reads saved embeddings only as
    ``<module>.base_layer.weight`` refuses (vLLM); ``any_form``: in either form (lmdeploy)."""
    return [make_violation(
        "LG104", "saved-embedding-any" if any_form else "saved-embedding", subject, key=key,
        engine=engine,
        module=key.removesuffix(".weight").removesuffix(".base_layer").rsplit(".", 1)[-1])
        for key, what in spec.extra_keys.items()
        if what == "embedding-base" and (any_form or not key.endswith(".base_layer.weight"))
    ][:MAX_PER_KIND]


def _packed_ranks(subject: str, modules: Mapping[str, LoRAModuleSpec], engine: str,
                  memo: Memo | None = None) -> list[Violation]:
    """LG111: the parts of one packed module at different ranks (modules without a rank are
    not compared); a header found uniform once is not grouped again."""
    if memo is not None and memo.packed.get(id(modules)) is modules:
        return []
    groups: dict[tuple[str, str], dict[str, int]] = {}
    for m in modules.values():
        parent = _packed_parent(m) if m.rank else None
        if parent is not None:
            groups.setdefault(parent, {})[m.target] = int(m.rank or 0)
    bad = [(k, v) for k, v in groups.items() if len(set(v.values())) > 1]
    if memo is not None and not bad:
        remember(memo.packed, id(modules), modules)
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
