"""Seed 002: sglang's pinned-weight store must never hand back a tensor of another shape or
dtype under a reused key. The pool below mirrors `LoRAMemoryPool._get_maybe_cached_weight_for_
transfer` (pinning replaced by a clone, since this machine has no CUDA)."""

from __future__ import annotations

import pickle

import pytest
import torch

import lora_guard as lg


def get_or_pin(
    self: LoRAMemoryPool, pinned_weight_store: dict[str, torch.Tensor], cache_key: str,
    weight: torch.Tensor,
) -> torch.Tensor:
    """The engine's body: get, or pin and store. Its own check would come too late."""
    cached = pinned_weight_store.get(cache_key)
    if cached is None:
        cached = self._pin(weight)
        pinned_weight_store[cache_key] = cached
    return cached


class LoRAMemoryPool:
    def __init__(self) -> None:
        self.pinned_weight_store: dict[str, torch.Tensor] = {}
        self.pins = 0

    def _pin(self, weight: torch.Tensor) -> torch.Tensor:
        self.pins += 1
        return weight.clone()

    _get_maybe_cached_weight_for_transfer = lg.guard_cache_lookup(
        store="pinned_weight_store", key="cache_key", weight="weight")(get_or_pin)

    def load_lora_weight_to_buffer(self, name: str, weight: torch.Tensor) -> torch.Tensor:
        key = f"{name}#tp0"  # the key scheme the seed shows: name plus suffixes, no shape
        return self._get_maybe_cached_weight_for_transfer(self.pinned_weight_store, key, weight)


class EvictingPool(LoRAMemoryPool):
    _get_maybe_cached_weight_for_transfer = lg.guard_cache_lookup(
        store="pinned_weight_store", key="cache_key", weight="weight",
        on_collision="evict")(get_or_pin)


NAME = "layers.0.self_attn.qkv_proj.lora_A"


def test_a_second_adapter_of_another_rank_under_one_key_is_refused() -> None:
    pool = LoRAMemoryPool()
    rank16 = torch.randn(48, 64)
    pool.load_lora_weight_to_buffer(NAME, rank16)
    stored = pool.pinned_weight_store[f"{NAME}#tp0"]

    with pytest.raises(lg.CacheKeyCollisionError) as info:
        pool.load_lora_weight_to_buffer(NAME, torch.randn(24, 64))

    err = info.value
    assert isinstance(err, ValueError) and err.code == "LG003"
    message = str(err)
    assert f"'{NAME}#tp0'" in message
    assert "shape (48, 64)" in message and "shape (24, 64)" in message
    assert "weight_cache_key" in err.hint
    assert pool.pinned_weight_store[f"{NAME}#tp0"] is stored and pool.pins == 1


def test_another_dtype_under_one_key_is_refused() -> None:
    pool = LoRAMemoryPool()
    pool.load_lora_weight_to_buffer(NAME, torch.randn(48, 64, dtype=torch.float16))
    with pytest.raises(lg.CacheKeyCollisionError, match="dtype float16.*dtype bfloat16"):
        pool.load_lora_weight_to_buffer(NAME, torch.randn(48, 64, dtype=torch.bfloat16))


def test_evict_serves_the_new_weight() -> None:
    pool = EvictingPool()
    pool.load_lora_weight_to_buffer(NAME, torch.randn(48, 64))
    new = torch.randn(24, 64)
    served = pool.load_lora_weight_to_buffer(NAME, new)
    assert served.shape == (24, 64) and torch.equal(served, new)
    assert pool.pins == 2


def test_the_same_weight_again_is_a_plain_hit() -> None:
    pool = LoRAMemoryPool()
    w = torch.randn(48, 64)
    first = pool.load_lora_weight_to_buffer(NAME, w)
    assert pool.load_lora_weight_to_buffer(NAME, torch.randn(48, 64)) is first
    assert pool.pins == 1


def test_guarded_cache_is_a_drop_in_dict() -> None:
    pool = LoRAMemoryPool()
    pool.pinned_weight_store = lg.GuardedCache(pool.pinned_weight_store)  # type: ignore[assignment]
    store = pool.pinned_weight_store
    assert isinstance(store, dict)
    store["k"] = torch.empty(48, 64)
    assert "k" in store and len(store) == 1 and list(store) == ["k"]
    assert store.get("k").shape == (48, 64) and store.get("missing") is None  # type: ignore[union-attr]

    with pytest.raises(lg.CacheKeyCollisionError):
        store["k"] = torch.empty(24, 64)
    assert store["k"].shape == (48, 64)  # nothing was stored

    store["k"] = torch.empty(48, 64)  # same shape and dtype: a legitimate refresh
    del store["k"]
    store["k"] = torch.empty(24, 64)  # after an explicit eviction, anything goes


def test_guarded_cache_update_is_all_or_nothing() -> None:
    store = lg.GuardedCache({"a": torch.empty(4, 4)})
    with pytest.raises(lg.CacheKeyCollisionError):
        store.update({"b": torch.empty(2), "a": torch.empty(8, 4)})
    assert set(store) == {"a"}


def test_guarded_cache_setdefault() -> None:
    store = lg.GuardedCache({})
    first = store.setdefault("k", torch.empty(4, 4))
    assert store.setdefault("k", torch.empty(4, 4)) is first
    with pytest.raises(lg.CacheKeyCollisionError):
        store.setdefault("k", torch.empty(2, 4))
    evicting = lg.GuardedCache({"k": torch.empty(4, 4)}, on_collision="evict")
    assert evicting.setdefault("k", torch.empty(2, 4)).shape == (2, 4)


def test_guarded_cache_evict_mode_replaces() -> None:
    store = lg.GuardedCache({}, on_collision="evict")
    store["k"] = torch.empty(48, 64)
    store["k"] = torch.empty(24, 64)
    assert store["k"].shape == (24, 64)


def test_guarded_cache_pickles_with_its_policy() -> None:
    store = lg.GuardedCache({"k": torch.empty(2, 2)}, on_collision="evict")
    copy = pickle.loads(pickle.dumps(store))
    assert copy.on_collision == "evict" and copy["k"].shape == (2, 2)


@pytest.mark.parametrize("bad", ["ignore", None, 1])
def test_on_collision_is_validated(bad: object) -> None:
    with pytest.raises(ValueError, match="'raise'.*'evict'"):
        lg.GuardedCache({}, on_collision=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'raise'.*'evict'"):
        lg.guard_cache_lookup(store="s", key="k", weight="w", on_collision=bad)  # type: ignore[arg-type]


def test_guarded_cache_needs_a_mapping() -> None:
    with pytest.raises(TypeError, match="wraps a mutable mapping"):
        lg.GuardedCache([])  # type: ignore[arg-type]


def test_weight_cache_key_cannot_collide_across_shape_or_dtype() -> None:
    a = lg.weight_cache_key(NAME, "tp0", weight=torch.empty(48, 64))
    b = lg.weight_cache_key(NAME, "tp0", weight=torch.empty(24, 64))
    c = lg.weight_cache_key(NAME, "tp0", weight=torch.empty(48, 64, dtype=torch.bfloat16))
    assert len({a, b, c}) == 3
    assert a == f"{NAME}#tp0[48x64:float32]"
    with pytest.raises(TypeError, match="needs a tensor"):
        lg.weight_cache_key(NAME, weight=[1, 2])
    with pytest.raises(TypeError, match="strings or ints"):
        lg.weight_cache_key(NAME, 1.5, weight=torch.empty(1))  # type: ignore[arg-type]


def test_the_fix_from_the_seed_keeps_both_weights() -> None:
    store = lg.GuardedCache({})
    for w in (torch.empty(48, 64), torch.empty(24, 64)):
        store[lg.weight_cache_key(NAME, "tp0", weight=w)] = w
    assert len(store) == 2


def test_cache_entry_matches_predicate() -> None:
    w = torch.empty(48, 64)
    assert lg.cache_entry_matches(torch.empty(48, 64), w)
    assert not lg.cache_entry_matches(torch.empty(24, 64), w)
    assert not lg.cache_entry_matches(None, w)


def test_a_guarded_cache_reads_through_the_store_and_still_refuses_a_collision() -> None:
    torch = pytest.importorskip("torch")
    store: dict[str, object] = {}
    cache = lg.GuardedCache(store)
    cache["k"] = torch.empty(4, 8)
    assert cache.get("k") is store["k"] and cache.get("missing", 1) == 1
    with pytest.raises(lg.CacheKeyCollisionError, match="LG003"):
        cache["k"] = torch.empty(2, 8)
    assert cache.get("k").shape == (4, 8) and isinstance(cache, dict)
