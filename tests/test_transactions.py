"""A refused call leaves the guarded state exactly as it was.

First each guard on its own (LG001/LG004 from ``@lg.shapes``, LG002 from the registry and its
loader decorator, LG003 from the cache proxy and the lookup decorator); then Hypothesis runs
sequences of load, unload, swap, resize, rebuild and lookup against a small pool built the way
an engine's LoRA memory pool is, and after every refused operation compares the whole pool
bit for bit with its state before the call.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import lora_guard as lg

# These tests provoke violations on purpose: under `pytest --lora-guard` they are expected.
pytestmark = pytest.mark.lora_guard(allow=tuple(lg.INVARIANTS))

H = 16  # hidden size of the tiny pool
SEQUENCES = 500
"""Operation sequences per CI run; docs/reliability.md quotes this number."""
MAX_OPS = 25


def _bits(t: torch.Tensor) -> tuple[Any, ...]:
    return (tuple(t.shape), str(t.dtype), t.detach().cpu().contiguous().view(torch.uint8)
            .numpy().tobytes())


def moe_entries(layout: str | None, rank: int) -> dict[str, tuple[int, ...]]:
    """Shape-only MoE weights that decide the adapter's layout for the registry."""
    p = "layers.0.mlp.experts"
    if layout is None:
        return {}
    if layout == "flat":
        return {f"{p}.base_layer.lora_A.weight": (rank * 4, H)}
    outer = 1 if layout == "shared-outer" else 4
    return {f"{p}.gate_up_proj.lora_A": (outer, 2 * rank, H),
            f"{p}.down_proj.lora_B": (outer, H, rank)}


# --- the pool --------------------------------------------------------------------------------


class LoRAPool:
    """A slot pool as engines build it: buffers frozen at first allocation, adapters placed in
    slots, weights pinned in a store keyed by slot (the seed-002 key scheme), MoE layouts kept
    uniform. Each operation checks with the guards first and undoes its own earlier steps
    when a later guard refuses."""

    def __init__(self, slots: int = 3, max_rank: int = 8) -> None:
        self.registry = lg.LayoutRegistry()
        self.pinned = lg.GuardedCache({})
        self.uid_to_slot: dict[str, int] = {}
        self.slot_to_uid: list[str | None] = []
        self.a_buffer = torch.zeros(0)
        self.b_buffer = torch.zeros(0)
        self.load = lg.guard_adapter_load(self.registry, adapter_id="uid",
                                          weights="weights")(self._load)
        self.set_buffers(torch.zeros(slots, max_rank, H), torch.zeros(slots, H, max_rank))

    @lg.shapes(a="slots rank hidden", b="slots hidden rank", frozen=("slots", "rank", "hidden"),
               same_dtype=True)
    def set_buffers(self, a: torch.Tensor, b: torch.Tensor) -> None:
        self.a_buffer, self.b_buffer = a, b
        if len(self.slot_to_uid) != a.shape[0]:  # a first allocation or a rebuild
            self.slot_to_uid = [None] * a.shape[0]

    @lg.shapes(a="rank hidden", b="hidden rank")
    def _write_slot(self, slot: int, a: torch.Tensor, b: torch.Tensor) -> None:
        if a.shape[0] > self.a_buffer.shape[1]:
            raise ValueError(f"rank {a.shape[0]} above the pool's {self.a_buffer.shape[1]}")
        self.a_buffer[slot].zero_()
        self.b_buffer[slot].zero_()
        self.a_buffer[slot, : a.shape[0]] = a
        self.b_buffer[slot, :, : b.shape[1]] = b

    def _pin(self, slot: int, a: torch.Tensor, b: torch.Tensor) -> dict[str, Any]:
        """Pin both halves; returns what to put back to undo it."""
        keys = {f"q_proj.lora_A#slot{slot}": a.clone(), f"q_proj.lora_B#slot{slot}": b.clone()}
        before = {k: self.pinned.get(k) for k in keys}
        self.pinned.update(keys)  # all or nothing: LG003 stores none of them
        return before

    def _unpin(self, before: dict[str, Any]) -> None:
        for key, value in before.items():
            if value is None:
                self.pinned.__wrapped__.pop(key, None)
            else:
                self.pinned.__wrapped__[key] = value

    def _load(self, uid: str, weights: dict[str, Any], *, slot: int | None = None) -> None:
        swap = slot is not None
        if not swap:
            if uid in self.uid_to_slot:
                raise ValueError(f"{uid} is loaded already")
            free = [s for s, u in enumerate(self.slot_to_uid) if u is None]
            if not free:
                raise RuntimeError("no free slot")
            slot = free[0]
        assert slot is not None
        a, b = weights["q_proj.lora_A.weight"], weights["q_proj.lora_B.weight"]
        before = self._pin(slot, a, b)
        old = (self.a_buffer[slot].clone(), self.b_buffer[slot].clone())
        try:
            self._write_slot(slot, a, b)
        except BaseException:
            self._unpin(before)
            self.a_buffer[slot], self.b_buffer[slot] = old
            raise
        self.uid_to_slot[uid] = slot
        self.slot_to_uid[slot] = uid

    def swap(self, uid: str, weights: dict[str, Any]) -> None:
        if uid not in self.uid_to_slot:
            raise KeyError(uid)
        self.load(uid, weights, slot=self.uid_to_slot[uid])

    def unload(self, uid: str) -> None:
        slot = self.uid_to_slot.pop(uid)
        self.slot_to_uid[slot] = None
        self.registry.release(uid)
        self.a_buffer[slot].zero_()
        self.b_buffer[slot].zero_()

    def resize(self, slots: int, max_rank: int, *, rebuild: bool) -> None:
        if rebuild:
            if self.uid_to_slot:
                raise RuntimeError("unload every adapter before a rebuild")
            lg.unfreeze(self)
        a, b = torch.zeros(slots, max_rank, H), torch.zeros(slots, H, max_rank)
        if a.shape == self.a_buffer.shape:  # a reallocation in place keeps what is loaded
            a.copy_(self.a_buffer)
            b.copy_(self.b_buffer)
        self.set_buffers(a, b)

    @lg.guard_cache_lookup(store="pinned_weight_store", key="cache_key", weight="weight")
    def lookup(self, pinned_weight_store: Any, cache_key: str, weight: torch.Tensor
               ) -> torch.Tensor:
        cached = pinned_weight_store.get(cache_key)
        if cached is None:
            pinned_weight_store[cache_key] = cached = weight.clone()
        return cached  # type: ignore[no-any-return]

    def snapshot(self) -> dict[str, Any]:
        """Everything a guard protects, bit for bit."""
        return {
            "uid_to_slot": dict(self.uid_to_slot),
            "slot_to_uid": list(self.slot_to_uid),
            "registry": self.registry.adapters,
            "layout": self.registry.layout,
            "frozen": lg.frozen_dims(self),
            "pinned": {k: _bits(v) for k, v in self.pinned.items()},
            "a": _bits(self.a_buffer),
            "b": _bits(self.b_buffer),
        }

    def check_invariants(self) -> None:
        lg.assert_slot_maps_consistent(self.uid_to_slot, self.slot_to_uid)
        assert set(self.registry.adapters) == set(self.uid_to_slot)
        layouts = {v for v in self.registry.adapters.values() if v is not None}
        assert len(layouts) <= 1


def adapter(rank: int, layout: str | None, seed: int, *, bad: bool = False) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(rank, H, generator=g)
    b = torch.randn(H, rank + 1 if bad else rank, generator=g)  # bad: B's rank disagrees
    return {"q_proj.lora_A.weight": a, "q_proj.lora_B.weight": b, **moe_entries(layout, rank)}


# --- each guard on its own ---------------------------------------------------------------------


def test_a_refused_shapes_call_runs_no_body_and_keeps_the_frozen_dims() -> None:
    pool = LoRAPool()
    before = pool.snapshot()
    with pytest.raises(lg.PoolShapeDriftError):  # LG001: another max rank
        pool.set_buffers(torch.ones(3, 16, H), torch.ones(3, H, 16))
    with pytest.raises(lg.ShapeContractError):  # LG004: A and B disagree
        pool.set_buffers(torch.ones(3, 8, H), torch.ones(3, H, 4))
    assert pool.snapshot() == before


def test_a_first_call_whose_body_fails_freezes_nothing() -> None:
    class Sink:
        @lg.shapes(a="slots rank", frozen=("slots", "rank"))
        def allocate(self, a: torch.Tensor) -> None:
            raise MemoryError("CUDA out of memory")

    sink = Sink()
    with pytest.raises(MemoryError):
        sink.allocate(torch.empty(4, 16))
    assert lg.frozen_dims(sink) == {}


def test_a_refused_admission_leaves_the_registry_and_the_loader_untouched() -> None:
    registry = lg.LayoutRegistry()
    calls: list[str] = []

    @lg.guard_adapter_load(registry, adapter_id="uid", weights="weights")
    def load(uid: str, weights: dict[str, Any]) -> None:
        calls.append(uid)

    load("math", moe_entries("shared-outer", 8))
    before = (registry.adapters, registry.layout)
    with pytest.raises(lg.MixedMoELayoutError):
        load("code", moe_entries("per-expert", 8))
    with pytest.raises(lg.MixedMoELayoutError):
        registry.admit("code", moe_entries("per-expert", 8))
    assert (registry.adapters, registry.layout) == before
    assert calls == ["math"]


def test_a_reload_whose_loader_fails_keeps_the_old_admission() -> None:
    """The only MoE adapter is reloaded with another layout and the load fails: the registry
    must still say what the pool really holds, the old layout."""
    registry = lg.LayoutRegistry()

    @lg.guard_adapter_load(registry, adapter_id="uid", weights="weights")
    def load(uid: str, weights: dict[str, Any], fail: bool = False) -> None:
        if fail:
            raise OSError("disk full")

    load("math", moe_entries("shared-outer", 8))
    with pytest.raises(OSError):
        load("math", moe_entries("per-expert", 8), fail=True)
    assert registry.adapters == {"math": lg.MoELayout.SHARED_OUTER}
    with pytest.raises(lg.MixedMoELayoutError):  # so a per-expert newcomer is still refused
        registry.admit("code", moe_entries("per-expert", 8))


def test_a_refused_cache_store_changes_no_entry() -> None:
    store = lg.GuardedCache({"k": torch.ones(8, H), "j": torch.ones(4)})
    before = {k: _bits(v) for k, v in store.items()}
    with pytest.raises(lg.CacheKeyCollisionError):
        store["k"] = torch.zeros(4, H)
    with pytest.raises(lg.CacheKeyCollisionError):
        store.setdefault("k", torch.zeros(8, H, dtype=torch.float16))
    with pytest.raises(lg.CacheKeyCollisionError):  # one bad entry: none of them is stored
        store.update({"new": torch.zeros(2), "j": torch.zeros(5)})
    assert {k: _bits(v) for k, v in store.items()} == before


def test_a_refused_lookup_runs_no_body_and_changes_no_entry() -> None:
    pool = LoRAPool()
    store: dict[str, torch.Tensor] = {}
    pool.lookup(store, "q#tp0", torch.ones(8, H))
    before = {k: _bits(v) for k, v in store.items()}
    with pytest.raises(lg.CacheKeyCollisionError):
        pool.lookup(store, "q#tp0", torch.ones(4, H))
    assert {k: _bits(v) for k, v in store.items()} == before


# --- operation sequences ---------------------------------------------------------------------

UIDS = ("math", "code", "chat", "sql")
ranks = st.sampled_from([2, 4, 8, 16])
layouts = st.sampled_from([None, None, "shared-outer", "per-expert", "flat"])
operations = st.one_of(
    st.tuples(st.just("load"), st.sampled_from(UIDS), ranks, layouts, st.integers(0, 99),
              st.booleans()),
    st.tuples(st.just("swap"), st.sampled_from(UIDS), ranks, layouts, st.integers(0, 99),
              st.booleans()),
    st.tuples(st.just("unload"), st.sampled_from(UIDS)),
    st.tuples(st.just("resize"), st.integers(2, 4), st.sampled_from([4, 8, 16]), st.booleans()),
    st.tuples(st.just("lookup"), st.sampled_from(UIDS), ranks),
)


def apply(pool: LoRAPool, op: tuple[Any, ...]) -> None:
    kind = op[0]
    if kind in ("load", "swap"):
        _, uid, rank, layout, seed, bad = op
        weights = adapter(rank, layout, seed, bad=bad and seed % 4 == 0)
        (pool.load if kind == "load" else pool.swap)(uid, weights)
    elif kind == "unload":
        pool.unload(op[1])
    elif kind == "resize":
        _, slots, max_rank, rebuild = op
        pool.resize(slots, max_rank, rebuild=rebuild)
    else:
        _, uid, rank = op
        pool.lookup(pool.pinned, f"q_proj.lora_A#{uid}", torch.ones(rank, H))


@settings(max_examples=SEQUENCES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(operations, min_size=1, max_size=MAX_OPS))
def test_every_refused_operation_leaves_the_pool_bit_for_bit_unchanged(
        ops: list[tuple[Any, ...]]) -> None:
    pool = LoRAPool()
    for op in ops:
        before = pool.snapshot()
        try:
            apply(pool, op)
        except lg.LoRAGuardError as err:
            event(f"{op[0]} refused with {err.code}")
            assert pool.snapshot() == before, f"{op} was refused but changed the pool"
        except (ValueError, RuntimeError, KeyError) as exc:  # the pool's own refusals
            assert not lg.is_lora_guard_error(exc)
            assert pool.snapshot() == before, f"{op} failed but changed the pool"
        pool.check_invariants()


def test_the_reliability_page_quotes_these_counts() -> None:
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "reliability.md").read_text("utf-8")
    assert f"{SEQUENCES} operation sequences per CI run" in page
    assert f"{SEQUENCES} sequences of up to {MAX_OPS} operations" in page
