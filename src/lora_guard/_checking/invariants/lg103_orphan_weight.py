"""LG103's check: a LoRA module with one half only (lora_A without lora_B, or the reverse)."""

from __future__ import annotations

from lora_guard._checking.registry import adapter_check, module_rule
from lora_guard._checking.rules.context import AdapterContext, grouped_violations
from lora_guard._checking.rules.shared import Grouped
from lora_guard._core.errors import Violation
from lora_guard._reading.adapters import LoRAModuleSpec


@module_rule("LG103", empty_halves=True)
def orphan(ctx: AdapterContext, module: LoRAModuleSpec, grouped: Grouped,
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
    return grouped_violations(ctx, "LG103", "module")
