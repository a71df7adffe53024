"""Cache keys that cannot collide: `GuardedCache`, `guard_cache_lookup`, `weight_cache_key`."""

from __future__ import annotations

import copy
import functools
import operator
import threading
import types
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from lora_guard._checking.checks import check_cache_entry, dtype_name, shape_of
from lora_guard._core.arguments import ArgSelector, selector
from lora_guard._core.config import STATE, report
from lora_guard._core.errors import Violation, make_violation

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


class GuardedCache:
    """A transparent proxy over a weight cache that refuses a key collision (LG003).

    The code that holds the dict keeps using it as a dict (``isinstance(cache, dict)`` holds,
    and every method of the store's type is reachable, e.g. ``move_to_end`` of an
    ``OrderedDict``); storing a tensor under a key that holds one of another shape or dtype
    raises LG003 before anything is stored, or with ``on_collision="evict"`` replaces the
    stale entry. Reads are not checked (an entry is checked when it is stored), so ``get``
    is the store's own and costs about a dict's; for a get-or-create use `get_or_create`
    (or ``setdefault``), which check the entry against the weight asked for.

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

    # A plain class, not a wrapt proxy: a type with a __getattr__ (wrapt's has one) makes
    # every attribute lookup slow, and `get` is looked up on each read (see _proxy_type).
    __slots__ = ("__weakref__", "__wrapped__", "_self_lock", "_self_on_collision")

    __wrapped__: MutableMapping[Any, Any]
    get: Callable[..., Any]
    """The store's own bound ``get``: reads are not checked, and cost about a dict's."""
    _self_on_collision: OnCollision
    _self_lock: threading.RLock

    if TYPE_CHECKING:  # the store's other methods and attributes, reached through the proxy
        def __getattr__(self, name: str) -> Any: ...

    def __new__(
        cls, store: MutableMapping[Any, Any], *, on_collision: OnCollision = "raise"
    ) -> GuardedCache:
        if not (hasattr(store, "__setitem__") and hasattr(store, "get")):
            raise TypeError(
                "lora_guard.GuardedCache wraps a mutable mapping (a dict of key -> tensor), "
                f"got {type(store).__name__}"
            )
        _check_on_collision(on_collision, "lora_guard.GuardedCache")
        proxy: GuardedCache = object.__new__(_proxy_type(_origin(cls), type(store)))
        return proxy

    def __init__(
        self, store: MutableMapping[Any, Any], *, on_collision: OnCollision = "raise"
    ) -> None:
        init = object.__setattr__
        init(self, "__wrapped__", store)
        init(self, "get", store.get)
        init(self, "_self_on_collision", _check_on_collision(on_collision,
                                                             "lora_guard.GuardedCache"))
        # Check-then-store must be one step: two threads storing different shapes under one
        # key could both pass the check, and the key would silently change shape.
        init(self, "_self_lock", threading.RLock())

    @property
    def on_collision(self) -> OnCollision:
        """``"raise"`` or ``"evict"``."""
        return self._self_on_collision

    @property  # type: ignore[misc]
    def __class__(self) -> type[Any]:  # isinstance(cache, dict) holds
        return type(self.__wrapped__)

    # --- the mapping, forwarded -------------------------------------------------------------

    def __getitem__(self, key: Any) -> Any:
        return self.__wrapped__[key]

    def __contains__(self, key: object) -> bool:
        return key in self.__wrapped__

    def __len__(self) -> int:
        return len(self.__wrapped__)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.__wrapped__)

    def __reversed__(self) -> Iterator[Any]:
        return reversed(self.__wrapped__)

    def __delitem__(self, key: Any) -> None:
        del self.__wrapped__[key]

    def __bool__(self) -> bool:
        return bool(self.__wrapped__)

    def __eq__(self, other: object) -> bool:
        return bool(self.__wrapped__ == other)

    def __ne__(self, other: object) -> bool:
        return bool(self.__wrapped__ != other)

    def __hash__(self) -> int:
        return hash(self.__wrapped__)

    def __or__(self, other: Any) -> Any:
        return self.__wrapped__ | other

    def __ror__(self, other: Any) -> Any:
        return other | self.__wrapped__

    def __str__(self) -> str:
        return str(self.__wrapped__)

    def __dir__(self) -> Iterable[str]:
        return dir(self.__wrapped__)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_self_") or name in _own_names(type(self)):
            object.__setattr__(self, name, value)
        else:  # as wrapt's proxy did: another attribute is the store's
            setattr(self.__wrapped__, name, value)

    def __delattr__(self, name: str) -> None:
        if name.startswith("_self_") or name in _own_names(type(self)):
            object.__delattr__(self, name)
        else:
            delattr(self.__wrapped__, name)

    # --- the stores, checked ----------------------------------------------------------------

    def _admit(self, key: Any, value: Any, staged: Mapping[Any, Any] | None = None) -> None:
        store = self.__wrapped__
        cached = staged[key] if staged and key in staged else store.get(key)
        if cached is value or STATE.off:
            return
        if cached is None:  # a new key: only a shape that is no shape is refused (LG004)
            _readable(key, value)
            return
        violation = _checked_entry(key, cached, value)
        if violation is not None and (
                self._self_on_collision == "raise" or violation.code != "LG003"):
            report([violation])

    def __setitem__(self, key: Any, value: Any) -> None:
        with self._self_lock:
            self._admit(key, value)
            self.__wrapped__[key] = value

    def setdefault(self, key: Any, default: Any = None) -> Any:
        """The store's ``setdefault``, checked: a default of another shape or dtype than the
        entry under ``key`` raises LG003 (or, evicting, replaces the entry)."""
        with self._self_lock:
            return self._setdefault(key, default)

    def _setdefault(self, key: Any, default: Any) -> Any:
        store = self.__wrapped__
        cached = store.get(key)
        if cached is None:
            if not STATE.off:
                _readable(key, default)
            return store.setdefault(key, default)
        violation = None if STATE.off else _checked_entry(key, cached, default)
        if violation is not None:
            if self._self_on_collision == "raise" or violation.code != "LG003":
                report([violation])
                return cached
            store[key] = default
            return default
        return cached

    def get_or_create(self, key: Any, weight: Any, *,
                      create: Callable[[], Any] | None = None) -> Any:
        """The entry under ``key``, checked against ``weight``; made when the key is free.

        The checked form of the inline get-or-create ``if key not in cache: cache[key] =
        weight`` then ``return cache[key]``, which hands back whatever the key holds, of any
        shape. Here an entry of another shape or dtype than ``weight`` raises LG003 (or,
        evicting, is replaced); a free key stores ``create()`` (e.g. a pinned copy, made
        once, under the cache's lock, and checked against ``weight`` too), or ``weight``
        itself without ``create``. What comes back always has ``weight``'s shape and dtype.

        Example:
            >>> import lora_guard as lg, torch
            >>> cache = lg.GuardedCache({})
            >>> w16 = torch.empty(16, 64)
            >>> cache.get_or_create("q_proj.lora_A", w16, create=w16.clone).shape
            torch.Size([16, 64])
            >>> cache.get_or_create("q_proj.lora_A", torch.empty(8, 64))
            Traceback (most recent call last):
            ...
            lora_guard.CacheKeyCollisionError: LG003 cache-key-collision: cache key ...
        """
        if create is not None and not callable(create):
            raise TypeError("GuardedCache.get_or_create(create=...) takes a callable that "
                            f"makes the entry (e.g. weight.pin_memory), got {create!r}")
        with self._self_lock:
            store = self.__wrapped__
            cached = store.get(key)
            if cached is not None:
                violation = None if STATE.off else _checked_entry(key, cached, weight)
                if violation is None:
                    return cached
                if self._self_on_collision == "raise" or violation.code != "LG003":
                    report([violation])
                    return cached  # warn/record mode: the caller asked to proceed
            made = weight if create is None else create()
            if made is not weight and not STATE.off:
                violation = _checked_entry(key, made, weight)
                if violation is not None:  # create() made another shape: never stored
                    report([violation])
                    return made  # warn/record mode: the caller asked to proceed
            elif not STATE.off:
                _readable(key, made)
            store[key] = made
            return made

    def update(self, other: Mapping[Any, Any] | Iterable[tuple[Any, Any]] = (), /,
               **kwargs: Any) -> None:
        """The store's ``update``, checked all or nothing: one entry of another shape or dtype
        than the one under its key (or than an earlier entry of the same call) and nothing is
        stored."""
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

    # --- repr, pickling, copies -------------------------------------------------------------

    def __repr__(self) -> str:
        return f"GuardedCache({self.__wrapped__!r}, on_collision={self._self_on_collision!r})"

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (_origin(type(self)), (self.__wrapped__,),
                {"_self_on_collision": self._self_on_collision})

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._self_on_collision = state["_self_on_collision"]

    def __copy__(self) -> GuardedCache:
        """A new proxy, with the same policy, over a shallow copy of the store (as pickling
        gives a proxy over its own store)."""
        return _origin(type(self))(copy.copy(self.__wrapped__),
                                   on_collision=self._self_on_collision)

    def __deepcopy__(self, memo: dict[int, Any]) -> GuardedCache:
        return _origin(type(self))(copy.deepcopy(self.__wrapped__, memo),
                                   on_collision=self._self_on_collision)

    def __class_getitem__(cls, item: Any) -> types.GenericAlias:
        return types.GenericAlias(cls, item)


# One proxy type per (GuardedCache class, store type), made on first use: each public name of
# the store's type that the proxy does not define reads the store's (a C attrgetter, no Python
# frame). Only a store whose instances carry attributes of their own gets a __getattr__.
_PROXY_TYPES: weakref.WeakKeyDictionary[type, dict[type, type]] = weakref.WeakKeyDictionary()


def _proxy_type(cls: type[GuardedCache], store_type: type) -> type[GuardedCache]:
    by_class = _PROXY_TYPES.get(store_type)
    if by_class is None:
        by_class = _PROXY_TYPES.setdefault(store_type, {})
    proxy = by_class.get(cls)
    if proxy is None:
        proxy = by_class.setdefault(cls, _make_proxy_type(cls, store_type))
    return proxy


def _make_proxy_type(cls: type[GuardedCache], store_type: type) -> type[GuardedCache]:
    own = frozenset((*dir(cls), "get"))
    namespace: dict[str, Any] = {
        # `get` is a slot of the proxy type itself: a slot of a base class is checked
        # against the instance's type with a walk of its MRO on each read.
        "__slots__": ("get",), "__module__": cls.__module__, "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__, "_self_own_names": own, "_self_origin": cls,
    }
    for name in dir(store_type):
        if not name.startswith("_") and name not in own:
            namespace[name] = property(operator.attrgetter(f"__wrapped__.{name}"))
    if _carries_attributes(store_type):
        namespace["__getattr__"] = _store_attribute
    return cast("type[GuardedCache]", type(cls.__name__, (cls,), namespace))


def _carries_attributes(store_type: type) -> bool:
    """Whether the store's class (written in Python) lets its instances hold attributes of
    their own (a ``__dict__``, or a ``__getattr__``), which only a fallback lookup can reach.
    The builtin stores (``dict``, ``OrderedDict``, ``defaultdict``) get none: their methods
    and attributes are the type's, and a fallback would slow every read."""
    return hasattr(store_type, "__getattr__") or any(
        klass.__flags__ & _HEAP_TYPE and "__dict__" in vars(klass) for klass in store_type.__mro__)


_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement, not in C


def _store_attribute(self: GuardedCache, name: str) -> Any:
    if name == "__wrapped__":  # not set yet: no store to ask
        raise AttributeError(name)
    return getattr(self.__wrapped__, name)


def _origin(cls: type[GuardedCache]) -> type[GuardedCache]:
    """The class the user named (GuardedCache or a subclass), not its proxy type for one
    store type: what pickles and copies are made of."""
    origin: type[GuardedCache] = vars(cls).get("_self_origin", cls)
    return origin


def _own_names(proxy_type: type) -> frozenset[str]:
    names: frozenset[str] = getattr(proxy_type, "_self_own_names", frozenset())
    return names


def _readable(key: Any, value: Any) -> None:
    """LG004 for a value whose ``.shape`` is no shape (a ragged tensor, float or negative
    dims, an endless ``.shape``); anything else, tensor or not, passes."""
    try:
        shape_of(value, name=f"the weight stored under cache key {key!r}")
    except (TypeError, ValueError) as exc:
        report([make_violation("LG004", "bad-shape", str(key), problem=str(exc))])


def _checked_entry(key: Any, cached: Any, weight: Any) -> Violation | None:
    """`check_cache_entry`, with a shape that is no shape as LG004 instead of an error."""
    try:
        return check_cache_entry(key, cached, weight)
    except (TypeError, ValueError) as exc:
        return make_violation("LG004", "bad-shape", str(key), problem=str(exc))
    except RuntimeError:  # a nested tensor's .shape: shape_of names it
        for value, name in ((cached, "the tensor cached under"), (weight, "the new weight for")):
            try:
                shape_of(value, name=f"{name} cache key {key!r}")
            except (TypeError, ValueError) as exc:
                return make_violation("LG004", "bad-shape", str(key), problem=str(exc))
        raise


# Evicting lookups of one key run one at a time (check, body, check): two threads wanting
# different shapes under one key would otherwise each evict the other's entry between the
# other's check and its return. A fixed set of locks, chosen by the key's hash, bounds the
# memory whatever the number of keys and stores; lookups of other keys rarely share one.
_KEY_LOCKS = tuple(threading.RLock() for _ in range(64))
_MAX_EVICTIONS = 8  # an evicting lookup that cannot settle within this many bodies: LG003


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
    dropped so the body creates a fresh entry. What the body returns is compared too: a
    tensor of another shape or dtype is never returned unchecked (evicting lookups of one key
    run one at a time, so two threads wanting it at two ranks never swap tensors; a body that
    keeps returning another shape is refused with LG003 after 8 tries).

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
            if mode == "evict":
                with _KEY_LOCKS[hash(cache_key) & 63]:
                    return _evicting(cache, cache_key, wanted, lambda: fn(*args, **kwargs))
            cached = _check_hit(cache, cache_key, wanted)
            result = fn(*args, **kwargs)
            if result is cached or result is wanted or getattr(result, "shape", None) is None:
                return result  # the usual hit (checked above), a pass-through, not a tensor
            # Another thread may have stored another shape between the check and the body.
            violation = _checked_entry(cache_key, result, wanted)
            if violation is not None:
                report([violation])
            return result

        return cast(F, wrapper)

    return decorate


def _check_hit(cache: Any, cache_key: Any, wanted: Any) -> Any:
    """The entry under the key, checked against the weight wanted before the body runs (a
    mismatch raises LG003). Returns the entry found."""
    cached = cache.get(cache_key)
    if cached is not None:
        violation = _checked_entry(cache_key, cached, wanted)
        if violation is not None:
            report([violation])
    return cached


def _evicting(cache: Any, cache_key: Any, wanted: Any, body: Callable[[], Any]) -> Any:
    """Evict a stale entry, run the body, and check what it returns; what is returned was
    checked. An entry of another shape that reappears (code that stores into the cache
    outside the guard) is evicted again, up to `_MAX_EVICTIONS` times, then LG003."""
    result: Any = None
    mismatch: Violation | None = None
    for _ in range(_MAX_EVICTIONS):
        cached = cache.get(cache_key)
        if cached is not None:
            violation = _checked_entry(cache_key, cached, wanted)
            if violation is not None:
                if violation.code != "LG003":
                    report([violation])
                cache.pop(cache_key, None)
        result = body()
        if result is wanted or getattr(result, "shape", None) is None:
            return result
        mismatch = _checked_entry(cache_key, result, wanted)
        if mismatch is None:
            return result
        if mismatch.code != "LG003":
            report([mismatch])
        if cache.get(cache_key) is result:
            cache.pop(cache_key, None)
    if mismatch is not None:  # the body keeps returning another shape: refuse it
        report([mismatch])
    return result


def weight_cache_key(*parts: str | int, weight: Any) -> str:
    """A cache key that includes the weight's shape and dtype, so distinct weights cannot
    collide.

    The parts are joined with ``#``; a part's own ``%`` and ``#`` are written ``%25`` and
    ``%23``, so two different part lists never give one key (``("a#b",)`` and ``("a", "b")``
    differ).

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
    # A part's own "%" and "#" are escaped, so that distinct part lists never join into one
    # key (("a#b",) against ("a", "b")); parts without them are written as they are.
    joined = "#".join(str(p).replace("%", "%25").replace("#", "%23") for p in parts)
    return f"{joined}[{'x'.join(map(str, shape))}:{dtype}]"
