"""LG106's check: mixed dtypes, and dtypes the server does not take."""

from __future__ import annotations

from lora_guard._checking.registry import adapter_check
from lora_guard._checking.rules.context import AdapterContext
from lora_guard._checking.rules.shared import more
from lora_guard._core.errors import Violation, make_violation


@adapter_check("LG106", position=120)
def dtype_policy(ctx: AdapterContext) -> list[Violation]:
    spec, limits = ctx.spec, ctx.limits
    found = []
    if len(spec.dtypes) > 1 and "cast" not in limits.engine_rules:
        found.append(make_violation("LG106", "mixed", ctx.subject, dtypes=list(spec.dtypes)))
    if limits.dtypes is None:
        return found
    lora_keys = [k for m in spec.modules.values() for k in (m.a_key, m.b_key) if k]
    for dtype in spec.dtypes:
        if dtype not in limits.dtypes:
            first = next(k for k in lora_keys if spec.tensors[k].dtype == dtype)
            count = sum(1 for k in lora_keys if spec.tensors[k].dtype == dtype)
            found.append(make_violation(
                "LG106", "allowed", ctx.subject, dtype=dtype, key=more(first, count),
                allowed=", ".join(sorted(limits.dtypes))))
    return found
