"""`@lora_guard.shapes`: dims declared per argument, checked per call, frozen across calls.

The hot path is generated once per decorated function (as attrs and dataclasses do): a
wrapper with the function's own signature whose body is only the checks themselves, unpacking
each ``.shape`` into locals and comparing ints. Anything unusual (a None argument, a failed
check, the first call that freezes dims) falls to the slow path, which re-derives everything
with the reference interpreter in ``_dims``, reports, and keeps the state transactional.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, cast

from lora_guard._checking.checks import dtype_name, shape_of
from lora_guard._checking.dims import DimSpec, bind_dims, parse_spec
from lora_guard._core.config import STATE, report
from lora_guard._core.errors import Violation, make_violation
from lora_guard._guarding.fast_path import (
    FastPathPlan,
    build_fast_path,
    compile_fast_path,
    default_name,
    inline_where,
)

__all__ = ["frozen_dims", "shapes", "unfreeze"]

F = TypeVar("F", bound=Callable[..., Any])

_STORE_KEY = "__lora_guard_frozen__"
_LOCK = threading.RLock()
# The stores of owners without a __dict__ (a __slots__ pool), by id(): dropped when the owner
# dies (weakref.finalize), or, for an owner that takes no weak reference either, kept with
# the owner and swept once nothing but this table holds it (`_sweep_unweakrefable`).
_FOREIGN_STORES: dict[int, _FrozenStore] = {}
_UNWEAKREFABLE_STORES: dict[int, tuple[Any, _FrozenStore]] = {}
_SWEEP_AT = [64]  # the table's size that triggers the next sweep (twice the size after one)


class _FrozenStore:
    """The dims frozen on one owner (instance, class, or plain function)."""

    __slots__ = ("__weakref__", "calls", "confirmed", "dims", "origin", "owner", "pending")

    def __init__(self) -> None:
        self.owner = 0  # id() of the instance whose __dict__ holds it (0: not an instance)
        self.dims: dict[str, int] = {}
        self.origin: dict[str, str] = {}  # dim -> function that froze it
        # For plain functions: guard key -> the tuple of its frozen dims, read by the fast
        # path. On instances and classes those tuples live in the owner's own __dict__ (one
        # dict lookup per call); ``calls`` then only remembers which keys were set there.
        self.calls: dict[str, tuple[int, ...]] = {}
        # Dims some call's body has run with: a failed first call no longer releases them.
        self.confirmed: set[str] = set()
        # Per dim not yet confirmed, how many calls with it are in their bodies now: a failed
        # first call releases the dim only when no twin call still relies on it.
        self.pending: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Only what a call's body has run with: a dim frozen by a first call still in its
        body (which may yet fail and release it) is not the copy's."""
        with _LOCK:
            dims = {d: v for d, v in self.dims.items() if d in self.confirmed}
            return {"dims": dims, "origin": {d: o for d, o in self.origin.items() if d in dims},
                    "calls": dict(self.calls), "confirmed": set(self.confirmed)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.owner = 0
        self.dims, self.origin, self.calls = state["dims"], state["origin"], state["calls"]
        self.confirmed = state.get("confirmed", set(self.dims))
        self.pending = {}

    def copy(self) -> _FrozenStore:
        new = _FrozenStore()
        new.__setstate__(self.__getstate__())
        return new


def _store_of(owner: Any, *, create: bool) -> _FrozenStore | None:
    guard = getattr(owner, "__lora_guard__", None)
    if isinstance(guard, _ShapeGuard):
        return guard.function_store
    owner = getattr(owner, "__self__", owner)  # a bound method: its instance
    try:
        namespace = vars(owner)
    except TypeError:
        return _store_outside(owner, create=create)
    return _store_in_namespace(owner, namespace, create=create)


def _store_in_namespace(
    owner: Any, namespace: Any, *, create: bool
) -> _FrozenStore | None:
    """The store kept in the owner's own ``__dict__`` (an instance) or as a class attribute."""
    found = namespace.get(_STORE_KEY)
    if isinstance(found, _FrozenStore):
        if found.owner in (0, id(owner)) or isinstance(owner, type):
            found.owner = found.owner or (0 if isinstance(owner, type) else id(owner))
            return found
        # copy.copy(pool) shares the original's __dict__ entries: the copy gets its own
        # store, starting from the dims frozen so far, so freezing one never binds both
        with _LOCK:
            found = namespace[_STORE_KEY] = found.copy()
            found.owner = id(owner)
        return found
    if not create:
        return None
    created = _FrozenStore()
    if isinstance(owner, type):
        setattr(owner, _STORE_KEY, created)
    else:
        created.owner = id(owner)
        namespace[_STORE_KEY] = created
    return created


def _store_outside(owner: Any, *, create: bool) -> _FrozenStore | None:
    """The store of an owner without a ``__dict__``, by its id: an id is not reused while
    the entry lives (dropped when the owner dies, or holding the owner)."""
    key = id(owner)
    store = _FOREIGN_STORES.get(key)
    if store is not None:
        return store
    entry = _UNWEAKREFABLE_STORES.get(key)
    if entry is not None:
        return entry[1]
    if not create:
        return None
    store = _FrozenStore()
    try:
        weakref.finalize(owner, _FOREIGN_STORES.pop, key, None)
    except TypeError:  # neither a __dict__ nor weak references: kept with its owner
        if len(_UNWEAKREFABLE_STORES) >= _SWEEP_AT[0]:
            _sweep_unweakrefable()
        _UNWEAKREFABLE_STORES[key] = (owner, store)
    else:
        _FOREIGN_STORES[key] = store
    return store


def _references(entry: tuple[Any, _FrozenStore]) -> int:
    return sys.getrefcount(entry[0])


# What `_references` counts for an owner that only the table holds (the entry and the call).
_ONLY_OURS = _references((object(), _FrozenStore()))


def _sweep_unweakrefable() -> None:
    """Drop the entries whose owner only the table still holds (the server dropped the pool):
    amortised, the table stays within twice the pools alive (plus 64)."""
    dead = [key for key, entry in _UNWEAKREFABLE_STORES.items()
            if _references(entry) <= _ONLY_OURS]
    for key in dead:
        del _UNWEAKREFABLE_STORES[key]
    _SWEEP_AT[0] = max(64, 2 * len(_UNWEAKREFABLE_STORES))


def frozen_dims(obj: object) -> dict[str, int]:
    """The dims frozen on ``obj``: an instance with guarded methods, a class, or a function.

    Example:
        >>> import lora_guard as lg, torch
        >>> class Pool:
        ...     @lg.shapes(a="slots rank hidden", frozen=("slots", "rank"))
        ...     def set_lora_info(self, a): ...
        >>> pool = Pool()
        >>> pool.set_lora_info(torch.empty(4, 16, 64, device="meta"))
        >>> lg.frozen_dims(pool)
        {'slots': 4, 'rank': 16}
    """
    with _LOCK:
        store = _store_of(obj, create=False)
        return dict(store.dims) if store else {}


def unfreeze(obj: object, *dims: str) -> None:
    """Release the frozen dims of ``obj`` (all, or those named) for a deliberate rebuild.

    The next guarded call freezes them again from its own arguments.

    Example:
        >>> import lora_guard as lg, torch
        >>> class Pool:
        ...     @lg.shapes(a="slots rank", frozen=("rank",))
        ...     def set_lora_info(self, a): ...
        >>> pool = Pool()
        >>> pool.set_lora_info(torch.empty(4, 16))
        >>> lg.unfreeze(pool)
        >>> pool.set_lora_info(torch.empty(4, 8))   # a rebuild at rank 8
        >>> lg.frozen_dims(pool)
        {'rank': 8}
    """
    with _LOCK:
        store = _store_of(obj, create=False)
        if store is None:
            return
        for dim in dims or tuple(store.dims):
            store.dims.pop(dim, None)
            store.origin.pop(dim, None)
            store.confirmed.discard(dim)
        _drop_fast_entries(obj, store)


def _namespace(owner: Any) -> dict[str, Any] | None:
    try:
        namespace = vars(owner)
    except TypeError:
        return None
    return namespace if isinstance(namespace, dict) else None


def _set_fast_entry(owner: Any, store: _FrozenStore, key: str, dims: tuple[int, ...]) -> None:
    store.calls[key] = dims
    if owner is None:
        return
    if isinstance(owner, type):
        setattr(owner, key, dims)
    else:
        namespace = _namespace(owner)
        if namespace is not None:
            namespace[key] = dims


def _drop_fast_entries(owner: Any, store: _FrozenStore, *keys: str) -> None:
    owner = getattr(owner, "__self__", owner)
    for key in keys or tuple(store.calls):
        store.calls.pop(key, None)
        if isinstance(owner, type):
            if key in vars(owner):
                delattr(owner, key)
        else:
            namespace = _namespace(owner)
            if namespace is not None:
                namespace.pop(key, None)


class _ShapeGuard:
    """Everything the generated wrapper and its slow path need about one decorated function."""

    def __init__(
        self,
        fn: Callable[..., Any],
        specs: dict[str, DimSpec],
        *,
        where: Callable[[dict[str, int]], bool] | None,
        frozen: tuple[str, ...],
        dtypes: frozenset[Any] | None,
        same_dtype: bool,
        owner_param: str | None,
    ) -> None:
        self.fn = fn
        self.signature = inspect.signature(fn)
        self.specs = specs
        self.where = where
        self.frozen = frozen
        self.dtypes = dtypes
        self.dtype_names = None if dtypes is None else frozenset(
            n for n in (dtype_name(d) for d in dtypes) if n
        )
        self.same_dtype = same_dtype
        self.owner_param = owner_param
        self.subject = fn.__qualname__
        self.function_store = _FrozenStore()
        # Stable across processes (pickled instances keep working), unique per function.
        self.fast_key = f"__lora_guard_{fn.__module__}.{fn.__qualname__}__"

    def slow(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Check everything the long way, report, and call with transactional freezing."""
        if STATE.off:
            return self.fn(*args, **kwargs)
        bound = self.signature.bind(*args, **kwargs)
        values = {name: bound.arguments.get(name) for name in self.specs}
        unreadable = self._unreadable(values)
        if unreadable:
            report(unreadable)
            return self.fn(*args, **kwargs)
        dims, origin, violations = bind_dims(
            self.subject, self.specs, values, where=self.where,
            dtypes=self.dtype_names, same_dtype=self.same_dtype,
        )
        if violations:
            report(violations)
            return self.fn(*args, **kwargs)
        if not self.frozen:
            return self.fn(*args, **kwargs)
        owner = bound.arguments[self.owner_param] if self.owner_param else self
        store, drift, held = self._freeze(owner, dims, origin, values)
        if drift:
            report(drift)  # refused before the body ran: the owner's state is untouched
            return self.fn(*args, **kwargs)
        try:
            result = self.fn(*args, **kwargs)
        except BaseException:
            if held:  # a first call failed: nothing was allocated, so freeze nothing...
                self._release(store, held)
            raise
        self._confirm(owner, store, dims, held)
        return result

    def _unreadable(self, values: dict[str, Any]) -> list[Violation]:
        """LG004 for each argument whose ``.shape`` is no shape (float, negative or text
        dims, an endless or unreadable ``.shape``, a ragged tensor)."""
        found = []
        for name, value in values.items():
            try:
                shape_of(value, name=f"argument {name!r}")
            except (TypeError, ValueError) as exc:
                found.append(make_violation("LG004", "bad-shape", self.subject,
                                            argument=name, problem=str(exc)))
        return found

    def _freeze(
        self, owner: Any, dims: dict[str, int], origin: dict[str, tuple[str, int]],
        values: dict[str, Any],
    ) -> tuple[_FrozenStore, list[Violation], dict[str, int]]:
        """The owner's store, LG001 for each frozen dim this call changes, and (when none
        does) the frozen dims no body has confirmed yet, which this call now holds: recorded
        (by the first call to bind them) and counted as pending until its body ends."""
        with _LOCK:
            store = self.function_store if owner is self else _store_of(owner, create=True)
            assert store is not None
            drift = [
                make_violation(
                    "LG001", "frozen", self.subject, dim=dim, old=store.dims[dim],
                    new=dims[dim], argument=origin[dim][0],
                    shape=shape_of(values[origin[dim][0]]),
                    frozen_by=store.origin.get(dim, self.subject),
                )
                for dim in self.frozen
                if dim in dims and dim in store.dims and store.dims[dim] != dims[dim]
            ]
            if drift:
                return store, drift, {}
            held = {d: dims[d] for d in self.frozen if d in dims and d not in store.confirmed}
            for dim, value in held.items():
                if dim not in store.dims:
                    store.dims[dim] = value
                    store.origin[dim] = self.subject
                store.pending[dim] = store.pending.get(dim, 0) + 1
        return store, [], held

    @staticmethod
    def _unhold(store: _FrozenStore, held: dict[str, int]) -> list[str]:
        """End this call's hold on its unconfirmed dims; those no other call holds now."""
        free = []
        for dim in held:
            left = store.pending.get(dim, 1) - 1
            if left > 0:
                store.pending[dim] = left
            else:
                store.pending.pop(dim, None)
                free.append(dim)
        return free

    @classmethod
    def _release(cls, store: _FrozenStore, held: dict[str, int]) -> None:
        """Undo a failed first call's freezing, unless a twin call with these dims is still
        in its body or has succeeded since (atomically with their freezing, under _LOCK)."""
        with _LOCK:
            for dim in cls._unhold(store, held):
                if dim not in store.confirmed and store.dims.get(dim) == held[dim]:
                    del store.dims[dim]
                    store.origin.pop(dim, None)

    def _confirm(self, owner: Any, store: _FrozenStore, dims: dict[str, int],
                 held: dict[str, int]) -> None:
        """A call whose body succeeded confirms its dims and opens the fast path: until then
        every call takes the slow path, so a failed first call can still be undone."""
        with _LOCK:
            self._unhold(store, held)
            bound_frozen = [d for d in self.frozen if d in dims]
            if all(store.dims.get(d) == dims[d] for d in bound_frozen):
                store.confirmed.update(bound_frozen)
                if len(bound_frozen) == len(self.frozen):
                    _set_fast_entry(None if owner is self else owner, store, self.fast_key,
                                    tuple(dims[d] for d in self.frozen))


def _compile(guard: _ShapeGuard) -> Callable[..., Any]:
    """The wrapper: the function's own signature, then straight-line checks (`fast_path`)."""
    fn = guard.fn
    reserved = [name for name in guard.signature.parameters if name.startswith("_lg_")]
    if reserved:
        raise ValueError(f"lora_guard.shapes: parameter names starting with _lg_ are "
                         f"reserved, rename {reserved[0]!r}")
    bound = {name for spec in guard.specs.values() for name in spec.names}
    where = None if guard.where is None else inline_where(guard.where, bound)
    plan = FastPathPlan(
        name=fn.__name__ if fn.__name__.isidentifier() else "wrapper",
        signature=guard.signature, specs=guard.specs, check_dtypes=guard.dtypes is not None,
        same_dtype=guard.same_dtype, has_where=guard.where is not None, where=where,
        frozen=guard.frozen, owner_param=guard.owner_param,
    )
    module = build_fast_path(plan)
    namespace: dict[str, Any] = {
        "_lg_fn": fn,
        "_lg_state": STATE,
        "_lg_slow": guard.slow,
        "_lg_compiling": _dynamo_compiling(),
        "_lg_where": guard.where,
        "_lg_dtypes": guard.dtypes,
        "_lg_calls": guard.function_store.calls,
        "_lg_key": guard.fast_key,
        "_lg_Slow": _Slow,
    }
    namespace.update((default_name(p.name), p.default)
                     for p in guard.signature.parameters.values() if p.default is not p.empty)
    code, source = compile_fast_path(module, f"<lora_guard.shapes {fn.__module__}."
                                             f"{fn.__qualname__}>")
    exec(code, namespace)
    wrapper = namespace[plan.name]
    wrapper.__lora_guard_source__ = source
    return cast("Callable[..., Any]", wrapper)


def _dynamo_compiling() -> Callable[[], bool]:
    """``torch.compiler.is_dynamo_compiling``, or "never" when torch is not installed (then
    nothing can be compiling: the guards work on any object with ``.shape``/``.dtype``)."""
    try:
        import torch
    except ImportError:
        return lambda: False
    return torch.compiler.is_dynamo_compiling


def _dtype_names(dtypes: Iterable[Any]) -> frozenset[Any]:
    from lora_guard._reading.safetensors import DTYPE_NAMES

    known = set(DTYPE_NAMES.values())
    names = set()
    for d in dtypes:
        name = dtype_name(d)
        if name not in known:
            raise ValueError(
                f"lora_guard.shapes(dtypes=...): {d!r} is not a dtype name; pass names "
                f"such as ('bfloat16', 'float16'): {', '.join(sorted(known))}")
        names.add(name)
    return frozenset(names)


class _Slow(Exception):
    """Raised by the compiled fast path to hand a call to the slow path, outside its try."""


def _dtype_set(dtypes: Iterable[Any]) -> frozenset[Any]:
    try:
        import torch
    except ImportError:  # without torch: dtype names, compared by name (the slow path)
        return _dtype_names(dtypes)

    out = set()
    for d in dtypes:
        if isinstance(d, torch.dtype):
            out.add(d)
            continue
        name = dtype_name(d) if isinstance(d, str) else None
        candidate = getattr(torch, name, None) if name else None
        if not isinstance(candidate, torch.dtype):
            raise ValueError(
                f"lora_guard.shapes(dtypes=...): {d!r} is not a torch dtype; "
                "pass e.g. (torch.bfloat16, torch.float16) or ('bfloat16', 'float16')"
            )
        out.add(candidate)
    return frozenset(out)


def shapes(
    specs: Mapping[str, str] | None = None,
    /,
    *,
    where: Callable[[dict[str, int]], bool] | None = None,
    frozen: Iterable[str] = (),
    dtypes: Iterable[Any] | None = None,
    same_dtype: bool = False,
    **arg_specs: str,
) -> Callable[[F], F]:
    """Declare each tensor argument's dims; check them on every call, before the body runs.

    Args:
        specs: optional mapping argument -> spec, for arguments whose names clash with the
            options below; otherwise pass specs as keywords.
        where: a predicate over the bound dims (a dict); False raises LG004.
        frozen: dims bound per instance (per class for classmethods, per function for plain
            functions) by the first call whose body succeeds; a later call with another value
            raises LG001 before the body runs. The guarded methods of one instance share its
            frozen dims by name, so ``rank`` means one size across the whole pool.
        dtypes: the dtypes allowed for every guarded argument (LG004 otherwise).
        same_dtype: every guarded argument must share one dtype (LG004 otherwise).
        **arg_specs: argument name -> dim spec: space-separated names (bound across
            arguments), integers, ``_``, ``k*name`` / ``name*k``, and a leading ``...``.

    Guards read ``.shape`` and ``.dtype`` only: they work on ``device="meta"`` tensors, never
    allocate or synchronise, and stand aside under ``torch.compile`` tracing. An argument that
    is None is skipped. In mode ``off`` the decorator returns the function undecorated.

    Example:
        >>> import lora_guard as lg, torch
        >>> class Pool:
        ...     @lg.shapes(a="slots 2*rank hidden", b="slots out rank", frozen=("slots", "rank"))
        ...     def set_lora_info(self, a, b): ...
        >>> pool = Pool()
        >>> pool.set_lora_info(torch.empty(4, 32, 64), torch.empty(4, 128, 16))
        >>> pool.set_lora_info(torch.empty(4, 16, 64), torch.empty(4, 128, 8))
        Traceback (most recent call last):
        ...
        lora_guard.PoolShapeDriftError: LG001 pool-shape-drift: Pool.set_lora_info: dim 'rank' ...
    """
    all_specs = {**(dict(specs) if specs is not None else {}), **arg_specs}
    if not all_specs:
        raise TypeError(
            "lora_guard.shapes needs at least one argument spec, e.g. "
            "@lg.shapes(a='slots rank hidden', b='slots hidden rank')"
        )
    parsed = {arg: parse_spec(text, argument=arg) for arg, text in all_specs.items()}
    names = {n for spec in parsed.values() for n in spec.names}
    frozen_t = (frozen,) if isinstance(frozen, str) else tuple(frozen)
    unknown = [d for d in frozen_t if d not in names]
    if unknown:
        raise ValueError(
            f"lora_guard.shapes(frozen=...): {unknown} are not dims named in the specs "
            f"(named: {sorted(names)}); freeze only dims that some argument binds."
        )
    if where is not None and not callable(where):
        raise TypeError("lora_guard.shapes(where=...) must be a callable taking a dict of dims")
    dtype_set = None if dtypes is None else _dtype_set(dtypes)

    def decorate(fn: F) -> F:
        if STATE.off:
            return fn
        if isinstance(fn, (staticmethod, classmethod)):
            return cast(F, type(fn)(decorate(fn.__func__)))
        if not callable(fn):
            raise TypeError(f"lora_guard.shapes decorates a function, got {type(fn).__name__}")
        params = inspect.signature(fn).parameters
        missing = [arg for arg in parsed if arg not in params]
        if missing:
            raise TypeError(
                f"lora_guard.shapes on {fn.__qualname__}: {missing} are not parameters "
                f"(parameters: {list(params)}); name the tensor arguments as the function does."
            )
        first = next(iter(params), None)
        owner = first if first in ("self", "cls") else None
        guard = _ShapeGuard(
            fn, parsed, where=where, frozen=frozen_t, dtypes=dtype_set,
            same_dtype=same_dtype, owner_param=owner,
        )
        wrapper = _compile(guard)
        functools.update_wrapper(wrapper, fn)
        wrapper.__lora_guard__ = guard  # type: ignore[attr-defined]
        return cast(F, wrapper)

    return decorate

