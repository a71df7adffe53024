"""LG301 rank-divergence: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG301",
    slug="rank-divergence",
    title="Tensor-parallel ranks disagree",
    summary=(
        "Every tensor-parallel rank must hold the same pool shapes, slot map and adapter "
        "set; otherwise ranks compute with different adapters and all-reduce garbage. "
        "Python hash seeds differ per process, so iteration order alone can diverge."
    ),
    triggers=("`assert_rank_consistent` finding a fingerprint that differs between ranks.",),
    situations=(
        "Slot order taken from a set or dict whose order depends on the hash seed.",
        "tp > kv heads making ranks allocate different buffer shapes.",
        "A load that failed on one rank only.",
    ),
    fixes=(
        "Derive slot order and pool shapes deterministically (sorted ids, shapes from the "
        "config, not the local shard), and load adapters on all ranks or none.",
        "When a rank does not answer: read the logs of the rank that died or hung, make "
        "every rank call the check at the same point, and restart the job; raise "
        "timeout=... only for ranks that are slow but healthy.",
    ),
    example=(
        '# lg.assert_rank_consistent raises, on every rank:\n'
        '# LG301 rank-divergence: slot map: ranks [1] differ from rank 0 at\n'
        "# state['uid_to_slot']['chat']: rank 1 has 0, rank 0 has 2.\n"
        "# before\n"
        "for slot, uid in enumerate(set(batch_uids)): ...\n"
        "# after\n"
        "for slot, uid in enumerate(sorted(batch_uids)): ...\n"
        "lg.assert_rank_consistent(pool_state)\n"
    ),
    error="RankDivergenceError",
    messages={
        "diverged": "{subject}: ranks {ranks} differ from rank {reference} at {path}: {diff}.",
        "timeout": "{subject}: no answer from ranks within {timeout} s ({problem}).",
        "protocol": (
            "{subject}: ranks {ranks} run another lora_guard release than rank {reference} "
            "({diff}); their checks cannot be compared: run one lora_guard release on "
            "every rank."
        ),
    },
    raised_by=("lg.assert_rank_consistent", "@lg.guard_rank_consistency"),
)
