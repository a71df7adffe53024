"""LG111 packed-rank-mismatch: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG111",
    slug="packed-rank-mismatch",
    title="Ranks that differ within one packed module",
    summary=(
        "Engines that stack q/k/v into one `qkv_proj` buffer (and gate/up into "
        "`gate_up_proj`) hold one rank per packed module. An adapter whose `rank_pattern` "
        "gives the parts of one packed module different ranks cannot be stacked: sglang "
        "refuses it when it loads the weights."
    ),
    triggers=(
        "`lora-guard check --engine sglang` of an adapter whose `rank_pattern` gives "
        "`q_proj`, `k_proj` and `v_proj` (or `gate_proj` and `up_proj`) of one layer "
        "different ranks.",
    ),
    situations=("A `rank_pattern` tuned per projection, e.g. `{\"k_proj\": 4}` with r=8.",),
    fixes=(
        "Give the parts of each packed module one rank (retrain with a rank_pattern keyed "
        "on whole layers, or no rank_pattern), or serve the adapter with an engine that "
        "keeps the parts apart (vLLM, PEFT).",
        "Give the experts of each MoE projection one rank (retrain without a per-expert "
        "rank_pattern), or serve the adapter with PEFT.",
    ),
    example=(
        '# lora-guard check says:\n# LG111 packed-rank-mismatch: qkv_proj of model.layers.'
        '0.self_attn stacks k_proj, q_proj, v_proj of ranks k_proj=16, q_proj=8, v_proj=8'
        '; sglang==0.5.23 holds one rank per packed module and refuses it.\n'
        "# before\nLoraConfig(r=8, target_modules=[\"q_proj\", \"k_proj\", \"v_proj\"],\n"
        "           rank_pattern={\"k_proj\": 4})\n"
        "# after\nLoraConfig(r=8, target_modules=[\"q_proj\", \"k_proj\", \"v_proj\"])\n"
    ),
    error="AdapterError",
    messages={
        "packed": (
            "{subject}: {packed} of {layer} stacks {parts} of ranks {ranks}; {engine} holds "
            "one rank per packed module and refuses it."
        ),
        "experts": (
            "{subject}: the experts of {packed} have different ranks ({ranks}); {engine} "
            "packs one rank per MoE projection and refuses it."
        ),
    },
    raised_by=("lg.check_adapters", "lora-guard check"),
    variant_fixes={"experts": 1},
)
