"""What the rules of one adapter share: how findings are grouped and counted in messages, the
packed modules, the names of features."""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

__all__ = ["FEATURE_TEXT", "MAX_PER_KIND", "PACKED", "PART_OF", "Expected", "Grouped", "more",
           "share", "total_bytes"]

MAX_PER_KIND = 10
"""Most violations of one kind reported for one adapter (the rest are counted)."""

Expected = tuple[int | None, str]
"""An expected dim and where it comes from, e.g. ``(64, "hidden_size 64")``; None: unknown."""

FEATURE_TEXT = {
    "dora": "DoRA",
    "lora_bias": "a LoRA bias",
    "bias": "trained biases",
    "modules_to_save": "full weights of modules_to_save",
    "trainable_tokens": "trainable tokens",
    "peft_type": "a PEFT method other than LoRA",
    "alora": "activated LoRA",
    "layer_replication": "layer replication",
    "qalora": "QALoRA",
    "bdlora": "block-diagonal LoRA (BD-LoRA)",
    "added_tokens": "added tokens",
}


def share(part: int, whole: int) -> str:
    """``part`` as a percentage of ``whole``, for messages (``"93"``, ``"<1"``)."""
    if whole <= 0:
        return "0"
    share = 100 * part / whole
    return "<1" if 0 < share < 1 else f"{share:.0f}"


def more(first: str, count: int) -> str:
    return first if count <= 1 else f"{first} (and {count - 1} more)"


class Grouped:
    """Collects (variant, values) -> first subject and count, to report each kind once."""

    def __init__(self) -> None:
        self.items: dict[tuple[Any, ...], list[Any]] = {}

    def add(self, group: tuple[Any, ...], name: str, details: dict[str, Any],
            count: int = 1) -> None:
        entry = self.items.setdefault(group, [name, 0, details])
        entry[1] += count


PACKED: Mapping[str, frozenset[str]] = types.MappingProxyType({
    "qkv_proj": frozenset({"q_proj", "k_proj", "v_proj"}),
    "gate_up_proj": frozenset({"gate_proj", "up_proj"}),
    "w13": frozenset({"w1", "w3"}),
})
"""Packed module -> the parts an adapter may name it by (vLLM ``packed_modules_mapping``,
sglang ``get_normalized_target_modules``)."""
PART_OF = {part: packed for packed, parts in PACKED.items() for part in parts}


def total_bytes(spec: Any) -> int:
    """The bytes of every tensor of an adapter (an `AdapterSpec`), for a part's share."""
    return sum(t.nbytes for t in spec.tensors.values())
