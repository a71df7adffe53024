"""LG110 too-many-adapters: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG110",
    slug="too-many-adapters",
    title="More adapters than the served slot count",
    summary=(
        "A server has a fixed number of adapter slots (vLLM max_loras, sglang "
        "max_loras_per_batch). A set, or a batch, that needs more adapters than slots "
        "cannot be served together: sglang's scheduler once died on an assert for it."
    ),
    triggers=("`check_adapters` of more adapters than `ServingLimits.max_loras`.",),
    situations=("A batch that mixes requests for more adapters than the pool holds.",),
    fixes=(
        "Raise the slot count (vLLM --max-loras, sglang --max-loras-per-batch) or split the "
        "adapters over servers.",
        "Raise the engine's limit on loaded adapters (sglang --max-loaded-loras) or split "
        "the adapters over servers.",
    ),
    example="lora-guard check ./adapters --max-loras 8   # LG110 with 9 adapters\n",
    error="AdapterError",
    messages={
        "count": "{subject}: {count} adapters, but the server has {max_loras} slots.",
        "loaded": (
            "{subject}: {count} adapters to hold loaded, but {engine} holds at most "
            "{limit} (--max-loaded-loras) and refuses to load more; "
            "--max-loras-per-batch ({per_batch}) is per batch, not a limit on the set."
        ),
    },
    variant_fixes={"loaded": 1},
    raised_by=("lg.check_adapters", "lora-guard check"),
)
