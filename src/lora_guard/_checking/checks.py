"""Pure checks over metadata: they read shapes, dtypes, names and maps, never tensor data.

Each returns the violations it finds (an empty list when the invariant holds) and raises
nothing; the guards decide what to do with them according to the mode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lora_guard._core.errors import Violation, make_violation
from lora_guard._core.shapes import MAX_DIMS, shape_of
from lora_guard._reading.moe import MoELayout, classify_moe_weights

__all__ = [
    "MAX_DIMS",
    "MoELayout",
    "check_cache_entry",
    "check_moe_layouts",
    "check_slot_maps_violations",
    "classify_moe_weights",
    "dtype_name",
    "shape_of",
    "weights_of",
]


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
    holder = _held(slot_to_uid, empty)
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
        mapped = _slot_of(uid_to_slot, uid)
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


def _held(slot_to_uid: Mapping[int, Any] | Sequence[Any], empty: object) -> dict[int, Any]:
    """The slots in use: slot -> uid (a free slot holds ``empty``, or a value equal to it)."""
    pairs = slot_to_uid.items() if isinstance(slot_to_uid, Mapping) else enumerate(slot_to_uid)
    return {slot: uid for slot, uid in pairs
            if uid is not empty and (empty is None or uid != empty)}


def _slot_of(uid_to_slot: Mapping[Any, int], uid: object) -> int | None:
    try:
        return uid_to_slot.get(uid, None)
    except TypeError:
        if _hashable(uid):
            raise
        return None  # an unhashable id is in no map


def _hashable(obj: object) -> bool:
    try:
        hash(obj)
    except TypeError:
        return False
    return True
