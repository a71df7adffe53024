"""The MoE layout of LoRA weights, read from their names and shapes alone: `MoELayout` and
`classify_moe_weights`. Reading an adapter records its layout; the LG002 checks (a layout
mixed within an adapter, or across a pool) live in the checking layer."""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from typing import Any

from lora_guard._core.shapes import shape_of
from lora_guard._reading.bounded import Bounded

__all__ = ["MoELayout", "classify_moe_weights", "moe_layout"]


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


def _moe_role(key: str) -> str | None:
    """`_role_of` a weight's name, remembered (`_ROLES`)."""
    return _ROLES.get_or_make(key, lambda: _role_of(key))


def _role_of(key: str) -> str | None:
    """What a weight's name alone says about the layout.

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
    # only a name under "experts" has a role (`_role_of`): a dense adapter's are not looked up
    for key in sorted([key for key in weights if "experts" in key]):
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


def moe_layout(weights: Mapping[str, Any]) -> MoELayout | None:
    """The layout of an adapter's first MoE LoRA weight (in key order), None for a dense one.

    Example:
        >>> from lora_guard._reading.moe import moe_layout
        >>> p = "model.layers.0.mlp.experts.gate_up_proj"
        >>> moe_layout({f"{p}.lora_A": (1, 8, 64), f"{p}.lora_B": (4, 256, 8)})
        <MoELayout.SHARED_OUTER: 'shared-outer'>
        >>> moe_layout({"model.layers.0.self_attn.q_proj.lora_A.weight": (8, 64)}) is None
        True
    """
    classified = classify_moe_weights(weights)
    return classified[0][1] if classified else None


_ROLES: Bounded[str, str | None] = Bounded(
    1 << 16, "MoE roles of weight names: the adapters of one model share their names, so "
    "admission costs a look-up and a shape per weight")
