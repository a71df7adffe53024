"""LG102 rank-inconsistent: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG102",
    slug="rank-inconsistent",
    title="A and B disagree on rank, or the tensors disagree with the config",
    summary=(
        "A LoRA module's A is `(r, in)` and its B is `(out, r)`. When A's rows differ from "
        "B's columns, or from the `r` (or `rank_pattern` value) in the config, the product "
        "B @ A is wrong or cannot be computed, and a server pads or scales it wrongly."
    ),
    triggers=(
        "A `lora_A` with r rows beside a `lora_B` with another number of columns.",
        "Tensor rank different from the config's `r` / `rank_pattern` for that module.",
    ),
    situations=(
        "An adapter edited or merged by hand, its config not updated.",
        "A `rank_pattern` regex that no longer matches the module names after a rename.",
    ),
    fixes=(
        "Re-save the adapter with its real rank in adapter_config.json (r or rank_pattern).",
        "Re-export the adapter from the training run; do not mix A and B from different runs.",
    ),
    example=(
        '# lora-guard check says:\n# LG102 rank-inconsistent: model.layers.0.self_attn.q_p'
        'roj has lora_A of rank 8 (shape (8, 64)) but lora_B of rank 9 (shape (64, 9)).\n'
        "# before: config r=8, tensors saved at rank 16\n"
        '{"r": 8, ...}\n'
        "# after\n"
        '{"r": 16, ...}\n'
    ),
    error="AdapterError",
    messages={
        "a-b": (
            "{subject}: {module} has lora_A of rank {rank_a} (shape {shape_a}) but lora_B of "
            "rank {rank_b} (shape {shape_b})."
        ),
        "config": (
            "{subject}: {module} has tensors of rank {rank} but the config says {config_rank}."
        ),
    },
    raised_by=("lg.check_adapters", "lora-guard check", "integrations.vllm",
               "integrations.sglang", "integrations.peft"),
)
