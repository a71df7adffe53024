"""LG101 rank-exceeds-limit: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG101",
    slug="rank-exceeds-limit",
    title="Adapter rank above the served max rank, or not an allowed rank",
    summary=(
        "A server allocates its LoRA pool for a max rank. An adapter whose `r`, or any "
        "`rank_pattern` value, is above it cannot be loaded (vLLM raises at load time) or "
        "would be truncated; an engine that only serves some ranks refuses the others."
    ),
    triggers=(
        "`r` or a `rank_pattern` value above `ServingLimits.max_rank`.",
        "A rank not in `ServingLimits.allowed_ranks`.",
    ),
    situations=(
        "A new fine-tune trained at r=64 uploaded to a server started with max rank 16.",
        "`rank_pattern` raising one module's rank above the others.",
    ),
    fixes=(
        "Start the server with a max rank at least the adapter's (vLLM --max-lora-rank, "
        "sglang --max-lora-rank), or retrain/compress the adapter to a served rank.",
        "Reduce the adapter's rank with an SVD truncation before serving it.",
        "Retrain (or SVD-truncate) the adapter to one of the ranks the server serves, or add "
        "its rank to them (lora-guard check --allowed-ranks, ServingLimits(allowed_ranks=...)"
        "); a rank under the max rank is not enough when only some ranks are served.",
    ),
    variant_fixes={"allowed": 2},
    example=(
        "# before: max_rank 16, adapter r=64\n"
        "lora-guard check ./adapters --max-rank 16      # LG101\n"
        "# after\n"
        "lora-guard check ./adapters --max-rank 64\n"
    ),
    error="AdapterError",
    messages={
        "max": "{subject}: rank {rank} of {module} is above the served max rank {max_rank}.",
        "allowed": (
            "{subject}: rank {rank} of {module} is not one of the served ranks {allowed}."
        ),
    },
    raised_by=("lg.check_adapters", "lora-guard check", "integrations.vllm",
               "integrations.sglang", "integrations.peft"),
)
