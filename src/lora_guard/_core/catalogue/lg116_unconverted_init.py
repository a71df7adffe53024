"""LG116 unconverted-init: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG116",
    slug="unconverted-init",
    title="A PiSSA, OLoRA, CorDA, LoRA-GA or LoftQ adapter that was never converted",
    summary=(
        "PiSSA, OLoRA, CorDA and LoRA-GA initialise the adapter from the base weights and "
        "subtract that start from them; LoftQ replaces them with a quantised residual. The "
        "adapter is only right on top of that rewritten base: on the original base model it "
        "serves garbage, without any error. PEFT converts such an adapter into a plain LoRA "
        "(of twice the rank) that serves on the original base when it is saved with "
        "`path_initial_model_for_weight_conversion`; a converted adapter says "
        "`init_lora_weights: true`."
    ),
    triggers=(
        "`init_lora_weights` in `adapter_config.json` is `pissa`, `pissa_niter_<n>`, "
        "`olora`, `corda`, `lora_ga` or `loftq`.",
    ),
    situations=(
        "`model.save_pretrained(out)` at the end of a PiSSA or OLoRA fine-tune, without "
        "`path_initial_model_for_weight_conversion`.",
        "A LoftQ adapter served on the unquantised base model.",
    ),
    fixes=(
        "Convert it: save the initial adapter right after get_peft_model "
        "(peft_model.peft_config['default'].init_lora_weights = True; "
        "peft_model.save_pretrained('init')), then save the trained one with "
        "save_pretrained(out, path_initial_model_for_weight_conversion='init'); serve the "
        "converted adapter (twice the rank) on the original base.",
        "If you serve it on the rewritten base model it was trained with (the residual "
        "model PiSSA/OLoRA/CorDA saved, or LoftQ's quantised base), it is right: ignore the "
        "code for that server (lora-guard check --ignore LG116).",
    ),
    example=(
        "# before: a PiSSA fine-tune saved as is\n"
        "peft_model.save_pretrained('out')                    # LG116\n"
        "# after: converted to a plain LoRA that serves on the original base\n"
        "peft_model.save_pretrained('out', path_initial_model_for_weight_conversion='init')\n"
    ),
    error="AdapterError",
    messages={
        "init": (
            "{subject}: initialised with {method} (init_lora_weights={value!r}) and never "
            "converted; {method} rewrote the base weights, so on the original base model "
            "it serves garbage."
        ),
    },
    raised_by=("lg.check_adapters", "lora-guard check"),
)
