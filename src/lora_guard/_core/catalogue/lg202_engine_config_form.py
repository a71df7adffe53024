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
        "`target_modules` is a string other than `all` or `all-linear`.",
    ),
    situations=(
        "An adapter trained with a regex `target_modules`, served on sglang.",
    ),
    fixes=(
        "Re-save the adapter's config with `target_modules` as the list of module names "
        "it trained (the leaf names of its weight keys, e.g. [\"q_proj\", \"v_proj\"]).",
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
    },
    raised_by=("integrations.sglang", "lora-guard check --engine sglang"),
)
