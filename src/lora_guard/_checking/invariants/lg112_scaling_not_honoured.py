"""LG112's check: a module (with a rank) whose own rank or alpha gives another scaling than the
one the engine applies to every module (``one-scaling``: ``lora_alpha / r``;
``one-scaling-rslora``: ``lora_alpha / sqrt(r)`` for rsLoRA, where the engine reads
``use_rslora``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lora_guard._checking.registry import adapter_check
from lora_guard._checking.rules.context import AdapterContext
from lora_guard._checking.rules.shared import more
from lora_guard._core.errors import Violation, make_violation
from lora_guard._reading.adapters import LoRAModuleSpec, pattern_value


@adapter_check("LG112", position=110)
def scaling_not_honoured(ctx: AdapterContext) -> list[Violation]:
    rules = ctx.limits.engine_rules
    found = _rslora_experts(ctx) if "moe-rslora-alpha-r" in rules else []
    if "one-scaling" not in rules and "one-scaling-rslora" not in rules:
        return found
    return _one_scaling(ctx.subject, ctx.spec.config, ctx.spec.modules,
                        ctx.limits.engine or "the server",
                        rslora_aware="one-scaling-rslora" in rules) + found


def _rslora_experts(ctx: AdapterContext) -> list[Violation]:
    """``moe-rslora-alpha-r``: an rsLoRA adapter's routed experts, which the engine packs with
    ``lora_alpha / r`` (vLLM 0.29's ``pack_moe``) while its other modules get
    ``lora_alpha / sqrt(r)``."""
    config = ctx.spec.config
    try:
        r, alpha = int(config["r"]), float(config.get("lora_alpha", 8))
    except (KeyError, TypeError, ValueError):
        return []
    experts = [m.module for m in ctx.spec.modules.values()
               if m.kind == "moe-per-expert" and m.rank and ".shared_experts." not in m.module]
    if not config.get("use_rslora") or r <= 0 or not experts:
        return []
    return [make_violation(
        "LG112", "experts", ctx.subject, module=more(experts[0], len(experts)),
        expected=f"{alpha / r ** 0.5:.4g}", engine=ctx.limits.engine or "the server",
        served=f"{alpha / r:.4g}")]


def _scaling(alpha: float, rank: int, rslora: bool) -> float:
    return float(alpha) / (rank ** 0.5 if rslora else rank)


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
