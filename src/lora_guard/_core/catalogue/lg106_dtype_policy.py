"""LG106 dtype-policy: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG106",
    slug="dtype-policy",
    title="A dtype outside the allowed set, or mixed dtypes in one adapter",
    summary=(
        "Pools are allocated in one dtype. An adapter in a dtype the server does not accept, "
        "or whose tensors mix dtypes, is cast silently (losing precision) or mis-copied."
    ),
    triggers=(
        "A tensor whose dtype is not in `ServingLimits.dtypes`.",
        "LoRA tensors of more than one dtype in one adapter.",
        "LoRA tensors in an integer, bool or complex dtype (no training produces them): the "
        "engines cast them to the model's float dtype and serve numbers nobody trained.",
    ),
    situations=("An fp32 export of a bf16 fine-tune; a partial conversion script.",
                "A conversion script that wrote the tensors' bytes under another dtype code, or "
                "quantised them without keeping the scales.",),
    fixes=(
        "Convert the adapter to one allowed dtype before serving it "
        "(e.g. save it again after model.to(torch.bfloat16)).",
        "Widen ServingLimits(dtypes=...) if the server casts safely.",
        "Save the adapter again from its trained floating-point weights (PEFT's "
        "save_pretrained writes them as trained); if it was quantised, dequantise it first.",
    ),
    example=(
        "# lora-guard check says:\n# LG106 dtype-policy: LoRA tensors mix dtypes ['float16"
        "', 'float32'].\n"
        "# after\nmodel = model.to(torch.bfloat16)\nmodel.save_pretrained(path)\n"
    ),
    error="AdapterError",
    messages={
        "allowed": "{subject}: dtype {dtype} of {key} is not allowed; allowed: {allowed}.",
        "mixed": "{subject}: LoRA tensors mix dtypes {dtypes}.",
        "not-float": (
            "{subject}: {key} is {dtype}, not a floating-point dtype: LoRA weights are "
            "trained in floating point, and an engine casts these values to its float dtype "
            "and serves numbers no training produced."
        ),
    },
    variant_fixes={"not-float": 2},
    raised_by=("lg.check_adapters", "lora-guard check"),
)
