"""LG002 mixed-moe-layout: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG002",
    slug="mixed-moe-layout",
    title="MoE adapters of different layouts in one pool",
    summary=(
        "Fused MoE LoRA kernels assume one weight layout for every adapter in a pool: "
        "shared-outer (one outer weight for all experts), per-expert, or PEFT's flat "
        "`target_parameters` layout. An adapter of another layout would be read with the "
        "wrong strides and serve garbage, so it is refused at admission."
    ),
    triggers=(
        "`LayoutRegistry.admit` of an adapter whose MoE layout differs from the layout the "
        "pool already holds.",
        "One adapter whose own MoE weights mix layouts.",
        "`lora-guard check` on a set of adapters of more than one MoE layout.",
    ),
    situations=(
        "Adapters exported by different versions of a training library.",
        "Mixing adapters trained with shared-outer MoE LoRA and per-expert LoRA on one server.",
    ),
    fixes=(
        "Serve adapters of one MoE layout per server (or per pool); release the adapters of "
        "the other layout first, or re-export them in the pool's layout.",
        "Re-export or retrain every MoE adapter with the same layout and tool version.",
        "Group adapters by layout and serve each group on its own instance.",
    ),
    example=(
        "# before: two layouts admitted into one pool\n"
        "registry.admit('math', shared_outer_weights)\n"
        "registry.admit('code', per_expert_weights)   # LG002\n"
        "\n"
        "# after: check the layout first, route to a pool that serves it\n"
        "layout = lg.detect_moe_layout(per_expert_weights)\n"
        "pools[layout].admit('code', per_expert_weights)\n"
    ),
    error="MixedMoELayoutError",
    messages={
        "pool": (
            "{subject}: its MoE layout is {layout}, but the pool holds {pool_layout} "
            "adapters (set by adapter {owner!r}); fused MoE buffers serve one layout only."
        ),
        "within": (
            "{subject}: its own MoE weights mix layouts: {first_key} is {layout} but "
            "{other_key} is {other_layout}."
        ),
        "set": (
            "{subject}: MoE layout {layout} differs from {pool_layout} of adapter {owner!r} "
            "in the same set."
        ),
    },
    raised_by=(
        "lg.LayoutRegistry.admit",
        "@lg.guard_adapter_load",
        "lg.detect_moe_layout",
        "lg.check_adapters",
        "integrations.sglang",
        "integrations.peft",
        "integrations.vllm",
    ),
)
