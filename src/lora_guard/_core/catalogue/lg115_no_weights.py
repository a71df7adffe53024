"""LG115 no-weights: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG115",
    slug="no-weights",
    title="An adapter that holds no tensors",
    summary=(
        "An adapter folder whose weights file holds no tensor at all loads without error "
        "on every engine and then serves the base model: the fine-tune is simply not there. "
        "It is what a ZeRO-3 save without gathering, an interrupted upload or a save from "
        "the wrong process leaves behind."
    ),
    triggers=("An `adapter_model.safetensors` whose header lists no tensor.",),
    situations=(
        "DeepSpeed ZeRO-3 saving the adapter without gathering the partitioned weights.",
        "`save_pretrained` called on a rank that holds no parameters; an upload cut short.",
    ),
    fixes=(
        "Save the adapter again from the training run with the weights gathered (ZeRO-3: "
        "stage3_gather_16bit_weights_on_model_save, or save from rank 0 after "
        "accelerator.get_state_dict(model)), then check that adapter_model.safetensors "
        "lists lora_A/lora_B tensors.",
    ),
    example=(
        "lora-guard check ./adapter\n"
        "# adapter './adapter': adapter_model.safetensors holds no tensors; the adapter "
        "would serve the base model unchanged.   [LG115]\n"
    ),
    error="AdapterError",
    messages={
        "empty": (
            "{subject}: {file} holds no tensors; the adapter would serve the base model "
            "unchanged."
        ),
    },
    raised_by=("lg.check_adapters", "lora-guard check", "integrations.peft"),
)
