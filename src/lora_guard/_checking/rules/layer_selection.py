"""Which layers PEFT puts LoRA on, read from ``layers_to_transform`` and ``layers_pattern``
as PEFT reads them (``peft/tuners/tuners_utils.py:check_target_module_exists``): shared by
LG104 (weights of a layer left out are dropped) and LG202 (forms PEFT fails on)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["LayerSelection", "layer_selection", "refused_form"]

_FIRST_INDEX = re.compile(r".*?\.[^.]*\.(?P<idx>\d+)\.")
"""PEFT's layer index without ``layers_pattern``: the first numbered part of the name."""
_PLAIN_PATTERN = re.compile(r"[\w-]+(?:\.[\w-]+)*")
"""A ``layers_pattern`` read here: a module path without regex syntax (PEFT interpolates it
into a regex; anything else gets no verdict rather than a regex from a file)."""


@dataclass(frozen=True)
class LayerSelection:
    """The layers PEFT selects: ``indices`` as PEFT compares them (``==`` for one integer,
    ``in`` for a list, so ``1.0`` and ``true`` select layer 1), the index found by
    ``patterns`` (empty: the first numbered part of the module's name)."""

    value: Any
    patterns: tuple[str, ...]

    def index_of(self, module: str) -> int | None:
        """The layer index PEFT reads from ``module``'s name; None: none (never selected)."""
        if not self.patterns:
            found = _FIRST_INDEX.match(module)
            return int(found["idx"]) if found else None
        for pattern in self.patterns:
            found = re.match(rf"(?:^|.*?\.){pattern}\.(?P<idx>\d+)\.", module)
            if found:
                return int(found["idx"])
        return None

    def selects(self, module: str) -> bool:
        index = self.index_of(module)
        if index is None:
            return False
        if isinstance(self.value, int):
            return index == self.value
        return index in self.value  # a list: PEFT's `in` (JSON lists never hold a str 0)


def layer_selection(config: Mapping[str, Any]) -> LayerSelection | None:
    """The layers PEFT selects for this config; None where it selects every layer (no
    ``layers_to_transform``, an empty list), where the form is refused (`refused_form`), or
    where ``layers_pattern`` is more than a plain module path (no verdict)."""
    value = config.get("layers_to_transform")
    if value is None or value == [] or refused_form(config) is not None:
        return None
    raw = config.get("layers_pattern")
    patterns = [raw] if isinstance(raw, str) else raw if isinstance(raw, list) else []
    patterns = [p for p in patterns if p]  # PEFT: an empty pattern means any
    if not all(isinstance(p, str) and _PLAIN_PATTERN.fullmatch(p) for p in patterns):
        return None
    return LayerSelection(value, tuple(patterns))


def refused_form(config: Mapping[str, Any]) -> tuple[str, str] | None:
    """(variant, what) for a layer selection PEFT fails on: ``layers-form`` for a
    ``layers_to_transform`` that is neither an integer nor a list (``int in 'x'`` raises),
    ``layers-refused`` for what ``LoraConfig.__post_init__`` refuses."""
    value = config.get("layers_to_transform")
    pattern = config.get("layers_pattern")
    if value is not None and not isinstance(value, (int, list)):
        return "layers-form", _shown(value)
    regex = isinstance(config.get("target_modules"), str)
    if regex and value is not None:
        return "layers-refused", "layers_to_transform is set with target_modules a regex string"
    if regex and pattern is not None:
        return "layers-refused", "layers_pattern is set with target_modules a regex string"
    if pattern and value is None:
        return "layers-refused", "layers_pattern is set without layers_to_transform"
    return None


def _shown(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
