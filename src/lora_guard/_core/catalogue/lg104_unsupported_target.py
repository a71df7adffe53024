"""LG104 unsupported-target: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG104",
    slug="unsupported-target",
    title="A weight whose module is not served, or not LoRA key grammar",
    summary=(
        "Servers apply an adapter by module name. A weight for a module the server does not "
        "serve is dropped without a word (the adapter then silently serves the base model), "
        "and a key outside PEFT's grammar is not understood at all."
    ),
    triggers=(
        "A weight module not in `ServingLimits.target_modules`.",
        "A key that is not `<module>.lora_A.weight`, `lora_B.weight`, `lora_embedding_A/B`, "
        "DoRA's magnitude vector or a `modules_to_save` weight.",
        "lmdeploy: a full embedding weight saved with the adapter (`save_embedding_layers`, "
        "which PEFT turns on for an `lm_head` or `embed_tokens` target), in either form.",
        "sglang: a weight of a module outside the server's pool (`--lora-target-modules`, "
        "or without it the union of the start-up adapters' `target_modules`): refused at "
        "load when the adapter's config names such a module, otherwise skipped with a "
        "warning, and the first batch that uses the adapter fails; LoRA on `embed_tokens` / "
        "`lm_head` that the adapter's own `target_modules` does not name, dropped without a "
        "word; MoE expert LoRA saved by PEFT's `target_parameters`, whose names hold no "
        "module of the pool (the first batch fails).",
        "sglang: a layer with LoRA on q_proj but not v_proj, on k_proj or v_proj but not "
        "q_proj, or on up_proj but not gate_proj (it stacks q/k/v and gate/up from the "
        "first).",
        "vLLM: LoRA on `embed_tokens` / `lm_head` of a base whose vLLM model class does not "
        "serve LoRA on that embedding (Qwen2, Mistral, Gemma 2), by the base config's "
        "`architectures`.",
        "PEFT (`--engine peft`, the integration): weights of a module the adapter's own "
        "config does not select: `target_modules` does not name or match it, "
        "`exclude_modules` or `modules_to_save` names it, or `layers_to_transform` leaves "
        "out its layer (the index found by `layers_pattern`, or the first numbered part of "
        "the name; a module without one, `lm_head`, is never selected). PEFT puts no LoRA "
        "on it and drops its weights without a word; when it selects no module at all, the "
        "load fails.",
    ),
    situations=(
        "Module prefixes from another architecture (`model.layers` vs `transformer.h`).",
        "An adapter targeting `lm_head` or an MoE router the server does not serve.",
    ),
    fixes=(
        "Serve the module (add it to the server's LoRA target modules) or retrain the adapter "
        "on modules the server serves.",
        "Rename the keys to the base model's module names if the adapter was converted.",
        "Save the adapter without the full embedding weights "
        "(save_pretrained(path, save_embedding_layers=False)) when the vocabulary was not "
        "resized; if it was, merge the adapter into the resized base model and serve that.",
        "Retrain with target_modules holding the whole stack the engine builds (sglang: "
        "q_proj with v_proj, k_proj optional; gate_proj with up_proj optional), or serve the "
        "adapter with an engine that applies each projection on its own (vLLM).",
        "Retrain without LoRA on embed_tokens / lm_head (target the linear layers; new tokens "
        "need the embeddings merged into the base), or merge the adapter into the base model "
        "and serve the merged model.",
        "Make the config select every module the weights hold (target_modules naming "
        "each, exclude_modules and modules_to_save naming none of them, layers_to_transform "
        "listing each layer or null), or drop the weights it leaves out: a config edited "
        "after training no longer says what was trained.",
        "Start sglang with --lora-target-modules naming every module the adapters train "
        "(q/k/v and gate/up by any of their names), or all; without the flag its pool holds "
        "only what the start-up adapters' target_modules name. Or retrain the adapter on the "
        "modules the server serves.",
        "Save the experts' LoRA in a layout the engine reads (per expert, "
        "experts.<i>.gate_proj / up_proj / down_proj, or packed 3-D experts.gate_up_proj / "
        "down_proj), or serve the adapter with an engine that reads PEFT's "
        "target_parameters.",
    ),
    example=(
        "# before: adapter targets o_proj, server serves q_proj,v_proj\n"
        "lora-guard check a --target-modules q_proj,v_proj   # LG104\n"
        "# after\n"
        "lora-guard check a --target-modules q_proj,v_proj,o_proj\n"
    ),
    error="AdapterError",
    messages={
        "module": "{subject}: module {module} ({target}) is not served; served: {served}.",
        "flat-experts": (
            "{subject}: {module} holds MoE expert LoRA ({target}) in the layout of PEFT's "
            "target_parameters; {engine} finds a weight's LoRA module by its name, finds none "
            "in these, loads the adapter, skips them with a warning and fails the first batch "
            "that uses it."
        ),
        "pool": (
            "{subject}: module {module} ({target}) is not among {engine}'s LoRA modules "
            "({served}; {source}): {outcome}."
        ),
        "grammar": "{subject}: tensor key {key!r} is not LoRA key grammar.",
        "saved-embedding": (
            "{subject}: tensor key {key!r} is a full {module} weight saved with "
            "save_embedding_layers; {engine} reads saved embeddings only as "
            "'<module>.base_layer.weight' and refuses this key as an unsupported LoRA "
            "weight."
        ),
        "saved-embedding-any": (
            "{subject}: tensor key {key!r} is a full {module} weight saved with the adapter "
            "(save_embedding_layers); {engine} loads only lora_A/lora_B weights and the "
            "start-up fails on this key."
        ),
        "shared-experts-overwritten": (
            "{subject}: {module} is an indexed shared-expert weight; {engine} takes it for "
            "routed expert {index} and writes it over that expert's LoRA weights without a "
            "word."
        ),
        "shared-experts-refused": (
            "{subject}: {module} is an indexed shared-expert weight (shared_experts.{index}); "
            "{engine} refuses it when it copies the adapter into its memory pool."
        ),        "stack-incomplete": (
            "{subject}: {module} has LoRA on {present} but not on {missing}; {engine} stacks "
            "{parts} into {packed} starting from {first}, and the load fails."
        ),
        "embedding-architecture": (
            "{subject}: LoRA on {module}, but {engine} serves LoRA on the embeddings of "
            "{architecture} only on: {served} (not {target}), and refuses this adapter at "
            "load."
        ),
        "not-selected": (
            "{subject}: {module} has LoRA weights, but {engine} puts no LoRA on it "
            "({why}): {outcome}."
        ),
    },
    raised_by=("lg.check_adapters", "lora-guard check", "integrations.vllm",
               "integrations.sglang", "integrations.lmdeploy", "integrations.peft"),
    variant_fixes={"grammar": 1, "saved-embedding": 2, "saved-embedding-any": 2,
                   "shared-experts-overwritten": 1, "shared-experts-refused": 1,
                   "stack-incomplete": 3, "embedding-architecture": 4,
                   "not-selected": 5, "pool": 6, "flat-experts": 7},
)
