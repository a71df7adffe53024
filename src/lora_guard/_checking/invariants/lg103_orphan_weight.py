"""LG103's check: a LoRA module with one half only (lora_A without lora_B, or the reverse);
and, for an engine that gives a ``target_modules`` name a slot in every layer
(``slots-in-every-layer``: lmdeploy), a layer without that module's weights."""

from __future__ import annotations

from lora_guard._checking.registry import adapter_check, module_rule
from lora_guard._checking.rules.context import AdapterContext, ModuleContext, grouped_violations
from lora_guard._checking.rules.shared import Grouped, more
from lora_guard._core.errors import Violation, make_violation
from lora_guard._reading.adapters import LoRAModuleSpec


@module_rule("LG103", empty_halves=True)
def orphan(ctx: ModuleContext, module: LoRAModuleSpec, grouped: Grouped,
           found: list[Violation]) -> None:
    if module.a_key is not None and module.b_key is not None:
        return
    embedding = module.kind == "embedding"
    a_name = "lora_embedding_A" if embedding else "lora_A"
    b_name = "lora_embedding_B" if embedding else "lora_B"
    present, missing = (a_name, b_name) if module.b_key is None else (b_name, a_name)
    grouped.add(("LG103", "orphan", present), module.module,
                {"present": present, "missing": missing})


@adapter_check("LG103", position=60)
def orphan_weight(ctx: AdapterContext) -> list[Violation]:
    found = grouped_violations(ctx, "LG103", "module")
    if "slots-in-every-layer" in ctx.limits.engine_rules:
        found += _unfilled_slots(ctx)
    return found


def _unfilled_slots(ctx: AdapterContext) -> list[Violation]:
    """A ``target_modules`` name the engine gives a slot in every layer of the base
    (lmdeploy: every module whose name ends with it) with no weights for it in some layer
    (``layers_to_transform``, ``layers_pattern``, a weight missing): that slot is never
    written and serves uninitialised memory. Needs the base's layer count."""
    targets = ctx.spec.config.get("target_modules")
    base = ctx.limits.base
    layers = base.num_layers if base is not None else None
    if not isinstance(targets, (list, tuple)) or not layers:
        return []
    served = ctx.limits.target_modules
    have: dict[str, set[int | None]] = {}
    for m in ctx.spec.modules.values():
        have.setdefault(m.target, set()).add(m.layer)
    for leaf in sorted({str(t).rsplit(".", 1)[-1] for t in targets}):
        if served is not None and leaf not in served:
            continue  # no slot: LG104 speaks for it
        found = have.get(leaf, set())
        if None in found:
            continue  # a module outside the layers (lm_head) with its weights
        missing = [i for i in range(layers) if i not in found]
        if missing:
            return [make_violation(
                "LG103", "unfilled-slot", ctx.subject, module=leaf,
                engine=ctx.limits.engine or "the server",
                layers=more(f"layer {missing[0]}", len(missing)),
                rank=ctx.spec.config.get("r"))]
    return []
