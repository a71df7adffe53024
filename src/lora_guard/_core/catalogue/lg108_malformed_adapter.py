"""LG108 malformed-adapter: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG108",
    slug="malformed-adapter",
    title="An adapter that cannot be read safely",
    summary=(
        "Adapters are files users upload. lora_guard reads `adapter_config.json` and the "
        "safetensors header only, with strict limits, and never unpickles. A file that is "
        "unreadable, invalid, oversized, inconsistent with itself, pickled or outside the "
        "adapter folder is refused with the reason."
    ),
    triggers=(
        "A missing, unreadable or invalid `adapter_config.json`.",
        "A safetensors file with a truncated, oversized or invalid header, offsets that "
        "overlap, leave gaps or point past the file, unknown dtypes or bad shapes.",
        "A pickle `adapter_model.bin` (never unpickled).",
        "A symlink that leads out of the adapter folder.",
        "A remote store that answers with what is never followed or read: a listed path "
        "out of its folder (`..`, absolute, encoded), a listing page linking to another "
        "host, a page or a body past its size cap.",
    ),
    situations=(
        "An interrupted upload or copy; an adapter saved by an old PEFT as .bin.",
        "A hostile upload.",
    ),
    fixes=(
        "Re-save the adapter with a current PEFT (save_pretrained writes "
        "adapter_config.json and adapter_model.safetensors).",
        "Convert a .bin adapter to safetensors in a trusted environment.",
        "Copy the adapter again; check the upload was complete.",
        "Check the path: name an adapter folder (holding adapter_config.json and "
        "adapter_model.safetensors) or a folder of such folders.",
        "Keep the adapter's files inside its folder (copy them instead of linking out); a "
        "symlinked adapter folder found by a search is checked when you name it explicitly.",
        "Check that the endpoint is the store you meant (the URL, HF_ENDPOINT, "
        "AWS_ENDPOINT_URL_S3) and report the reply to its operator: a store that lists "
        "paths out of their folder or links to another host is not read, and no credential "
        "was sent there.",
    ),
    example=(
        '# lora-guard check says:\n# LG108 malformed-adapter: adapter_model.safetensors: h'
        'eader length 1016 bytes runs past the end of the file (516 bytes); the file is t'
        'runcated.\n'
        "# a pickle .bin adapter instead: convert a trusted one once, offline\n"
        "sd = torch.load('adapter_model.bin', weights_only=True)\n"
        "safetensors.torch.save_file(sd, 'adapter_model.safetensors')\n"
    ),
    error="AdapterError",
    messages={
        "malformed": "{subject}: {file}: {problem}.",
        "not-found": "{subject}: {file}: {problem}.",
        "pickle": "{subject}: {file}: {problem}.",
        "link": "{subject}: {file}: {problem}.",
        "untrusted": "{subject}: {file}: {problem}.",
    },
    variant_fixes={"not-found": 3, "pickle": 1, "link": 4, "untrusted": 5},
    raised_by=("lg.inspect_adapter", "lg.check_adapters", "lora-guard check",
               "integrations.vllm", "integrations.sglang", "integrations.peft"),
)
