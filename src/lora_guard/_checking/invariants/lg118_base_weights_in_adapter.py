"""LG118's check: full base-model weights shipped inside the adapter, which a server drops for
its own copy: right when the vocab is the base model's (compared with it when known, LG109
otherwise), unknown without it."""

from __future__ import annotations

from lora_guard._checking.registry import adapter_check
from lora_guard._checking.rules.context import AdapterContext
from lora_guard._checking.rules.shared import share, total_bytes
from lora_guard._core.errors import Violation, make_violation


@adapter_check("LG118", position=40)
def base_weights_in_adapter(ctx: AdapterContext) -> list[Violation]:
    spec = ctx.spec
    if not spec.extra_keys or ctx.vocab is not None or ctx.module_dims is not None:
        return []
    found = []
    for key, what in spec.extra_keys.items():
        if what == "embedding-base":
            info = spec.tensors[key]
            leaf = key.removesuffix(".weight").removesuffix(".base_layer").rsplit(".", 1)[-1]
            found.append(make_violation(
                "LG118", "embedding", ctx.subject, key=key, shape=info.shape,
                nbytes=f"{info.nbytes:,}", bytes=info.nbytes,
                share=share(info.nbytes, total_bytes(spec)), module=leaf))
    return found
