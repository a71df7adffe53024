"""LG103 orphan-weight: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG103",
    slug="orphan-weight",
    title="A lora_A without its lora_B, or the reverse",
    summary=(
        "Every LoRA module needs both halves. An orphan half is either silently skipped "
        "(the module serves the base weights) or crashes the loader."
    ),
    triggers=(
        "A weights file with `...lora_A.weight` but no matching `...lora_B.weight`.",
        "lmdeploy (`lora-guard check --engine lmdeploy` with the base's config, the "
        "integration): a `target_modules` name without weights in some layer of the base "
        "(`layers_to_transform`, `layers_pattern`, a module's weights missing): lmdeploy "
        "gives the name a slot in every layer and never writes the missing ones.",
    ),
    situations=(
        "A sharded trainer that saved part of the weights.",
        "Keys renamed by a conversion script for one half only.",
    ),
    fixes=(
        "Re-save the adapter so every module has both lora_A and lora_B.",
        "Drop the orphan module from the weights and from target_modules.",
        "For lmdeploy, give every layer's module its weights: save the adapter without "
        "layers_to_transform / layers_pattern (zero lora_B in the layers it did not train "
        "serves the base there), or serve it with an engine that reads them (vLLM, PEFT).",
    ),
    example=(
        '# lora-guard check says:\n# LG103 orphan-weight: model.layers.0.self_attn.q_proj '
        'has lora_B but no lora_A.\n'
        "# the weights must hold pairs:\n"
        "x.lora_A.weight  (r, in)\n"
        "x.lora_B.weight  (out, r)\n"
    ),
    error="AdapterError",
    messages={
        "orphan": "{subject}: {module} has {present} but no {missing}.",
        "unfilled-slot": (
            "{subject}: {engine} gives {module} a LoRA slot of rank {rank} in every layer, but "
            "the adapter has no {module} weights for {layers}: that slot is never written "
            "and serves uninitialised memory."
        ),
    },
    variant_fixes={"unfilled-slot": 2},
    raised_by=("lg.check_adapters", "lora-guard check", "integrations.vllm",
               "integrations.sglang", "integrations.peft", "integrations.lmdeploy"),
)
