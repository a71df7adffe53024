"""LG003 cache-key-collision: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG003",
    slug="cache-key-collision",
    title="One cache key maps to tensors of different shape or dtype",
    summary=(
        "A weight cache (sglang's pinned-weight store, a CPU LoRA cache) reuses tensors "
        "by key. When the key does not include shape and dtype, a second weight of another "
        "shape under the same key either gets the stale tensor copied into the GPU pool or "
        "overwrites a tensor another adapter still uses."
    ),
    triggers=(
        "Storing a tensor in a `GuardedCache` under a key that holds one of another shape "
        "or dtype.",
        "A `@lg.guard_cache_lookup` lookup whose cached hit differs from the weight asked for.",
    ),
    situations=(
        "A cache key built from the weight name only while adapters of different ranks load.",
        "A key scheme that omits dtype when fp16 and bf16 adapters are served together.",
    ),
    fixes=(
        "Build cache keys with lora_guard.weight_cache_key(name, ..., weight=w), which "
        "includes shape and dtype.",
        "Evict the entry when an adapter is unloaded or reconfigured "
        "(GuardedCache(store, on_collision='evict')).",
        "Make sure weights stored under one key always come from one adapter shape and dtype.",
    ),
    example=(
        "# the guard says:\n# LG003 cache-key-collision: cache key 'model.layers.0.q_proj."
        "lora_A#tp0' holds a tensor of shape (16, 64) and dtype float16, but the new weig"
        'ht has shape (8, 64) and dtype float16; the stale tensor would be served.\n'
        "# before\n"
        "cache_key = f'{layer}.{name}#tp{tp_rank}'\n"
        "# after\n"
        "cache_key = lg.weight_cache_key(layer, name, f'tp{tp_rank}', weight=weight)\n"
    ),
    error="CacheKeyCollisionError",
    messages={
        "collision": (
            "cache key {subject!r} holds a tensor of shape {old_shape} and dtype {old_dtype}, "
            "but the new weight has shape {new_shape} and dtype {new_dtype}; the stale "
            "tensor would be served."
        ),
    },
    raised_by=(
        "lg.GuardedCache",
        "@lg.guard_cache_lookup",
        "lg.cache_entry_matches",
        "integrations.sglang",
    ),
)
