"""LG119 noop-adapter: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG119",
    slug="noop-adapter",
    title="lora_B all zeros: the adapter does nothing",
    summary=(
        "PEFT initialises every lora_B to zeros, so B @ A is zero until training moves B. "
        "An adapter saved before training, or whose trained B was lost (a save from the "
        "wrong process, a failed merge, a bug in a conversion script), loads and serves "
        "without any error and computes exactly the base model. No engine can tell: it "
        "takes the values, not the header. Found by the opt-in value scan "
        "(`lora-guard check --scan-values`)."
    ),
    triggers=(
        "Every value of a module's `lora_B` (or `lora_embedding_B`) is zero, in the value "
        "scan.",
    ),
    situations=(
        "`save_pretrained` called right after `get_peft_model`, before `trainer.train()`.",
        "Training with a learning rate of 0, or with the LoRA parameters frozen.",
        "A checkpoint of the wrong step or process uploaded.",
    ),
    fixes=(
        "Check the training run: save the adapter after training from the process that "
        "trained it (trainer.save_model() or model.save_pretrained() after train()), with "
        "the LoRA parameters trainable (model.print_trainable_parameters()) and a learning "
        "rate above 0.",
    ),
    example=(
        "lora-guard check --scan-values ./adapter\n"
        "# adapter './adapter': lora_B is all zeros in every one of its 4 modules "
        "(model.layers.0.self_attn.q_proj and 3 more): the adapter computes the base "
        "model unchanged.   [LG119]\n"
    ),
    error="AdapterError",
    messages={
        "all": (
            "{subject}: lora_B is all zeros in every one of its {count} modules "
            "({modules}): the adapter computes the base model unchanged."
        ),
        "some": (
            "{subject}: lora_B is all zeros in {count} of its {total} modules "
            "({modules}): those modules compute nothing."
        ),
    },
    raised_by=("lg.check_adapters(scan_values=True)", "lora-guard check --scan-values"),
)
