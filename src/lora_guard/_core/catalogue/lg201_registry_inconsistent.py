"""LG201 registry-inconsistent: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG201",
    slug="registry-inconsistent",
    title="Adapter/slot bookkeeping disagrees with itself",
    summary=(
        "A pool keeps a map from adapter to slot and its inverse. When they stop being exact "
        "inverses, hold stale entries, or a batch needs more slots than exist, requests are "
        "served with another adapter's weights."
    ),
    triggers=(
        "`uid_to_slot` and `slot_to_uid` that are not inverse, a slot out of range, "
        "a batch with more adapters than slots, a config left behind by a failed load.",
    ),
    situations=(
        "An exception part-way through a load leaving the maps half updated.",
        "Eviction that updates one map and not the other.",
    ),
    fixes=(
        "Update both maps in one step, and undo both on failure; check with "
        "lora_guard.assert_slot_maps_consistent after each change.",
        "Bound a batch's adapters by the slot count before scheduling it.",
    ),
    example=(
        '# lg.assert_slot_maps_consistent raises:\n'
        "# LG201 registry-inconsistent: slot map: adapter 'sql' maps to slot 1, but slot 1\n"
        "# holds 'code'.\n"
        "# before\n"
        "uid_to_slot[uid] = slot            # slot_to_uid not updated\n"
        "# after\n"
        "uid_to_slot[uid] = slot; slot_to_uid[slot] = uid\n"
        "lg.assert_slot_maps_consistent(uid_to_slot, slot_to_uid, slots=S)\n"
    ),
    error="RegistryError",
    messages={
        "not-inverse": (
            "{subject}: adapter {uid!r} maps to slot {slot}, but slot {slot} holds {other}."
        ),
        "stale": "{subject}: slot {slot} holds {uid!r}, but {uid!r} maps to {mapped}.",
        "range": "{subject}: adapter {uid!r} maps to slot {slot}, outside 0..{last}.",
        "exhausted": "{subject}: {needed} adapters needed at once, but only {slots} slots.",
        "stale-config": "{subject}: {uid!r} is in {where} but not loaded.",
    },
    raised_by=("lg.assert_slot_maps_consistent", "integrations.sglang", "integrations.vllm"),
)
