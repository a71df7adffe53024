"""LG106's check: mixed dtypes, dtypes the server does not take, and LoRA weights in a dtype
no training produces (integers, bool, complex), which vLLM and sglang cast and serve."""

from __future__ import annotations

from lora_guard._checking.registry import adapter_check
from lora_guard._checking.rules.context import AdapterContext
from lora_guard._checking.rules.shared import more
from lora_guard._core.errors import Violation, make_violation

_NOT_FLOAT = frozenset(("bool", "uint8", "int8", "int16", "uint16", "int32", "uint32",
                        "int64", "uint64", "complex64"))


@adapter_check("LG106", position=120)
def dtype_policy(ctx: AdapterContext) -> list[Violation]:
    spec, limits = ctx.spec, ctx.limits
    found = []
    if len(spec.dtypes) > 1 and "cast" not in limits.engine_rules:
        found.append(make_violation("LG106", "mixed", ctx.subject, dtypes=list(spec.dtypes)))
    odd = _NOT_FLOAT.intersection(spec.dtypes)
    if limits.dtypes is None and not odd:
        return found
    lora_keys = [k for m in spec.modules.values() for k in (m.a_key, m.b_key) if k]

    def tensors_of(dtype: str) -> str:  # the first LoRA tensor of that dtype, and how many
        keys = [k for k in lora_keys if spec.tensors[k].dtype == dtype]
        return more(keys[0], len(keys))

    found += [make_violation("LG106", "not-float", ctx.subject, dtype=dtype,
                             key=tensors_of(dtype)) for dtype in sorted(odd)]
    if limits.dtypes is None:
        return found
    allowed = ", ".join(sorted(limits.dtypes))
    return found + [make_violation("LG106", "allowed", ctx.subject, dtype=dtype,
                                   key=tensors_of(dtype), allowed=allowed)
                    for dtype in spec.dtypes if dtype not in limits.dtypes and dtype not in odd]
