"""LG121's check: ``lora_alpha`` 0 (or an ``alpha_pattern`` value 0) scales B @ A by 0."""

from __future__ import annotations

from lora_guard._checking.registry import adapter_check
from lora_guard._checking.rules.context import AdapterContext
from lora_guard._checking.rules.shared import more
from lora_guard._core.errors import Violation, make_violation
from lora_guard._reading.adapters import pattern_value


@adapter_check("LG121", position=140)
def zero_scaling(ctx: AdapterContext) -> list[Violation]:
    spec, subject = ctx.spec, ctx.subject
    alpha = spec.config.get("lora_alpha")
    pattern = spec.config.get("alpha_pattern") or {}
    if alpha != 0 and not pattern:
        return []
    found: list[Violation] = []
    if alpha == 0:
        overridden = {m for m in spec.modules
                      if pattern_value(pattern, m) not in (None, 0)}
        zero = [m for m in spec.modules if m not in overridden]
        if zero or not spec.modules:
            found.append(make_violation(
                "LG121", "config", subject, where="lora_alpha", value=alpha,
                modules=more(zero[0], len(zero)) if zero else "every module"))
    for key, value in pattern.items():
        if value == 0:
            hit = [m for m in spec.modules if pattern_value(pattern, m) == 0]
            found.append(make_violation(
                "LG121", "config", subject, where=f"alpha_pattern[{key!r}]", value=value,
                modules=more(hit[0], len(hit)) if hit else "no module of this adapter"))
    return found
