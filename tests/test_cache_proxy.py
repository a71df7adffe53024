"""`lg.GuardedCache` is a drop-in for the store it wraps: the engine code that holds the store
keeps using it as its dict, OrderedDict, defaultdict or own mapping class, and sees every write
made through the proxy; only a store of another shape or dtype under a used key is refused."""

from __future__ import annotations

import copy
import pickle
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import pytest
import torch

import lora_guard as lg

Q_A = "layers.0.self_attn.q_proj.lora_A#tp0"
V_A = "layers.0.self_attn.v_proj.lora_A#tp0"


def rank(r: int) -> torch.Tensor:
    """A LoRA A weight of rank ``r`` for a 64-wide model."""
    return torch.empty(r, 64)


class PinnedStore(MutableMapping[str, torch.Tensor]):
    """A server's own store class: a mapping with a byte budget and a method of its own."""

    def __init__(self, budget: int) -> None:
        self.entries: dict[str, torch.Tensor] = {}
        self.budget = budget

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.entries[key]

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        self.entries[key] = value

    def __delitem__(self, key: str) -> None:
        del self.entries[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def pinned_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.entries.values())


def test_the_proxy_passes_for_its_store_type() -> None:
    stores: list[MutableMapping[str, Any]] = [
        {}, OrderedDict(), defaultdict(list), PinnedStore(budget=1 << 20)]
    for store in stores:
        cache = lg.GuardedCache(store)
        assert isinstance(cache, type(store)) and isinstance(cache, MutableMapping)
        assert isinstance(cache, lg.GuardedCache)
        assert cache.__class__ is type(store)
    assert isinstance(lg.GuardedCache(OrderedDict()), dict)


def test_a_write_through_the_proxy_is_seen_by_the_code_holding_the_store() -> None:
    pinned_weight_store: dict[str, torch.Tensor] = {}
    cache = lg.GuardedCache(pinned_weight_store)
    w = rank(16)
    cache[Q_A] = w
    cache.update({V_A: rank(16)})
    assert pinned_weight_store[Q_A] is w and list(pinned_weight_store) == [Q_A, V_A]
    assert cache.get(Q_A) is w and cache.get("missing") is None and cache.get("missing", 0) == 0
    assert cache == pinned_weight_store and len(cache) == 2 and list(reversed(cache)) == [V_A, Q_A]
    assert cache.pop(V_A) is not None and V_A not in pinned_weight_store
    del cache[Q_A]
    assert pinned_weight_store == {} and not cache


def test_a_refused_store_leaves_the_proxy_and_the_store_unchanged() -> None:
    pinned_weight_store = {Q_A: rank(16)}
    before = dict(pinned_weight_store)
    cache = lg.GuardedCache(pinned_weight_store)
    attempts: list[Callable[[], object]] = [
        lambda: cache.__setitem__(Q_A, rank(8)),
        lambda: cache.update({V_A: rank(8), Q_A: rank(8)}),
        lambda: cache.setdefault(Q_A, rank(8)),
    ]
    for attempt in attempts:
        with pytest.raises(lg.CacheKeyCollisionError, match=r"shape \(16, 64\).*shape \(8, 64\)"):
            attempt()
        assert pinned_weight_store == before and pinned_weight_store[Q_A] is before[Q_A]
        assert cache == before and cache.on_collision == "raise"


def test_an_lru_store_keeps_its_order_methods_through_the_proxy() -> None:
    """The LRU a server builds on an OrderedDict: a hit moves the key to the end, eviction
    drops the oldest."""
    lru: OrderedDict[str, torch.Tensor] = OrderedDict()
    cache = lg.GuardedCache(lru)
    cache[Q_A] = rank(16)
    cache[V_A] = rank(16)
    cache.move_to_end(Q_A)
    assert list(lru) == [V_A, Q_A]
    assert cache.popitem(last=False)[0] == V_A and list(lru) == [Q_A]
    with pytest.raises(lg.CacheKeyCollisionError):
        cache[Q_A] = rank(8)
    assert lru[Q_A].shape == (16, 64)
    assert repr(cache) == f"GuardedCache({lru!r}, on_collision='raise')"


def test_a_defaultdict_store_fills_a_missing_key_with_its_factory() -> None:
    per_layer: defaultdict[str, list[torch.Tensor]] = defaultdict(list)
    cache = lg.GuardedCache(per_layer)
    cache["layers.0"].append(rank(16))  # the factory runs through cache[key]
    assert len(per_layer["layers.0"]) == 1
    assert cache.default_factory is list
    cache.default_factory = None  # an attribute of the store, set through the proxy
    assert per_layer.default_factory is None
    assert cache.get("layers.1") is None and "layers.1" not in per_layer  # get never fills


def test_a_server_store_class_keeps_its_methods_and_attributes() -> None:
    store = PinnedStore(budget=1 << 20)
    cache = lg.GuardedCache(store)
    cache[Q_A] = rank(16)
    assert cache.pinned_bytes() == 16 * 64 * 4  # its own method
    assert cache.budget == 1 << 20 and cache.entries is store.entries  # its own attributes
    cache.budget = 1 << 10  # set on the store, as before
    assert store.budget == 1 << 10
    with pytest.raises(lg.CacheKeyCollisionError):
        cache[Q_A] = rank(8)
    assert store[Q_A].shape == (16, 64)
    with pytest.raises(AttributeError, match="no_such_attribute"):
        _ = cache.no_such_attribute


def test_an_attribute_set_on_a_dict_proxy_is_refused_like_on_the_dict() -> None:
    cache = lg.GuardedCache({})
    with pytest.raises(AttributeError, match="'dict' object has no attribute 'budget'"):
        cache.budget = 1
    with pytest.raises(AttributeError):
        cache.on_collision = "evict"  # type: ignore[misc]  # the policy is fixed at creation
    assert cache.on_collision == "raise"


def test_pickling_keeps_the_policy_and_gives_the_copy_its_own_store() -> None:
    store = {Q_A: rank(16)}
    cache = lg.GuardedCache(store, on_collision="evict")
    clone = pickle.loads(pickle.dumps(cache))
    assert isinstance(clone, lg.GuardedCache) and isinstance(clone, dict)
    assert clone.on_collision == "evict" and clone[Q_A].shape == (16, 64)
    clone[Q_A] = rank(8)  # evicts in the clone only
    assert store[Q_A].shape == (16, 64) and clone.get(Q_A).shape == (8, 64)


def test_copies_are_guarded_proxies_over_a_copy_of_the_store() -> None:
    store = OrderedDict({Q_A: rank(16)})
    cache = lg.GuardedCache(store, on_collision="evict")
    for twin in (copy.copy(cache), copy.deepcopy(cache)):
        assert isinstance(twin, lg.GuardedCache) and isinstance(twin, OrderedDict)
        assert twin.on_collision == "evict" and list(twin) == list(store)
        twin[V_A] = rank(16)
        assert V_A not in store  # its own store
        assert twin.get(V_A) is twin[V_A]  # and its own get
    assert copy.copy(cache)[Q_A] is store[Q_A]  # shallow: the same tensors
    assert copy.deepcopy(cache)[Q_A] is not store[Q_A]
    plain = cache.copy()  # the store's own copy(): a plain OrderedDict, unguarded as before
    assert type(plain) is OrderedDict and not isinstance(plain, lg.GuardedCache)


def test_merging_gives_the_store_type_and_merging_in_is_checked() -> None:
    cache = lg.GuardedCache({Q_A: rank(16)})
    merged = cache | {V_A: rank(16)}
    assert type(merged) is dict and list(merged) == [Q_A, V_A]
    assert list({V_A: rank(16)} | cache) == [V_A, Q_A]
    with pytest.raises(lg.CacheKeyCollisionError):
        cache |= {Q_A: rank(8)}
    assert cache[Q_A].shape == (16, 64)


# --- operation structure (no timing): what makes a read as cheap as a dict's -----------------


@pytest.mark.parametrize("store", [{}, OrderedDict(), defaultdict(list)],
                         ids=["dict", "OrderedDict", "defaultdict"])
def test_a_builtin_store_proxy_reads_without_a_getattr_hook(store: dict[str, Any]) -> None:
    """A type with a ``__getattr__`` makes every attribute lookup take CPython's slow path
    (that was the 2x of the wrapt proxy); the read is the store's own bound ``get``, held in
    a slot of the proxy's own type (a base class's slot costs an MRO walk per read)."""
    cache = lg.GuardedCache(store)
    proxy_type = type(cache)
    assert not hasattr(proxy_type, "__getattr__")
    assert proxy_type.__getattribute__ is object.__getattribute__
    assert "get" in vars(proxy_type) and "get" in proxy_type.__slots__
    assert getattr(cache.get, "__self__", None) is store and cache.get == store.get
    assert type(lg.GuardedCache(type(store)())) is proxy_type  # one proxy type per store type


def test_only_a_store_with_attributes_of_its_own_gets_the_fallback_lookup() -> None:
    assert hasattr(type(lg.GuardedCache(PinnedStore(budget=1))), "__getattr__")

    class YieldingStore(dict[str, torch.Tensor]):  # a dict subclass with instance attributes
        pass

    assert hasattr(type(lg.GuardedCache(YieldingStore())), "__getattr__")

    class SlottedStore(dict[str, torch.Tensor]):
        __slots__ = ()

    assert not hasattr(type(lg.GuardedCache(SlottedStore())), "__getattr__")


class AuditedCache(lg.GuardedCache):
    """A server's subclass of the proxy, with a counter of its own (``_self_`` names stay on
    the proxy, as with wrapt)."""

    def __init__(self, store: MutableMapping[str, Any], **kwargs: Any) -> None:
        super().__init__(store, **kwargs)
        self._self_stores = 0

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self._self_stores += 1


def test_a_subclass_of_the_proxy_keeps_its_class_through_pickling_and_copies() -> None:
    store: OrderedDict[str, torch.Tensor] = OrderedDict()
    cache = AuditedCache(store, on_collision="evict")
    cache[Q_A] = rank(16)
    assert cache._self_stores == 1 and not hasattr(store, "_self_stores")
    assert isinstance(cache, OrderedDict) and isinstance(cache, AuditedCache)
    for twin in (pickle.loads(pickle.dumps(cache)), copy.copy(cache)):
        assert isinstance(twin, AuditedCache) and twin.on_collision == "evict"
        twin[Q_A] = rank(8)  # evicts in the twin's own store
        assert twin._self_stores == 1 and store[Q_A].shape == (16, 64)
