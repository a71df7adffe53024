"""Hypothesis strategies for LoRA adapters, adapter sets and pool operations.

Draw `AdapterPlan` values (what an adapter on disk looks like: rank, targets, layers, dtype,
MoE layout, deliberate defects), sets of them with distinct names, or sequences of
`Operation` values (load, unload, hot-swap, resize) to property-test your own pool. Plans
are plain values, cheap to draw and shrink; write one with `AdapterPlan.write` into a
directory you own, or draw written folders directly with `adapters(directory)`. Nothing here
writes anywhere else.

Requires ``hypothesis`` (``pip install lora-guard[hypothesis]``).

Example:
    >>> from hypothesis import given, settings
    >>> from lora_guard import strategies as lgst
    >>> @settings(max_examples=20, database=None)
    ... @given(lgst.operations(max_loaded=2))
    ... def test_never_more_than_two_loaded(ops):
    ...     loaded = set()
    ...     for op in ops:
    ...         if op.kind == "load":
    ...             loaded.add(op.name)
    ...         elif op.kind == "unload":
    ...             loaded.remove(op.name)
    ...         assert len(loaded) <= 2
    >>> test_never_more_than_two_loaded()
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from hypothesis import strategies as st

from ._testing.adapter_writer import (
    _PAIR_DEFECTS,
    ATTENTION_TARGETS,
    DEFECTS,
    MLP_TARGETS,
    write_adapter,
)

__all__ = [
    "DTYPES",
    "MOE_LAYOUTS",
    "OPERATION_KINDS",
    "RANKS",
    "AdapterPlan",
    "Operation",
    "adapter_plans",
    "adapter_sets",
    "adapters",
    "operations",
]

T = TypeVar("T")

RANKS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
"""Ranks drawn by default (vLLM's allowed ranks up to 64)."""
DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")
"""Adapter dtypes `write_adapter` can write."""
MOE_LAYOUTS: tuple[str, ...] = ("per-expert", "packed", "shared-outer", "flat")
"""MoE layouts `write_adapter` can write (``None`` is a dense adapter)."""
OPERATION_KINDS: tuple[str, ...] = ("load", "unload", "swap", "resize")
"""The kinds of `Operation`."""
Kind = Literal["load", "unload", "swap", "resize"]


def _compact_repr(obj: Any, positional: tuple[str, ...]) -> str:
    """``Cls(a, b, field=value)``: only the fields that differ from their defaults."""
    parts = []
    for f in fields(obj):
        value = getattr(obj, f.name)
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        if f.name in positional:
            parts.append(repr(value))
        elif value != default:
            parts.append(f"{f.name}={value!r}")
    return f"{type(obj).__name__}({', '.join(parts)})"


@dataclass(frozen=True, repr=False)
class AdapterPlan:
    """One adapter as Hypothesis draws it: `write` turns it into a real PEFT folder.

    The fields are `lora_guard.testing.write_adapter`'s options; ``name`` names the folder
    and the adapter id in operations.

    Example:
        >>> import tempfile
        >>> from lora_guard.strategies import AdapterPlan
        >>> plan = AdapterPlan("a", rank=16, defects=("orphan-b",))
        >>> sorted(plan.expected_codes)
        ['LG103']
        >>> plan.write(tempfile.mkdtemp()).name
        'a'
    """

    name: str = "a"
    rank: int = 8
    targets: tuple[str, ...] = ("q_proj", "v_proj")
    layers: int = 2
    dtype: str = "float16"
    moe_layout: str | None = None
    experts: int = 4
    defects: tuple[str, ...] = ()
    base: Mapping[str, int] = field(default_factory=dict)
    """Base-model sizes passed through: hidden_size, intermediate_size, num_heads, ..."""

    @property
    def expected_codes(self) -> frozenset[str]:
        """The codes the checker reports for `defects` (empty for a healthy adapter).

        With several defects one may hide another (a missing config hides weight defects),
        so treat it as the codes to expect among, not an exact list, past one defect.
        """
        return frozenset(DEFECTS[d] for d in self.defects)

    def options(self) -> dict[str, Any]:
        """Keyword arguments for `lora_guard.testing.write_adapter`."""
        return {
            "rank": self.rank, "targets": self.targets, "layers": self.layers,
            "dtype": self.dtype, "moe_layout": self.moe_layout, "experts": self.experts,
            "defects": self.defects, **dict(self.base),
        }

    def write(self, directory: str | os.PathLike[str]) -> Path:
        """Write the adapter as ``directory/name``; return the folder."""
        return write_adapter(Path(directory) / self.name, **self.options())

    def __repr__(self) -> str:
        return _compact_repr(self, ("name",))

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # Hypothesis' reports
        printer.text(repr(self))

    def __str__(self) -> str:
        extra = f", {self.moe_layout}" if self.moe_layout else ""
        bad = f", defects={list(self.defects)}" if self.defects else ""
        return f"{self.name}(rank {self.rank}, {'+'.join(self.targets)}{extra}{bad})"


@dataclass(frozen=True, repr=False)
class Operation:
    """One step on a pool: load, unload, hot-swap (new weights under a loaded name) or resize.

    ``plan`` is the adapter for ``load`` and ``swap``; ``slots`` and ``max_rank`` the new
    sizes for ``resize``; ``name`` the adapter id (empty for ``resize``).

    Example:
        >>> from lora_guard.strategies import AdapterPlan, Operation
        >>> print(Operation("swap", "a", AdapterPlan("a", rank=4)))
        swap a -> a(rank 4, q_proj+v_proj)
        >>> print(Operation("resize", slots=8, max_rank=64))
        resize slots=8 max_rank=64
        >>> Operation("load", "a", AdapterPlan("a", rank=4))   # what Hypothesis prints
        Operation('load', 'a', plan=AdapterPlan('a', rank=4))
    """

    kind: Kind
    name: str = ""
    plan: AdapterPlan | None = None
    slots: int | None = None
    max_rank: int | None = None

    def __repr__(self) -> str:
        return _compact_repr(self, ("kind", "name") if self.name else ("kind",))

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # Hypothesis' reports
        printer.text(repr(self))

    def __str__(self) -> str:
        if self.kind == "resize":
            return f"resize slots={self.slots} max_rank={self.max_rank}"
        if self.kind == "unload":
            return f"unload {self.name}"
        if self.kind == "swap":
            return f"swap {self.name} -> {self.plan}"
        if self.plan is not None and self.plan.name == self.name:
            return f"load {self.plan}"
        return f"load {self.name} as {self.plan}"


def _values(value: st.SearchStrategy[T] | Iterable[T], option: str) -> st.SearchStrategy[T]:
    """A strategy as given, or one value of a non-empty collection."""
    if isinstance(value, st.SearchStrategy):
        return value
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(
            f"{option} takes a Hypothesis strategy or a collection of values, got {value!r}"
        )
    items = list(value)
    if not items:
        raise ValueError(f"{option} needs at least one value")
    return st.sampled_from(items)


def _known(names: Iterable[str], known: Sequence[str], option: str) -> tuple[str, ...]:
    if isinstance(names, str):
        names = (names,)
    items = tuple(names)
    unknown = [n for n in items if n not in known]
    if unknown:
        raise ValueError(f"{option}: unknown {unknown}; choose among {', '.join(known)}")
    return items


def _check_size(value: int, option: str, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{option} must be an int >= {minimum}, got {value!r}")
    return value


def adapter_plans(
    *,
    names: st.SearchStrategy[str] | None = None,
    ranks: st.SearchStrategy[int] | Iterable[int] = RANKS,
    targets: Iterable[str] = ATTENTION_TARGETS + MLP_TARGETS,
    layers: st.SearchStrategy[int] | Iterable[int] = (1, 2),
    dtypes: st.SearchStrategy[str] | Iterable[str] = ("float16", "bfloat16"),
    moe_layouts: Iterable[str | None] = (None,),
    experts: st.SearchStrategy[int] | Iterable[int] = (2, 4),
    defects: Iterable[str] = (),
    max_defects: int = 1,
    base: Mapping[str, int] | None = None,
) -> st.SearchStrategy[AdapterPlan]:
    """Adapters to write: rank, a non-empty subset of targets, layers, dtype, layout, defects.

    Every option takes a collection of values to draw from (``ranks``, ``layers``,
    ``dtypes`` and ``experts`` also take a strategy). By default plans are healthy dense
    adapters; pass ``moe_layouts=MOE_LAYOUTS`` (``None`` among them for dense) to draw MoE
    adapters, and ``defects=DEFECTS`` (or some of its names) to draw up to ``max_defects``
    deliberate defects per adapter. A plan drawn with an MoE layout always has an MLP target.

    Example:
        >>> from hypothesis import given, settings
        >>> from lora_guard import strategies as lgst
        >>> @settings(max_examples=25, database=None)
        ... @given(lgst.adapter_plans(ranks=(8, 16), moe_layouts=lgst.MOE_LAYOUTS))
        ... def test_plans(plan):
        ...     assert plan.rank in (8, 16) and plan.targets
        ...     assert plan.moe_layout is None or {"gate_proj", "up_proj", "down_proj"} & set(
        ...         plan.targets)
        >>> test_plans()
    """
    target_pool = _known(targets, ATTENTION_TARGETS + MLP_TARGETS, "adapter_plans(targets=...)")
    if not target_pool:
        raise ValueError("adapter_plans(targets=...) needs at least one target module")
    layouts = tuple(moe_layouts)
    _known([x for x in layouts if x is not None], MOE_LAYOUTS, "adapter_plans(moe_layouts=...)")
    if not layouts:
        raise ValueError("adapter_plans(moe_layouts=...) needs at least one value (None: dense)")
    mlp = [t for t in target_pool if t in MLP_TARGETS]
    if not mlp and any(x is not None for x in layouts):
        raise ValueError(
            "adapter_plans: an MoE layout needs an MLP target (gate_proj, up_proj, down_proj) "
            "among targets"
        )
    defect_pool = _known(sorted(defects), sorted(DEFECTS), "adapter_plans(defects=...)")
    _check_size(max_defects, "adapter_plans(max_defects=...)")
    rank_st = _values(ranks, "adapter_plans(ranks=...)")
    layer_st = _values(layers, "adapter_plans(layers=...)")
    dtype_st = _values(dtypes, "adapter_plans(dtypes=...)")
    expert_st = _values(experts, "adapter_plans(experts=...)")
    name_st = names if names is not None else st.just("a")
    base_sizes = dict(base or {})

    @st.composite
    def draw_plan(draw: Callable[[st.SearchStrategy[Any]], Any]) -> AdapterPlan:
        layout = draw(st.sampled_from(layouts))
        chosen = draw(st.lists(st.sampled_from(target_pool), min_size=1, unique=True))
        if layout is not None and not any(t in MLP_TARGETS for t in chosen):
            chosen.append(draw(st.sampled_from(mlp)))
        layers = draw(layer_st)
        drawn_defects: tuple[str, ...] = ()
        if defect_pool and max_defects:
            drawn_defects = _one_pair_each(tuple(draw(st.lists(
                st.sampled_from(defect_pool), max_size=max_defects, unique=True))),
                _fewest_pairs(chosen, layers, layout))
        return AdapterPlan(
            name=draw(name_st),
            rank=draw(rank_st),
            targets=tuple(t for t in target_pool if t in chosen),
            layers=layers,
            dtype=draw(dtype_st),
            moe_layout=layout,
            experts=draw(expert_st) if layout is not None else 4,
            defects=drawn_defects,
            base=base_sizes,
        )

    return draw_plan()


def _fewest_pairs(targets: Iterable[str], layers: int, layout: str | None) -> int:
    """The LoRA pairs an adapter of these targets has at least (an MoE layout may pack its
    MLP targets into one pair a layer)."""
    chosen = set(targets)
    if layout is None:
        return len(chosen) * layers
    attention = len(chosen - set(MLP_TARGETS))
    return (attention + (1 if chosen & set(MLP_TARGETS) else 0)) * layers


def _one_pair_each(defects: tuple[str, ...], pairs: int) -> tuple[str, ...]:
    """``defects`` with those that break a LoRA pair of their own (`write_adapter` refuses
    more of them than the adapter has pairs) cut to ``pairs``."""
    kept, breaking = [], 0
    for defect in defects:
        if defect in _PAIR_DEFECTS:
            if breaking == pairs:
                continue
            breaking += 1
        kept.append(defect)
    return tuple(kept)


def adapter_sets(
    plans: st.SearchStrategy[AdapterPlan] | None = None,
    *,
    min_size: int = 1,
    max_size: int = 4,
    same_layout: bool = False,
) -> st.SearchStrategy[list[AdapterPlan]]:
    """Lists of adapters with distinct names ``a0``, ``a1``, ... as one server would load.

    ``same_layout=True`` gives every MoE adapter of a set the layout of the first one (a set
    one pool can serve); the default mixes layouts freely, which is how LG002 is reached.

    Example:
        >>> from hypothesis import given, settings
        >>> from lora_guard import strategies as lgst
        >>> @settings(max_examples=20, database=None)
        ... @given(lgst.adapter_sets(lgst.adapter_plans(moe_layouts=lgst.MOE_LAYOUTS),
        ...                          max_size=3, same_layout=True))
        ... def test_sets(plans):
        ...     assert len({p.name for p in plans}) == len(plans) <= 3
        ...     assert len({p.moe_layout for p in plans} - {None}) <= 1
        >>> test_sets()
    """
    _check_size(min_size, "adapter_sets(min_size=...)")
    _check_size(max_size, "adapter_sets(max_size=...)", minimum=max(min_size, 1))
    source = plans if plans is not None else adapter_plans()

    def name(items: list[AdapterPlan]) -> list[AdapterPlan]:
        out = [replace(p, name=f"a{i}") for i, p in enumerate(items)]
        if same_layout:
            layout = next((p.moe_layout for p in out if p.moe_layout), None)
            out = [replace(p, moe_layout=layout) if p.moe_layout else p for p in out]
        return out

    return st.lists(source, min_size=min_size, max_size=max_size).map(name)


def adapters(
    directory: str | os.PathLike[str],
    plans: st.SearchStrategy[AdapterPlan] | None = None,
) -> st.SearchStrategy[Path]:
    """Adapter folders written under ``directory`` (yours: a ``tmp_path_factory`` folder).

    Each draw writes a fresh uniquely named subfolder and returns its path; the directory
    must exist when drawing. Prefer drawing `AdapterPlan` values and writing them in the
    test when you need the plan too.

    Example:
        >>> import tempfile
        >>> from hypothesis import given, settings
        >>> from lora_guard import strategies as lgst
        >>> import lora_guard as lg
        >>> where = tempfile.mkdtemp()
        >>> @settings(max_examples=5, database=None)
        ... @given(lgst.adapters(where, lgst.adapter_plans(ranks=(4,))))
        ... def test_on_disk(path):
        ...     assert (path / "adapter_config.json").exists()
        >>> test_on_disk()
    """
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(
            f"adapters(directory) takes a folder path, got {type(directory).__name__}; pass "
            "e.g. tmp_path_factory.mktemp('adapters')"
        )
    root = Path(directory)
    source = plans if plans is not None else adapter_plans()

    def write(plan: AdapterPlan) -> Path:
        if not root.is_dir():
            raise FileNotFoundError(
                f"lora_guard.strategies.adapters: {root} is not a directory; create it first"
            )
        holder = Path(tempfile.mkdtemp(prefix=f"{plan.name}-", dir=root))
        return plan.write(holder)

    return source.map(write)


def operations(
    plans: st.SearchStrategy[AdapterPlan] | None = None,
    *,
    names: Sequence[str] = ("a", "b", "c", "d"),
    kinds: Iterable[str] = OPERATION_KINDS,
    min_size: int = 1,
    max_size: int = 12,
    max_loaded: int | None = None,
    slots: st.SearchStrategy[int] | Iterable[int] = (1, 2, 4, 8),
    max_ranks: st.SearchStrategy[int] | Iterable[int] = (8, 16, 32, 64),
    valid_only: bool = True,
) -> st.SearchStrategy[list[Operation]]:
    """Sequences of load / unload / swap / resize operations over adapter ids ``names``.

    With ``valid_only`` (default) a sequence is one a correct server accepts in order:
    ``load`` a name not loaded (and, with ``max_loaded``, only while fewer are loaded),
    ``unload`` or ``swap`` a loaded name. With ``valid_only=False`` any operation may come
    at any time (double loads, unloads of unknown ids, loads past ``max_loaded``), to check
    that the pool refuses them cleanly. ``resize`` carries new ``slots`` and ``max_rank``.

    Example:
        >>> from hypothesis import given, settings
        >>> from lora_guard import strategies as lgst
        >>> @settings(max_examples=20, database=None)
        ... @given(lgst.operations(kinds=("load", "swap"), max_size=5))
        ... def test_swaps_follow_loads(ops):
        ...     loaded = set()
        ...     for op in ops:
        ...         assert op.kind == "load" or op.name in loaded
        ...         loaded.add(op.name)
        >>> test_swaps_follow_loads()
    """
    kind_pool = _known(kinds, OPERATION_KINDS, "operations(kinds=...)")
    ids = list(dict.fromkeys(names))
    _check_operation_options(kind_pool, ids, names, valid_only=valid_only)
    _check_size(min_size, "operations(min_size=...)")
    _check_size(max_size, "operations(max_size=...)", minimum=max(min_size, 1))
    if max_loaded is not None:
        _check_size(max_loaded, "operations(max_loaded=...)", minimum=1)
    if not isinstance(valid_only, bool):
        raise TypeError(f"operations(valid_only=...) must be True or False, got {valid_only!r}")
    space = _OperationSpace(
        kinds=kind_pool, ids=tuple(ids), max_loaded=max_loaded, valid_only=valid_only,
        plans=plans if plans is not None else adapter_plans(),
        slots=_values(slots, "operations(slots=...)"),
        max_ranks=_values(max_ranks, "operations(max_ranks=...)"),
    )

    @st.composite
    def draw_ops(draw: Callable[[st.SearchStrategy[Any]], Any]) -> list[Operation]:
        return space.draw_sequence(draw, draw(st.integers(min_size, max_size)))

    return draw_ops()


def _check_operation_options(
    kind_pool: Sequence[str], ids: Sequence[Any], names: Sequence[str], *, valid_only: bool
) -> None:
    if not kind_pool:
        raise ValueError("operations(kinds=...) needs at least one kind")
    if "load" not in kind_pool and valid_only and set(kind_pool) & {"unload", "swap"}:
        raise ValueError(
            "operations(kinds=...): 'unload' and 'swap' need 'load' when valid_only=True"
        )
    if not ids or not all(isinstance(n, str) and n for n in ids):
        raise ValueError(f"operations(names=...) needs non-empty adapter ids, got {names!r}")


@dataclass(frozen=True)
class _OperationSpace:
    """What `operations` draws from, and the bookkeeping of which ids are loaded."""

    kinds: tuple[str, ...]
    ids: tuple[str, ...]
    max_loaded: int | None
    valid_only: bool
    plans: st.SearchStrategy[AdapterPlan]
    slots: st.SearchStrategy[int]
    max_ranks: st.SearchStrategy[int]

    def possible(self, loaded: list[str]) -> list[str]:
        """The kinds a correct server accepts now (every kind unless ``valid_only``)."""
        if not self.valid_only:
            return list(self.kinds)
        free = any(n not in loaded for n in self.ids)
        room = self.max_loaded is None or len(loaded) < self.max_loaded
        return [k for k in self.kinds if (k == "load" and free and room)
                or (k in ("unload", "swap") and loaded) or k == "resize"]

    def draw_sequence(self, draw: Callable[[st.SearchStrategy[Any]], Any],
                      count: int) -> list[Operation]:
        loaded: list[str] = []
        ops: list[Operation] = []
        while len(ops) < count:
            possible = self.possible(loaded)
            if not possible:  # e.g. only loads allowed and the pool is full
                break
            ops.append(self.draw_one(draw, draw(st.sampled_from(possible)), loaded))
        return ops

    def draw_one(self, draw: Callable[[st.SearchStrategy[Any]], Any], kind: Kind,
                 loaded: list[str]) -> Operation:
        """One operation of ``kind``, updating ``loaded`` as a correct server would."""
        if kind == "resize":
            return Operation("resize", slots=draw(self.slots), max_rank=draw(self.max_ranks))
        if not self.valid_only:
            name = draw(st.sampled_from(self.ids))
        elif kind == "load":
            name = draw(st.sampled_from([n for n in self.ids if n not in loaded]))
        else:
            name = draw(st.sampled_from(loaded))
        if kind == "unload":
            if name in loaded:
                loaded.remove(name)
            return Operation("unload", name)
        if kind == "load" and name not in loaded:
            loaded.append(name)
        return Operation(kind, name, replace(draw(self.plans), name=name))
