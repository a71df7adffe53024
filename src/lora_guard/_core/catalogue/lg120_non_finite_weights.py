"""LG120 non-finite-weights: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG120",
    slug="non-finite-weights",
    title="NaN or Inf values in an adapter's weights",
    summary=(
        "A training run that diverged (fp16 overflow, a learning rate too high) can save "
        "LoRA weights holding NaN or Inf. They load without a word and turn every output "
        "that passes through the module into NaN. Found by the opt-in value scan "
        "(`lora-guard check --scan-values`)."
    ),
    triggers=("A NaN or an infinite value in any floating-point tensor, in the value scan.",),
    situations=(
        "fp16 training without loss scaling; a loss spike before the checkpoint was saved.",
    ),
    fixes=(
        "Save the adapter from an earlier, finite checkpoint, or retrain with bf16 or fp32, "
        "loss scaling and a lower learning rate; check torch.isfinite on the weights "
        "before uploading.",
    ),
    example=(
        "lora-guard check --scan-values ./adapter\n"
        "# adapter './adapter': tensor ...q_proj.lora_A.weight holds 3 NaN and 0 Inf values "
        "(of 512).   [LG120]\n"
    ),
    error="AdapterError",
    messages={
        "values": (
            "{subject}: tensor {key} holds {nan} NaN and {inf} Inf values (of "
            "{numel}); every output through it becomes NaN."
        ),
    },
    raised_by=("lg.check_adapters(scan_values=True)", "lora-guard check --scan-values"),
)
