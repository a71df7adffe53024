"""LG202 engine-config-form: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG202",
    slug="engine-config-form",
    title="An adapter config the engine reads in another form than PEFT wrote it",
    summary=(
        "PEFT accepts forms of `adapter_config.json` that a serving engine reads "
        "differently or not at all. sglang 0.5.23 takes `target_modules` only as a list of "
        "module names or the strings `all` / `all-linear`: a regex string (PEFT's "
        "`target_modules=r'.*\\.(q_proj|v_proj)'`) fails the load, at start-up it stops "
        "the server. lora_guard says so before the engine reads a tensor, with the form "
        "the engine takes."
    ),
    triggers=(
        "sglang (the integration, and `lora-guard check --engine sglang`): "
        "`target_modules` is a string other than `all` or `all-linear`, or null.",
        "lmdeploy (`lora-guard check --engine lmdeploy`, the integration): a key of "
        "`adapter_config.json` that PEFT 0.14 (lmdeploy's pinned peft) does not know, which "
        "every config saved by PEFT 0.15 or newer has (`peft_version`, "
        "`trainable_token_indices`...): PEFT 0.14 drops the config to its defaults and the "
        "start-up fails; `target_modules` as any string or null; two `target_modules` entries "
        "naming one module lmdeploy does not pack (`o_proj`, `down_proj`).",
        "PEFT (`--engine peft`, the integration): `layers_to_transform` that is neither an "
        "integer nor a list (a string, a float, an object), which fails the load with a "
        "TypeError; `layers_to_transform` or `layers_pattern` beside a regex string "
        "`target_modules`, or `layers_pattern` without `layers_to_transform`, which "
        "`LoraConfig` refuses.",
    ),
    situations=(
        "An adapter trained with a regex `target_modules`, served on sglang.",
        "A config written by hand or by a converter with `\"target_modules\": null` (vLLM "
        "reads the weights' names and serves it; sglang and lmdeploy fail the load).",
        "An adapter trained with a current PEFT, or with `target_modules=\"all-linear\"`, "
        "served on lmdeploy.",
    ),
    fixes=(
        "Re-save the adapter's config with `target_modules` as the list of module names "
        "it trained (the leaf names of its weight keys, e.g. [\"q_proj\", \"v_proj\"]).",
        "For lmdeploy, keep only the keys PEFT 0.14 knows in adapter_config.json (drop "
        "peft_version and the other newer keys, each at its default), or save the adapter "
        "with peft 0.14.",
        "For lmdeploy, give each module once in target_modules, by its leaf name "
        "([\"o_proj\", \"down_proj\"], not one full path per layer).",
        "Write layers_to_transform as a list of layer indices ([0, 1, 2]) or null, with "
        "target_modules as a list of module names, and layers_pattern only beside "
        "layers_to_transform.",
    ),
    example=(
        "# before: adapter_config.json {\"target_modules\": \".*\\\\.(q_proj|v_proj)\"}"
        "   # LG202 on sglang\n"
        "# after:  adapter_config.json {\"target_modules\": [\"q_proj\", \"v_proj\"]}\n"
    ),
    error="AdapterError",
    messages={
        "target-string": (
            "{subject}: target_modules is the string {value!r}; {engine} reads "
            "target_modules only as a list of module names or 'all' / 'all-linear'."
        ),
        "target-none": (
            "{subject}: target_modules is {value}; {engine} reads target_modules as a list "
            "of module names for every adapter it loads, and the load fails."
        ),
        "target-string-any": (
            "{subject}: target_modules is the string {value!r}; {engine} reads "
            "target_modules as a set of module names, so a string is read letter by letter "
            "and the start-up fails."
        ),
        "repeated-target": (
            "{subject}: target_modules names {module} twice ({first!r}, {second!r}); {engine} "
            "finds the first one's LoRA module by that name and the start-up fails."
        ),
        "unknown-keys": (
            "{subject}: adapter_config.json has keys PEFT 0.14 does not know ({keys}); "
            "{engine} reads configs with its pinned peft<=0.14.0, which then drops r, "
            "lora_alpha and target_modules to their defaults, and the start-up fails."
        ),
        "layers-form": (
            "{subject}: layers_to_transform is {value}, neither an integer nor a list of "
            "layer indices; {engine} fails on it when it puts LoRA on the model (TypeError)."
        ),
        "layers-refused": (
            "{subject}: {problem}; {engine}'s LoraConfig refuses the config and the load "
            "fails."
        ),
    },
    variant_fixes={"unknown-keys": 1, "repeated-target": 2, "layers-form": 3,
                   "layers-refused": 3},
    raised_by=("integrations.sglang", "lora-guard check --engine sglang",
               "integrations.lmdeploy", "lora-guard check --engine lmdeploy",
               "integrations.peft", "lora-guard check --engine peft"),
)
