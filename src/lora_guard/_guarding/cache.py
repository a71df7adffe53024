"""Cache keys that cannot collide: `GuardedCache`, `guard_cache_lookup`, `weight_cache_key`."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any, Literal, TypeVar, cast

import wrapt

from lora_guard._checking.checks import check_cache_entry, dtype_name, shape_of
from lora_guard._core.arguments import ArgSelector, selector
from lora_guard._core.config import STATE, report

__all__ = ["GuardedCache", "guard_cache_lookup", "weight_cache_key"]

F = TypeVar("F", bound=Callable[..., Any])
OnCollision = Literal["raise", "evict"]


def _check_on_collision(value: object, where: str) -> OnCollision:
    if value not in ("raise", "evict"):
        raise ValueError(
            f"{where}(on_collision=...) must be 'raise' (refuse the stale entry with LG003) or "
            f"'evict' (replace it with the new weight), got {value!r}"
        )
    return value


class GuardedCache(wrapt.ObjectProxy):  # type: ignore[type-arg]
    """A transparent proxy over a weight cache that refuses a key collision (LG003).

    The code that holds the dict keeps using it as a dict (``isinstance(cache, dict)`` holds);
    storing a tensor under a key that holds one of another shape or dtype raises LG003 before
    anything is stored, or with ``on_collision="evict"`` replaces the stale entry.

    Example:
        >>> import lora_guard as lg, torch
        >>> store = lg.GuardedCache({})
        >>> store["q_proj.lora_A#tp0"] = torch.empty(16, 64)
        >>> store["q_proj.lora_A#tp0"] = torch.empty(8, 64)
        Traceback (most recent call last):
        ...
        lora_guard.CacheKeyCollisionError: LG003 cache-key-collision: cache key ...
        >>> store["q_proj.lora_A#tp0"].shape
        torch.Size([16, 64])
    """

    def __init__(
        self, store: MutableMapping[Any, Any], *, on_collision: OnCollision = "raise"
    ) -> None:
        if not (hasattr(store, "__setitem__") and hasattr(store, "get")):
            raise TypeError(
                "lora_guard.GuardedCache wraps a mutable mapping (a dict of key -> tensor), "
                f"got {type(store).__name__}"
            )
        super().__init__(store)
        self.get = store.get  # type: ignore[method-assign,assignment]  # the read path, see get()
        self._self_on_collision = _check_on_collision(on_collision, "lora_guard.GuardedCache")
        # Check-then-store must be one step: two threads storing different shapes under one
        # key could both pass the check, and the key would silently change shape.
        self._self_lock = threading.RLock()

    @property
    def on_collision(self) -> OnCollision:
        """``"raise"`` or ``"evict"``."""
        on_collision: OnCollision = self._self_on_collision
        return on_collision

    # Hot methods are defined here rather than delegated: a proxy attribute lookup costs
    # several times a direct call.
    def get(self, key: Any, default: Any = None) -> Any:
        """The store's ``get``. Reads are not checked (an entry is checked when it is stored),
        so each instance holds the store's own bound ``get`` (set in ``__init__``: the proxy
        stores a name its class has on itself), and a lookup costs about a dict's."""
        return self.__wrapped__.get(key, default)

    # A subclass of wrapt's C proxy reaches every attribute through a Python-level
    # ``__getattribute__`` call (its ``__getattr__`` makes the type use the slow hook); the
    # generic lookup does what the proxy's does (the proxy's own attributes, then
    # ``__getattr__`` forwards to the store) at the speed of a plain object.
    __getattribute__ = object.__getattribute__

    def __getitem__(self, key: Any) -> Any:
        return self.__wrapped__[key]

    def __contains__(self, key: object) -> bool:
        return key in self.__wrapped__

    def _admit(self, key: Any, value: Any, staged: Mapping[Any, Any] | None = None) -> None:
        store = self.__wrapped__
        cached = staged[key] if staged and key in staged else store.get(key)
        if cached is None or cached is value or STATE.off:
            return
        violation = check_cache_entry(key, cached, value)
        if violation is not None and self._self_on_collision == "raise":
            report([violation])

    def __setitem__(self, key: Any, value: Any) -> None:
        with self._self_lock:
            self._admit(key, value)
            self.__wrapped__[key] = value

    def setdefault(self, key: Any, default: Any = None) -> Any:
        with self._self_lock:
            return self._setdefault(key, default)

    def _setdefault(self, key: Any, default: Any) -> Any:
        store = self.__wrapped__
        cached = store.get(key)
        if cached is None:
            return store.setdefault(key, default)
        violation = None if STATE.off else check_cache_entry(key, cached, default)
        if violation is not None:
            if self._self_on_collision == "raise":
                report([violation])
                return cached
            store[key] = default
            return default
        return cached

    def update(self, other: Mapping[Any, Any] | Iterable[tuple[Any, Any]] = (), /,
               **kwargs: Any) -> None:
        items = [(key, value) for key, value in (
            other.items() if isinstance(other, Mapping) else other)] + list(kwargs.items())
        with self._self_lock:
            staged: dict[Any, Any] = {}
            for key, value in items:  # all or nothing: check every entry before storing any,
                self._admit(key, value, staged)  # each against what the call stored before it
                staged[key] = value
            for key, value in items:
                self.__wrapped__[key] = value

    def __ior__(  # type: ignore[misc]
        self, other: Mapping[Any, Any] | Iterable[tuple[Any, Any]]
    ) -> GuardedCache:
        """``cache |= entries``: the same check as `update`, all or nothing."""
        self.update(other)
        return self

    def __repr__(self) -> str:
        return f"GuardedCache({self.__wrapped__!r}, on_collision={self._self_on_collision!r})"

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (type(self), (self.__wrapped__,), {"_self_on_collision": self._self_on_collision})

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._self_on_collision = state["_self_on_collision"]
        self.get = self.__wrapped__.get  # type: ignore[method-assign]


def guard_cache_lookup(
    *,
    store: ArgSelector,
    key: ArgSelector,
    weight: ArgSelector,
    on_collision: OnCollision = "raise",
) -> Callable[[F], F]:
    """Guard a get-or-create weight lookup: a hit of another shape or dtype is caught first.

    ``store``, ``key`` and ``weight`` each name an argument of the wrapped function (or are
    callables over its bound arguments). Before the body runs, the entry under ``key`` is
    compared with ``weight``: a mismatch raises LG003, or with ``on_collision="evict"`` is
    dropped so the body creates a fresh entry.

    Example:
        >>> import lora_guard as lg, torch
        >>> @lg.guard_cache_lookup(store="pinned_weight_store", key="cache_key",
        ...                        weight="weight")
        ... def get_cached(pinned_weight_store, cache_key, weight):
        ...     return pinned_weight_store.setdefault(cache_key, weight)
        >>> store = {}
        >>> get_cached(store, "layers.0.q_proj.lora_A", torch.empty(16, 64)).shape
        torch.Size([16, 64])
        >>> get_cached(store, "layers.0.q_proj.lora_A", torch.empty(8, 64))
        Traceback (most recent call last):
        ...
        lora_guard.CacheKeyCollisionError: LG003 cache-key-collision: cache key ...
    """
    mode = _check_on_collision(on_collision, "lora_guard.guard_cache_lookup")
    name = "lora_guard.guard_cache_lookup"

    def decorate(fn: F) -> F:
        if STATE.off:
            return fn
        get_store = selector(fn, "store", store, decorator=name)
        get_key = selector(fn, "key", key, decorator=name)
        get_weight = selector(fn, "weight", weight, decorator=name)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if STATE.off:
                return fn(*args, **kwargs)
            cache = get_store(args, kwargs)
            if cache is None:
                return fn(*args, **kwargs)
            cache_key = get_key(args, kwargs)
            wanted = get_weight(args, kwargs)
            cached = _check_hit(cache, cache_key, wanted, mode)
            result = fn(*args, **kwargs)
            if result is cached or result is wanted or getattr(result, "shape", None) is None:
                return result  # the usual hit (checked above), a pass-through, not a tensor
            return _check_result(cache, cache_key, wanted, result, mode,
                                 lambda: fn(*args, **kwargs))

        return cast(F, wrapper)

    return decorate


def _check_hit(cache: Any, cache_key: Any, wanted: Any, mode: OnCollision) -> Any:
    """The entry under the key, checked against the weight wanted before the body runs: a
    mismatch raises LG003 or (evict) is dropped. Returns the entry found."""
    cached = cache.get(cache_key)
    if cached is not None:
        violation = check_cache_entry(cache_key, cached, wanted)
        if violation is not None:
            if mode == "evict":
                cache.pop(cache_key, None)
            else:
                report([violation])
    return cached


def _check_result(cache: Any, cache_key: Any, wanted: Any, result: Any, mode: OnCollision,
                  again: Callable[[], Any]) -> Any:
    """Another thread may have stored another shape between the check and the body: the
    body's result checked too (evict: dropped, and the body run ``again``)."""
    violation = check_cache_entry(cache_key, result, wanted)
    if violation is None:
        return result
    if mode == "evict":
        if cache.get(cache_key) is result:
            cache.pop(cache_key, None)
        return again()
    report([violation])
    return result


def weight_cache_key(*parts: str | int, weight: Any) -> str:
    """A cache key that includes the weight's shape and dtype, so distinct weights cannot
    collide.

    Example:
        >>> import lora_guard as lg, torch
        >>> lg.weight_cache_key("layers.0.qkv_proj.lora_A", "tp0",
        ...                     weight=torch.empty(48, 64, dtype=torch.bfloat16))
        'layers.0.qkv_proj.lora_A#tp0[48x64:bfloat16]'
    """
    if not parts:
        raise TypeError("lora_guard.weight_cache_key needs at least one part, e.g. the weight name")
    for part in parts:
        if not isinstance(part, (str, int)) or isinstance(part, bool):
            raise TypeError(
                f"lora_guard.weight_cache_key parts are strings or ints, got {part!r}; "
                "pass the weight itself as weight=..."
            )
    shape, dtype = shape_of(weight), dtype_name(weight)
    if shape is None or dtype is None or not hasattr(weight, "dtype"):
        raise TypeError(
            "lora_guard.weight_cache_key(weight=...) needs a tensor (or anything with .shape "
            f"and .dtype), got {type(weight).__name__}"
        )
    return f"{'#'.join(map(str, parts))}[{'x'.join(map(str, shape))}:{dtype}]"
