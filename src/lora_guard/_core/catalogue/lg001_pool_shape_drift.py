"""LG001 pool-shape-drift: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG001",
    slug="pool-shape-drift",
    title="A pool dimension frozen at first allocation changed",
    summary=(
        "A LoRA pool allocates its buffers (slots, max rank, experts, inner dims) on the "
        "first call and serves every later batch from them. A later call that brings "
        "another size would have the server reallocate or mis-index buffers under "
        "in-flight batches, so the call is refused before it mutates anything."
    ),
    triggers=(
        "A `@lg.shapes(..., frozen=...)` method called with a frozen dim of another size "
        "than on its first successful call.",
        "sglang's shared-sink `set_lora_info` called at rank 16, then at rank 8 or with "
        "more slots.",
    ),
    situations=(
        "Hot-swapping an adapter of another rank into a live pool.",
        "Loading more adapters than the slot count allocated at start-up.",
        "An adapter bundle whose ranks differ from one update to the next.",
    ),
    fixes=(
        "Allocate the pool for the largest rank and slot count up front and pad smaller "
        "adapters into it; call lora_guard.unfreeze(obj) only for a deliberate rebuild.",
        "Recreate the module (or restart the server) when the pool really must change size.",
        "Normalise every adapter to one rank before it reaches the pool.",
        "For PEFT hot-swapping: call prepare_model_for_compiled_hotswap(model, "
        "target_rank=...) with the largest rank you will ever swap in, before compiling.",
    ),
    example=(
        "# before: the second call changes the pool's rank\n"
        "sink.set_lora_info(ga16, gb16, da16, db16)\n"
        "sink.set_lora_info(ga8, gb8, da8, db8)      # LG001: rank 16 -> 8\n"
        "\n"
        "# after: allocate for the largest rank once, zero-pad smaller adapters into it\n"
        "sink.set_lora_info(*pad_to_rank(16, ga8, gb8, da8, db8))\n"
    ),
    error="PoolShapeDriftError",
    messages={
        "frozen": (
            "{subject}: dim '{dim}' was frozen at {old} by the first call and is now {new} "
            "(argument '{argument}' has shape {shape})."
        ),
        "expected": (
            "{subject}: pool dim '{dim}' is {new}, but the server expects {old}."
        ),
        "hotswap": (
            "{subject}: {key} has rank {new}, above the rank {old} that "
            "prepare_model_for_compiled_hotswap padded the model to; PEFT would replace the "
            "padded tensor (torch.utils.swap_tensors) and break the compiled model's fixed "
            "shapes (prepare it with target_rank={new} or more)."
        ),
    },
    variant_fixes={"hotswap": 3},
    raised_by=("@lg.shapes(frozen=...)", "lg.pool_shapes_stable", "integrations.sglang",
               "integrations.peft"),
)
