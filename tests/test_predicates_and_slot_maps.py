"""Plain predicates for custom servers, and LG201 slot-map checks as sglang keeps them."""

from __future__ import annotations

import pytest
import torch

import lora_guard as lg

EMPTY_SLOT = object()  # sglang marks free slots with a sentinel; None is the base model's uid


class Sink:
    def __init__(self) -> None:
        self._w1_delta: torch.Tensor | None = None

    @lg.shapes(a="slots rank hidden", frozen=("slots", "rank"))
    def set_lora_info(self, a: torch.Tensor) -> None:
        if self._w1_delta is None:
            self._w1_delta = torch.empty(a.shape[0], 2 * a.shape[1], device="meta")


def test_pool_shapes_stable_by_frozen_dims_and_by_attribute() -> None:
    sink = Sink()
    assert lg.pool_shapes_stable(sink, {"rank": 16, "_w1_delta": (4, 32)})  # nothing yet
    sink.set_lora_info(torch.empty(4, 16, 64, device="meta"))
    assert lg.pool_shapes_stable(sink, {"slots": 4, "rank": 16})
    assert lg.pool_shapes_stable(sink, {"_w1_delta": (4, 32)})
    assert not lg.pool_shapes_stable(sink, {"rank": 8})
    assert not lg.pool_shapes_stable(sink, {"_w1_delta": (4, 16)})


def test_shapes_conform_predicate_raises_nothing() -> None:
    specs = {"a": "slots 2*rank hidden", "b": "slots hidden rank"}
    a, b = torch.empty(4, 32, 64, device="meta"), torch.empty(4, 64, 16, device="meta")
    assert lg.shapes_conform(specs, {"a": a, "b": b})
    assert not lg.shapes_conform(specs, {"a": a, "b": torch.empty(4, 64, 8, device="meta")})
    assert not lg.shapes_conform(specs, {"a": a, "b": b}, where=lambda d: d["rank"] > 16)


def test_sglang_slot_maps_after_prepare_lora_batch() -> None:
    uid_to_buffer_id = {None: 0, "math": 1, "code": 2}
    buffer_id_to_uid = [None, "math", "code", EMPTY_SLOT]
    lg.assert_slot_maps_consistent(uid_to_buffer_id, buffer_id_to_uid, empty=EMPTY_SLOT)
    assert lg.slot_maps_consistent(uid_to_buffer_id, buffer_id_to_uid, empty=EMPTY_SLOT)


def test_an_eviction_that_updated_one_map_only() -> None:
    uid_to_buffer_id = {"math": 1, "sql": 2}
    buffer_id_to_uid = [EMPTY_SLOT, "math", "code", EMPTY_SLOT]  # 'code' evicted from one map
    with pytest.raises(lg.RegistryError) as info:
        lg.assert_slot_maps_consistent(uid_to_buffer_id, buffer_id_to_uid, empty=EMPTY_SLOT,
                                       subject="LoRAMemoryPool")
    err = info.value
    assert isinstance(err, RuntimeError) and err.code == "LG201"
    messages = [v.message for v in err.violations]
    assert "LoRAMemoryPool: adapter 'sql' maps to slot 2, but slot 2 holds 'code'." in messages
    assert "LoRAMemoryPool: slot 2 holds 'code', but 'code' maps to no slot." in messages


@pytest.mark.lora_guard(expect=["LG201"], reason="five adapters for four slots, in record mode")
def test_slots_out_of_range_and_exhaustion() -> None:
    with pytest.raises(lg.RegistryError, match="outside 0..3"):
        lg.assert_slot_maps_consistent({"a": 4}, {}, slots=4)
    lg.configure(mode="record")
    with lg.recording() as rec:
        lg.assert_slot_maps_consistent({f"a{i}": i for i in range(5)},
                                       {i: f"a{i}" for i in range(5)}, slots=4)
    assert "5 adapters needed at once, but only 4 slots" in rec.violations[-1].message


def test_the_old_name_check_slot_maps_still_raises_and_names_the_new_one() -> None:
    """``check_*`` functions return a report; the slot-map one raised, so it was renamed."""
    with pytest.warns(DeprecationWarning, match="assert_slot_maps_consistent"), \
            pytest.raises(lg.RegistryError, match="LG201"):
        lg.check_slot_maps({"a": 0}, ["b"])


def test_one_adapter_in_two_slots() -> None:
    assert not lg.slot_maps_consistent({"a": 0}, ["a", "a"])
