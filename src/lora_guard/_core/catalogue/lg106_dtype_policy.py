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
    ),
    situations=("An fp32 export of a bf16 fine-tune; a partial conversion script.",),
    fixes=(
        "Convert the adapter to one allowed dtype before serving it "
        "(e.g. save it again after model.to(torch.bfloat16)).",
        "Widen ServingLimits(dtypes=...) if the server casts safely.",
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
    },
    raised_by=("lg.check_adapters", "lora-guard check"),
)
