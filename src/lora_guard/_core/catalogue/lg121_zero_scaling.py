"""LG121 zero-scaling: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG121",
    slug="zero-scaling",
    title="A scaling of zero: lora_alpha 0",
    summary=(
        "A LoRA module adds (alpha / r) * B @ A to the base output. With `lora_alpha` 0 "
        "(or an `alpha_pattern` value 0) that scaling is 0, so the module adds nothing "
        "whatever its weights hold, and the adapter loads and serves the base model. Read "
        "from the config: reported by every check, not only the value scan."
    ),
    triggers=("`lora_alpha: 0`, or an `alpha_pattern` value 0, in `adapter_config.json`.",),
    situations=(
        "A config written by a script that lost lora_alpha (0 as a placeholder).",
        "An alpha_pattern meant to switch modules off, left in a released adapter.",
    ),
    fixes=(
        "Set lora_alpha in adapter_config.json to the value the adapter was trained with "
        "(often r or 2*r; see the training config), or retrain with a non-zero lora_alpha.",
    ),
    example=(
        "# before\n"
        '{"r": 16, "lora_alpha": 0, ...}      # LG121\n'
        "# after\n"
        '{"r": 16, "lora_alpha": 32, ...}\n'
    ),
    error="AdapterError",
    messages={
        "config": (
            "{subject}: {where} is {value}, so the scaling alpha/r of {modules} is 0: the "
            "adapter adds nothing there."
        ),
    },
    raised_by=("lg.check_adapters", "lora-guard check"),
)
