"""LG112 scaling-not-honoured: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG112",
    slug="scaling-not-honoured",
    title="A per-module scaling the engine does not compute",
    summary=(
        "PEFT scales each module's update by `lora_alpha / r` (`/ sqrt(r)` with rsLoRA), "
        "with `rank_pattern` and `alpha_pattern` giving a module its own rank and alpha. "
        "An engine that computes one scaling for the whole adapter from `lora_alpha` and "
        "`r` (sglang; vLLM before 0.32) loads such an adapter without a word and serves "
        "every module whose own scaling differs at the wrong strength."
    ),
    triggers=(
        "`lora-guard check --engine sglang` of an adapter with `use_rslora`, or whose "
        "`rank_pattern` / `alpha_pattern` gives a module another `alpha / r` than the "
        "adapter's.",
        "`lora-guard check --engine vllm==0.31.0` (any vLLM before 0.32) of an adapter whose "
        "`rank_pattern` / `alpha_pattern` gives a module another `alpha / r` than the "
        "adapter's (those releases honour `use_rslora`).",
    ),
    situations=("rsLoRA fine-tunes; rank or alpha tuned per module.",),
    fixes=(
        "Fold the scaling into the weights (multiply each module's lora_B by its own "
        "scaling divided by lora_alpha / r) and save the adapter again without "
        "use_rslora, rank_pattern or alpha_pattern, or serve it with vLLM 0.32 or newer, "
        "or PEFT, which honour them (vLLM before 0.32 scales every module by "
        "lora_alpha / r).",
    ),
    example=(
        '# lora-guard check says:\n# LG112 scaling-not-honoured: model.layers.0.self_attn.'
        'v_proj (and 1 more) is scaled by 4 in PEFT (alpha 32), but sglang==0.5.23 scales'
        ' the whole adapter by lora_alpha / r = 1.\n'
        "# before\nLoraConfig(r=16, lora_alpha=16, use_rslora=True)\n"
        "# after (for sglang)\nLoraConfig(r=16, lora_alpha=16)\n"
    ),
    error="AdapterError",
    messages={
        "scaling": (
            "{subject}: {module} is scaled by {expected} in PEFT ({why}), but {engine} "
            "scales the whole adapter by lora_alpha / r = {served}."
        ),
        "experts": (
            "{subject}: the MoE experts {module} are scaled by {expected} in PEFT (rsLoRA), "
            "but {engine} packs them with lora_alpha / r = {served}."
        ),
    },
    raised_by=("lg.check_adapters", "lora-guard check"),
)
