"""LG107 empty-tensor: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG107",
    slug="empty-tensor",
    title="A zero-size tensor",
    summary=(
        "Some sharded trainers (FSDP, ZeRO-3 without gathering) save empty placeholders. "
        "A zero-size LoRA weight loads without error and contributes nothing, or breaks "
        "the slicing of a tensor-parallel server (tp > ep once sliced MoE weights to [r, 0])."
    ),
    triggers=("A tensor with a 0 in its shape.",),
    situations=("Saving an adapter from one rank of a sharded run without gathering.",),
    fixes=(
        "Gather the full state dict before saving (e.g. FSDP full_state_dict, "
        "ZeRO-3 stage3_gather_16bit_weights_on_model_save).",
    ),
    example=(
        '# lora-guard check says:\n# LG107 empty-tensor: tensor base_model.model.model.lay'
        'ers.0.self_attn.q_proj.lora_A.weight has zero size (shape (0, 64)).\n'
        "# after\nwith FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT): ...\n"
    ),
    error="AdapterError",
    messages={"empty": "{subject}: tensor {key} has zero size (shape {shape})."},
    raised_by=("lg.check_adapters", "lora-guard check", "integrations.vllm",
               "integrations.sglang", "integrations.peft"),
)
