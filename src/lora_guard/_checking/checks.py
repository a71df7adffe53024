"""Pure checks over metadata: they read shapes, dtypes, names and maps, never tensor data.

Each returns the violations it finds (an empty list when the invariant holds) and raises
nothing; the guards decide what to do with them according to the mode.
"""

from __future__ import annotations

import enum
import functools
import itertools
import operator
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from lora_guard._core.errors import Violation, make_violation

__all__ = [
    "MoELayout",
    "check_cache_entry",
    "check_moe_layouts",
    "check_slot_maps_violations",
    "classify_moe_weights",
    "dtype_name",
    "shape_of",
    "weights_of",
]


MAX_DIMS = 64
"""Most dims `shape_of` accepts (a real tensor has at most a handful)."""


def shape_of(obj: Any, *, name: str = "value") -> tuple[int, ...] | None:
    """The shape of a tensor, of tensor metadata (anything with ``.shape``) or of a shape.

    None for an object without a shape. A shape must be at most `MAX_DIMS` integers
    (``operator.index``: ``16.9`` is not a dim) that are not negative; anything else, an
    endless iterator as ``.shape``, or a jagged nested tensor, raises `TypeError` or
    `ValueError` naming ``name``.

    Example:
        >>> from lora_guard._checking.checks import shape_of
        >>> shape_of((8, 64)), shape_of("text")
        ((8, 64), None)
        >>> class Meta:
        ...     shape = (8.5, 64)
        >>> shape_of(Meta(), name="lora_A")
        Traceback (most recent call last):
        ...
        TypeError: lora_A: dim 0 of the shape is 8.5 (float), not an integer
    """
    try:
        shape = getattr(obj, "shape", None)
    except Exception as exc:  # a nested tensor raises RuntimeError for .shape
        raise TypeError(f"{name}: its .shape cannot be read ({type(exc).__name__}: "
                        f"{str(exc)[:120]})") from None
    if shape is None:
        if not isinstance(obj, (tuple, list)) or not all(
                isinstance(d, int) and not isinstance(d, bool) for d in obj):
            return None
        shape = obj
    if isinstance(shape, (str, bytes)):
        raise TypeError(f"{name}: its shape is the text {shape[:40]!r}, not a sequence of dims")
    try:
        dims = list(itertools.islice(iter(shape), MAX_DIMS + 1))
    except Exception:
        raise TypeError(f"{name}: its shape ({type(shape).__name__}) is not a sequence of "
                        "dims") from None
    if len(dims) > MAX_DIMS:
        raise ValueError(f"{name}: its shape has more than {MAX_DIMS} dims")
    return tuple(_dim(i, dim, name) for i, dim in enumerate(dims))


def _dim(i: int, dim: object, name: str) -> int:
    """Dim ``i`` of a shape as an int (``operator.index``), not negative."""
    try:
        value = operator.index(dim)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name}: dim {i} of the shape is {str(dim)[:40]} "
                        f"({type(dim).__name__}), not an integer") from None
    except Exception:  # a jagged tensor's nested int
        raise TypeError(f"{name}: dim {i} of the shape is ragged ({type(dim).__name__}); "
                        "pass a regular tensor") from None
    if value < 0:
        raise ValueError(f"{name}: dim {i} of the shape is {value}, a negative size")
    return value


def dtype_name(obj: Any) -> str | None:
    """``"bfloat16"`` for ``torch.bfloat16``, a tensor of it, or the safetensors ``"BF16"``."""
    dtype = getattr(obj, "dtype", obj)
    if dtype is None:
        return None
    text = str(dtype)
    return _DTYPE_ALIASES.get(text, text.removeprefix("torch."))


_DTYPE_ALIASES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
    "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}


def weights_of(obj: Any) -> Mapping[str, Any]:
    """A mapping of weight name -> tensor (or metadata) from a mapping or an adapter spec."""
    tensors = getattr(obj, "tensors", None)
    if isinstance(tensors, Mapping):
        return tensors
    if isinstance(obj, Mapping):
        return obj
    raise TypeError(
        f"expected a mapping of weight name -> tensor (or an lg.AdapterSpec), got "
        f"{type(obj).__name__}; pass e.g. a state dict or safetensors header metadata."
    )


# --- LG002: MoE layouts -------------------------------------------------------------------


class MoELayout(str, enum.Enum):
    """The layouts of MoE LoRA weights seen in the wild; one pool serves one of them.

    Example:
        >>> import lora_guard as lg
        >>> lg.MoELayout.SHARED_OUTER.value
        'shared-outer'
    """

    PER_EXPERT = "per-expert"
    """2D weights under ``experts.<i>.``, or packed 3D with dim 0 = the expert count."""
    SHARED_OUTER = "shared-outer"
    """Packed 3D whose outer weight (gate_up ``lora_A``, down ``lora_B``) has dim 0 = 1."""
    FLAT = "flat"
    """PEFT ``target_parameters``: 2D on the experts module with rank = r x experts."""

    def __str__(self) -> str:
        return self.value


_LORA_KEY = re.compile(r"(?:^|\.)lora_(?:A|B)(?:\.|$)")
_INDEXED_EXPERT = re.compile(r"(?:^|\.)experts\.(\d+)\.")
_FLAT_EXPERTS = re.compile(r"(?:^|\.)experts\.(?:base_layer\.)?lora_(?:A|B)(?:\.|$)")
_DOWN_NAMES = ("down", "w2")
_GATE_UP_NAMES = ("gate", "up", "w1", "w3")


def _projection(key: str) -> str:
    return key.rsplit(".lora_", 1)[0].rsplit(".", 1)[-1]


def _known_projection(key: str) -> bool:
    head = _projection(key)
    return any(name in head for name in _DOWN_NAMES + _GATE_UP_NAMES)


def _outer_side(key: str) -> str | None:
    """``"A"`` when the key is the outer weight of a gate/up projection, ``"B"`` for down."""
    head = _projection(key)
    is_b = ".lora_B" in key
    if any(name in head for name in _DOWN_NAMES):
        return "B" if is_b else None
    if any(name in head for name in _GATE_UP_NAMES):
        return None if is_b else "A"
    return None


@functools.lru_cache(maxsize=1 << 16)
def _moe_role(key: str) -> str | None:
    """What a weight's name alone says about the layout; adapters of one model share names,
    so this is computed once per name, and admission costs a look-up and a shape per weight.

    ``"indexed"`` (under ``experts.<i>.``), ``"outer"`` (gate/up A, down B), ``"inner"``
    (gate/up B, down A), ``"flat"`` (PEFT target_parameters), ``"other"``, or None when the
    key is not an MoE LoRA weight.
    """
    if "experts" not in key or not _LORA_KEY.search(key):
        return None
    if _INDEXED_EXPERT.search(key):
        return "indexed"
    if _outer_side(key) is not None:
        return "outer"
    if _known_projection(key):
        return "inner"
    return "flat" if _FLAT_EXPERTS.search(key) else "other"


def classify_moe_weights(weights: Mapping[str, Any]) -> list[tuple[str, MoELayout]]:
    """Each MoE LoRA weight that decides a layout, with the layout it shows, in key order."""
    found: list[tuple[str, MoELayout]] = []
    for key in sorted(weights):
        role = _moe_role(key)
        if role is None:
            continue
        if role == "indexed":
            found.append((key, MoELayout.PER_EXPERT))
            continue
        shape = shape_of(weights[key], name=key)
        if shape is None:
            continue
        if len(shape) == 3:
            if role == "outer":
                layout = MoELayout.SHARED_OUTER if shape[0] == 1 else MoELayout.PER_EXPERT
                found.append((key, layout))
            elif shape[0] == 1 and role != "inner":
                found.append((key, MoELayout.SHARED_OUTER))
            # Inner weights (gate_up B, down A) are per expert in both packed layouts.
        elif len(shape) == 2 and role == "flat":
            found.append((key, MoELayout.FLAT))
    return found


def check_moe_layouts(
    subject: str, weights: Mapping[str, Any]
) -> tuple[MoELayout | None, list[Violation]]:
    """The adapter's MoE layout (None for a dense adapter) and an LG002 if it mixes layouts."""
    classified = classify_moe_weights(weights)
    if not classified:
        return None, []
    first_key, layout = classified[0]
    for key, other in classified[1:]:
        if other is not layout:
            return layout, [
                make_violation(
                    "LG002", "within", subject,
                    layout=layout.value, first_key=first_key,
                    other_key=key, other_layout=other.value,
                )
            ]
    return layout, []


# --- LG003: cache entries ------------------------------------------------------------------


def check_cache_entry(key: object, cached: Any, weight: Any) -> Violation | None:
    """LG003 when ``cached`` (stored under ``key``) differs from ``weight`` in shape or dtype."""
    if cached is None:
        return None
    try:  # the hit path: two attribute compares, no conversions
        if cached.shape == weight.shape and cached.dtype == weight.dtype:
            return None
    except AttributeError:
        pass
    old_shape = shape_of(cached, name=f"the tensor cached under {key!r}")
    new_shape = shape_of(weight, name=f"the new weight for cache key {key!r}")
    old_dtype, new_dtype = dtype_name(cached), dtype_name(weight)
    if old_shape == new_shape and old_dtype == new_dtype:
        return None
    return make_violation(
        "LG003", "collision", str(key),
        old_shape=old_shape, old_dtype=old_dtype, new_shape=new_shape, new_dtype=new_dtype,
    )


# --- LG201: slot maps ----------------------------------------------------------------------


def _slot_items(slot_to_uid: Mapping[int, Any] | Sequence[Any]) -> Iterable[tuple[int, Any]]:
    if isinstance(slot_to_uid, Mapping):
        return slot_to_uid.items()
    return enumerate(slot_to_uid)


def check_slot_maps_violations(
    uid_to_slot: Mapping[Any, int],
    slot_to_uid: Mapping[int, Any] | Sequence[Any],
    *,
    slots: int | None = None,
    empty: object = None,
    subject: str = "slot map",
) -> list[Violation]:
    """LG201 for every way the two maps fail to be exact inverses within ``slots``.

    ``slot_to_uid`` is a mapping or a list indexed by slot; a slot holding ``empty`` is free.
    """
    found: list[Violation] = []
    if slots is None and not isinstance(slot_to_uid, Mapping):
        slots = len(slot_to_uid)
    holder = {slot: uid for slot, uid in _slot_items(slot_to_uid) if not _is_empty(uid, empty)}
    for uid, slot in uid_to_slot.items():
        if slots is not None and not (isinstance(slot, int) and 0 <= slot < slots):
            found.append(
                make_violation("LG201", "range", subject, uid=uid, slot=slot, last=slots - 1)
            )
        elif slot not in holder or holder[slot] != uid:
            found.append(
                make_violation(
                    "LG201", "not-inverse", subject,
                    uid=uid, slot=slot,
                    other=repr(holder[slot]) if slot in holder else "nothing",
                )
            )
    for slot, uid in holder.items():
        mapped = uid_to_slot.get(uid, None) if _hashable(uid) else None
        if mapped != slot:
            found.append(
                make_violation(
                    "LG201", "stale", subject, slot=slot, uid=uid,
                    mapped="no slot" if mapped is None else f"slot {mapped}",
                )
            )
    if slots is not None and len(uid_to_slot) > slots:
        found.append(
            make_violation("LG201", "exhausted", subject, needed=len(uid_to_slot), slots=slots)
        )
    return found


def _is_empty(uid: object, empty: object) -> bool:
    return uid is empty or (empty is not None and uid == empty)


def _hashable(obj: object) -> bool:
    try:
        hash(obj)
    except TypeError:
        return False
    return True
