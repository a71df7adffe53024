"""One MoE layout per pool: `detect_moe_layout`, `LayoutRegistry`, `guard_adapter_load`."""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from lora_guard._checking.checks import MoELayout, check_moe_layouts, weights_of
from lora_guard._core.arguments import ArgSelector, selector
from lora_guard._core.config import STATE, report
from lora_guard._core.errors import Violation, make_violation

__all__ = ["LayoutRegistry", "detect_moe_layout", "guard_adapter_load"]

F = TypeVar("F", bound=Callable[..., Any])


def detect_moe_layout(weights: Mapping[str, Any] | Any) -> MoELayout | None:
    """The MoE layout of one adapter's weights, or None for a dense adapter.

    ``weights`` maps weight names to tensors, to tensor metadata (anything with ``.shape``) or
    to shapes; an `lg.AdapterSpec` works too. An adapter whose own weights mix layouts is
    reported as LG002 (raised in ``raise`` mode).

    Example:
        >>> import lora_guard as lg
        >>> lg.detect_moe_layout({
        ...     "model.layers.0.mlp.experts.gate_up_proj.lora_A": (1, 32, 64),
        ...     "model.layers.0.mlp.experts.gate_up_proj.lora_B": (8, 256, 16),
        ... })
        <MoELayout.SHARED_OUTER: 'shared-outer'>
        >>> lg.detect_moe_layout({"model.layers.0.self_attn.q_proj.lora_A.weight": (16, 64)})
    """
    layout, violations = check_moe_layouts("adapter", weights_of(weights))
    report(violations)
    return layout


class LayoutRegistry:
    """The MoE layout of one pool, and the adapters admitted into it; thread-safe.

    The first MoE adapter admitted sets the pool's layout; an adapter of another layout is
    refused with LG002 naming it, its layout, the pool's layout and the adapter that set it.
    Dense adapters are admitted whatever the layout. Admission costs what the new adapter's
    weights cost, never a rescan of the adapters already loaded.

    Example:
        >>> import lora_guard as lg
        >>> pool = lg.LayoutRegistry()
        >>> shared = {"layers.0.mlp.experts.gate_up_proj.lora_A": (1, 32, 64)}
        >>> per_expert = {"layers.0.mlp.experts.0.gate_proj.lora_A.weight": (16, 64)}
        >>> pool.admit("math", shared)
        <MoELayout.SHARED_OUTER: 'shared-outer'>
        >>> pool.admit("code", per_expert)
        Traceback (most recent call last):
        ...
        lora_guard.MixedMoELayoutError: LG002 mixed-moe-layout: adapter 'code': its MoE layout ...
        >>> pool.release("math")
        >>> pool.admit("code", per_expert)
        <MoELayout.PER_EXPERT: 'per-expert'>
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # The number of the last admission of each admitted id (from one counter for all
        # ids, so a number is never reused), and per thread what its last admission
        # replaced: a failed load puts back what *its* admission replaced, and only if that
        # admission is still the id's last: a later admission of the id, or its release (an
        # unload while the reload was in flight), is never undone.
        self._admissions = itertools.count(1)
        self._generation: dict[str, int] = {}
        self._local = threading.local()
        self._adapters: dict[str, MoELayout | None] = {}
        # Per layout, the admitted adapters in admission order: the first is the "owner".
        self._by_layout: dict[MoELayout, dict[str, None]] = {}

    @property
    def layout(self) -> MoELayout | None:
        """The pool's MoE layout, or None while no MoE adapter is admitted."""
        with self._lock:
            return self._pool_layout()

    @property
    def adapters(self) -> dict[str, MoELayout | None]:
        """A copy of the admitted adapters and their layouts (None for dense)."""
        with self._lock:
            return dict(self._adapters)

    def _pool_layout(self, excluding: str | None = None) -> MoELayout | None:
        for layout, ids in self._by_layout.items():
            if any(i != excluding for i in ids):
                return layout
        return None

    def _owner(self, layout: MoELayout, excluding: str) -> str:
        return next(i for i in self._by_layout[layout] if i != excluding)

    def admit(self, adapter_id: str, weights: Mapping[str, Any] | Any) -> MoELayout | None:
        """Classify ``weights`` and admit the adapter, or raise LG002 leaving the pool as it was.

        Admitting an id again replaces its entry (a reload), atomically.
        """
        if not isinstance(adapter_id, str) or not adapter_id:
            raise TypeError(f"adapter_id must be a non-empty string, got {adapter_id!r}")
        subject = f"adapter {adapter_id!r}"
        layout, mixed = check_moe_layouts(subject, weights_of(weights))
        report(mixed)
        violations: list[Violation] = []
        with self._lock:
            pool = self._pool_layout(excluding=adapter_id)
            if layout is not None and pool is not None and layout is not pool:
                violations = [
                    make_violation(
                        "LG002", "pool", subject, layout=layout.value,
                        pool_layout=pool.value, owner=self._owner(pool, adapter_id),
                        adapter=adapter_id,
                    )
                ]
            else:
                self._record(adapter_id, layout)
        if violations:
            report(violations)  # outside the lock: a warn-mode handler may call back in
            with self._lock:  # warn/record mode: the caller proceeds, so the pool holds it
                self._record(adapter_id, layout)
        return layout

    def _record(self, adapter_id: str, layout: MoELayout | None) -> None:
        before = (adapter_id in self._adapters, self._adapters.get(adapter_id))
        generation = self._generation[adapter_id] = next(self._admissions)
        self._local.admission = (adapter_id, before, generation)
        self._forget(adapter_id)
        self._adapters[adapter_id] = layout
        if layout is not None:
            self._by_layout.setdefault(layout, {})[adapter_id] = None

    def _forget(self, adapter_id: str) -> None:
        layout = self._adapters.pop(adapter_id, None)
        if layout is not None:
            ids = self._by_layout[layout]
            ids.pop(adapter_id, None)
            if not ids:
                del self._by_layout[layout]

    def _last_admission(self) -> tuple[str, tuple[bool, MoELayout | None], int] | None:
        """(id, the entry it replaced, its number) of this thread's last admission."""
        found: tuple[str, tuple[bool, MoELayout | None], int] | None = getattr(
            self._local, "admission", None)
        return found

    def _undo(self, admission: tuple[str, tuple[bool, MoELayout | None], int]) -> None:
        """Undo one admission of a load that failed, unless another has been made since (a
        concurrent load of the same id that succeeded keeps its adapter)."""
        adapter_id, (admitted, layout), generation = admission
        with self._lock:
            if self._generation.get(adapter_id) != generation:
                return
            self._forget(adapter_id)
            if admitted:
                self._adapters[adapter_id] = layout
                if layout is not None:
                    self._by_layout.setdefault(layout, {})[adapter_id] = None

    def release(self, adapter_id: str) -> None:
        """Forget an adapter on unload; unknown ids are ignored (unload is idempotent).

        An unload wins over a reload of the same id still in flight: if that reload then
        fails, the adapter stays released (the failed load puts nothing back)."""
        with self._lock:
            self._forget(adapter_id)
            self._generation.pop(adapter_id, None)

    def __contains__(self, adapter_id: object) -> bool:
        with self._lock:
            return adapter_id in self._adapters

    def __len__(self) -> int:
        with self._lock:
            return len(self._adapters)

    def __repr__(self) -> str:
        return f"<LayoutRegistry layout={self.layout} adapters={len(self)}>"


def guard_adapter_load(
    registry: LayoutRegistry,
    *,
    adapter_id: ArgSelector,
    weights: ArgSelector,
) -> Callable[[F], F]:
    """Admit an adapter's MoE layout into ``registry`` before the loading function runs.

    ``adapter_id`` and ``weights`` each name an argument of the loader, or are callables over
    its bound arguments. A refused adapter never reaches the loader's body; a loader that
    raises releases the admission, so a failed load leaves the registry as it was.

    Example:
        >>> import lora_guard as lg
        >>> registry = lg.LayoutRegistry()
        >>> @lg.guard_adapter_load(registry, adapter_id="name", weights="tensors")
        ... def load(name, tensors):
        ...     return name
        >>> load("math", {"layers.0.mlp.experts.gate_up_proj.lora_A": (1, 32, 64)})
        'math'
        >>> registry.layout
        <MoELayout.SHARED_OUTER: 'shared-outer'>
    """
    if not isinstance(registry, LayoutRegistry):
        raise TypeError(
            "lora_guard.guard_adapter_load needs an lg.LayoutRegistry as its first argument, "
            f"got {type(registry).__name__}; create one per pool: registry = lg.LayoutRegistry()"
        )

    def decorate(fn: F) -> F:
        if STATE.off:
            return fn
        get_id = selector(fn, "adapter_id", adapter_id, decorator="lora_guard.guard_adapter_load")
        get_weights = selector(fn, "weights", weights, decorator="lora_guard.guard_adapter_load")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if STATE.off:
                return fn(*args, **kwargs)
            name = str(get_id(args, kwargs))
            registry._local.admission = None
            registry.admit(name, get_weights(args, kwargs))
            admission = registry._last_admission()
            try:
                return fn(*args, **kwargs)
            except BaseException:
                if admission is not None and admission[0] == name:
                    registry._undo(admission)  # a failed reload keeps the old admission
                raise

        return cast(F, wrapper)

    return decorate
