"""LG105 unsupported-feature: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG105",
    slug="unsupported-feature",
    title="A config feature the server does not serve",
    summary=(
        "DoRA, `lora_bias`, `bias` other than \"none\", `modules_to_save`, trainable tokens "
        "and similar features change the forward pass. A server that does not implement "
        "them either refuses the adapter or serves a different function than was trained."
    ),
    triggers=(
        "`use_dora`, `lora_bias`, `bias != \"none\"`, `modules_to_save`, "
        "`trainable_token_indices` or a non-LORA `peft_type` in the config, or their "
        "weights in the file, or an `added_tokens.json` whose token ids are at or past the "
        "base's `vocab_size`, without `ServingLimits(allow=...)` naming them.",
    ),
    situations=(
        "A DoRA fine-tune sent to vLLM, which does not serve DoRA.",
        "`modules_to_save=['lm_head']` from a classification fine-tune.",
    ),
    fixes=(
        "Retrain without {feature}, or serve the adapter on an engine that implements "
        "{feature} and allow it there (lora-guard check --allow {allow_name}, or "
        "ServingLimits(allow={{{allow_name!r}}})).",
        "Merge the feature into the base model and serve the merged model.",
        "The adapter was trained with tokens the base model does not have: merge it into "
        "the base with the resized embeddings (model.resize_token_embeddings, then "
        "merge_and_unload) and serve the merged model with the adapter's tokenizer; if "
        "the engine does serve them, allow it (lora-guard check --allow added_tokens).",
    ),
    variant_fixes={"added-tokens": 2},
    example=(
        '# lora-guard check says:\n# LG105 unsupported-feature: uses DoRA (use_dora=True),'
        ' which the server does not serve.\n'
        "# before\n"
        "LoraConfig(r=16, use_dora=True)\n"
        "# after\n"
        "LoraConfig(r=16)\n"
    ),
    error="AdapterError",
    messages={
        "feature": "{subject}: uses {feature} ({value}), which the server does not serve.",
        "saved": (
            "{subject}: uses {feature} ({value}): {saved} ({nbytes} bytes, {share}% of the "
            "weights file), which the server does not serve."
        ),
        "added-tokens": (
            "{subject}: added_tokens.json adds {count} token(s) to the vocabulary ({tokens}; "
            "ids {first}..{last}, {beyond}), which {server} does not serve."
        ),
        "hotswap-config": (
            "{subject}: the new adapter's {key} is {new!r} but the loaded adapter's is "
            "{old!r}; a hot-swap keeps the loaded adapter's {key}, so the swapped model "
            "would compute another function than the adapter was trained for."
        ),
    },
    raised_by=("lg.check_adapters", "lora-guard check", "integrations.vllm",
               "integrations.sglang", "integrations.peft"),
)
