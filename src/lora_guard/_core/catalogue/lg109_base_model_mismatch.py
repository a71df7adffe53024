"""LG109 base-model-mismatch: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG109",
    slug="base-model-mismatch",
    title="An adapter that does not fit the base model",
    summary=(
        "An adapter trained on another base model (another size, vocabulary, layer count or "
        "expert count) can load without error where only names are checked, and then serves "
        "garbage. Its A in-dims and B out-dims must match the base model's module dims."
    ),
    triggers=(
        "A weight whose in/out dims differ from the base config's (hidden, intermediate, "
        "head dims, kv heads, vocab).",
        "A layer index at or above `num_hidden_layers` (or the live model's layer count); "
        "an expert index at or above the expert count.",
        "Vision- or audio-tower weights on a text-only base model.",
        "Module names of another architecture (GPT-2's `transformer.h.0.attn.c_attn` on a "
        "Llama base), even where the sizes happen to match.",
    ),
    situations=(
        "A 7B adapter loaded onto a 1B model with the same architecture names.",
        "An adapter for a model variant with another vocabulary.",
    ),
    fixes=(
        "Serve the adapter on the base model it was trained on (see "
        "base_model_name_or_path in its config).",
        "Retrain the adapter on this base model.",
        "Serve a multimodal adapter on the multimodal base model it was trained on (whose "
        "config has the tower's vision_config/audio_config), or retrain it on the language "
        "model's modules only.",
        "Serve the adapter on a base model of the architecture it was trained on (its module "
        "names come from base_model_name_or_path's architecture); renaming the keys does "
        "not help, the weights belong to another network.",
        "Serve the adapter on the base model it was trained on; its config does not say "
        "which (base_model_name_or_path is empty): ask whoever trained it, or compare its "
        "dims with the base models you serve.",
    ),
    example=(
        "lora-guard check ./adapter --base-config ./base/config.json   # LG109\n"
    ),
    error="AdapterError",
    messages={
        "dim": (
            "{subject}: {key} has {which} dim {got}, but {module_kind} on the base model "
            "has {expected} ({source})."
        ),
        "dims": (
            "{subject}: {count} weights do not fit the base model's dims, {kinds} "
            "mismatches: {examples}{rest} (the first weight: {key})."
        ),
        "layer": (
            "{subject}: {key} is for layer {layer}, but the base model has {layers} layers."
        ),
        "expert": (
            "{subject}: {key} is for expert {expert}, but the base model has {experts} "
            "experts."
        ),
        "vocab": "{subject}: {key} has vocab dim {got}, the base model's vocab is {expected}.",
        "tower": (
            "{subject}: {key} adapts a {tower} tower, but the base model ({source}) has "
            "none (no {tower}_config); nothing would apply it."
        ),
        "architecture": (
            "{subject}: module {key} is not a module of the base model's architecture "
            "({model_type}, whose modules are named like {example}); the adapter was made "
            "for another architecture and would not be applied."
        ),
    },
    variant_fixes={"tower": 2, "architecture": 3},
    raised_by=("lg.check_adapters", "lora-guard check", "integrations.vllm",
               "integrations.sglang", "integrations.peft"),
)
