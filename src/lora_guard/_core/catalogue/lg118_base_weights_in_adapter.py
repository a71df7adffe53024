"""LG118 base-weights-in-adapter: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG118",
    slug="base-weights-in-adapter",
    title="Full base-model weights shipped inside an adapter",
    summary=(
        "PEFT saves whole base-model weights into an adapter when an embedding is targeted "
        "(`save_embedding_layers`, e.g. `embed_tokens.base_layer.weight`) or a module is in "
        "`modules_to_save` (e.g. `lm_head.weight`). A LoRA server applies only the A and B "
        "halves and keeps the base model's own copy of those weights, so the adapter serves "
        "another function whenever they were resized (added tokens) or trained; and every "
        "copy of the adapter carries the cost."
    ),
    triggers=(
        "`<embedding>.base_layer.weight` in the weights (an embedding targeted with "
        "`save_embedding_layers` on or `auto`), checked without a base config to compare "
        "its vocabulary with (with one, a vocabulary that differs is LG109).",
        "`modules_to_save` weights are LG105, whose message gives their size too.",
    ),
    situations=(
        "`target_modules` including `embed_tokens` or `lm_head`, saved with the default "
        "`save_embedding_layers='auto'`.",
        "A tokenizer resized for new tokens before training.",
    ),
    fixes=(
        "Check it against the base model (lora-guard check --base-config config.json): "
        "with the base model's vocabulary it serves, with another it is LG109. If the "
        "vocabulary was not resized, save with save_pretrained(path, "
        "save_embedding_layers=False): the adapter loses those bytes and serves the same; "
        "if it was resized, serve the resized base model (or merge the adapter into it).",
    ),
    example=(
        "# before: embed_tokens targeted, its full weight saved too\n"
        "peft_model.save_pretrained('out')                              # LG118\n"
        "# after (vocabulary unchanged)\n"
        "peft_model.save_pretrained('out', save_embedding_layers=False)\n"
    ),
    error="AdapterError",
    messages={
        "embedding": (
            "{subject}: ships the full base weight {key} ({shape}, {nbytes} bytes, "
            "{share}% of the weights file); a LoRA server keeps the base model's own "
            "{module} and drops it, which is right only if the vocabulary was not resized "
            "(no base config to compare with)."
        ),
    },
    raised_by=("lg.check_adapters", "lora-guard check"),
)
