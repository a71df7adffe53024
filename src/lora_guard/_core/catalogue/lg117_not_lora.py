"""LG117 not-lora: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG117",
    slug="not-lora",
    title="A PEFT method other than LoRA",
    summary=(
        "LoHa, LoKr, IA3, VeRA, AdaLoRA, OFT, BOFT, prompt tuning and the other PEFT methods "
        "save weights that are not LoRA's A and B matrices (Hadamard or Kronecker factors, "
        "scaling vectors, rotations, prompts). A LoRA server cannot serve them: it refuses "
        "them or, where it reads the keys it knows, serves something else."
    ),
    triggers=(
        "`peft_type` in `adapter_config.json` names another PEFT method (`LOHA`, `IA3`, any "
        "word but LoRA's in some case): on every engine.",
        "`peft_type` is LoRA's, spelled as the engine does not read it: anything but exactly "
        "`LORA` (a missing field too) for PEFT, lmdeploy and `lora-guard check` without "
        "`--engine`; not a string whose lower case is `lora` (`LORA ` with a space, null, a "
        "missing field) for sglang. vLLM does not read `peft_type`: every spelling of LoRA "
        "serves there.",
    ),
    situations=(
        "An IA3 or LoHa fine-tune uploaded to a vLLM or sglang LoRA endpoint.",
        "An AdaLoRA adapter (it has lora_A/lora_B, but also lora_E and a budget of ranks).",
        "A config written by hand or by a converter with `\"peft_type\": \"lora\"` or no "
        "`peft_type`: vLLM serves it, sglang takes `lora` but not a missing field, PEFT "
        "(`KeyError: 'lora'`) and lmdeploy refuse both.",
    ),
    fixes=(
        "Serve it with PEFT (PeftModel.from_pretrained), or merge it into the base model "
        "(merge_and_unload) and serve the merged model; or retrain with LoraConfig.",
        "Write `\"peft_type\": \"LORA\"` in adapter_config.json, as PEFT saves it: every "
        "engine reads that spelling.",
    ),
    example=(
        "# before: IA3Config(...)                 # LG117: serves LoRA only\n"
        "# after\n"
        "LoraConfig(r=16, target_modules=['q_proj', 'v_proj'])\n"
    ),
    error="AdapterError",
    messages={
        "method": (
            "{subject}: {file}: peft_type {peft_type!r} is {method}, another PEFT method "
            "than LoRA; the server serves LoRA only."
        ),
        "spelling": (
            "{subject}: {file}: {found}; {engine} reads LoRA's peft_type {reads}, so it "
            "refuses the adapter at load."
        ),
    },
    variant_fixes={"spelling": 1},
    raised_by=("lg.check_adapters", "lora-guard check", "lg.inspect_adapter",
               "integrations.vllm", "integrations.sglang", "integrations.lmdeploy",
               "integrations.peft"),
)
