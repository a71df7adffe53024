"""LG101's check of one adapter: ranks above the server's limit (the config's values too, as
vLLM checks them). Across a set (``rank-from-set``): `check_adapters`."""

from __future__ import annotations

from lora_guard._checking.registry import adapter_check
from lora_guard._checking.rules.context import AdapterContext
from lora_guard._core.errors import Violation, make_violation


@adapter_check("LG101", position=90)
def rank_exceeds_limit(ctx: AdapterContext) -> list[Violation]:
    limits, config = ctx.limits, ctx.spec.config
    if limits.max_rank is None and limits.allowed_ranks is None:
        return []
    found = []
    ranks = dict(ctx.modules.ranks)  # rank -> first module with it
    config_ranks = {int(config["r"]): "r in adapter_config.json"}
    for key, value in (config.get("rank_pattern") or {}).items():
        config_ranks.setdefault(int(value), f"rank_pattern[{key!r}]")
    for rank, where in config_ranks.items():
        ranks.setdefault(rank, where)
    for rank, where in sorted(ranks.items()):
        if limits.max_rank is not None and rank > limits.max_rank:
            found.append(make_violation("LG101", "max", ctx.subject, rank=rank,
                                        module=where, max_rank=limits.max_rank))
        elif limits.allowed_ranks is not None and rank not in limits.allowed_ranks:
            found.append(make_violation("LG101", "allowed", ctx.subject, rank=rank,
                                        module=where, allowed=sorted(limits.allowed_ranks)))
    return found
