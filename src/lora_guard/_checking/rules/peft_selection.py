"""Which modules PEFT puts LoRA on when it loads an adapter, read from the config as PEFT
reads it (``peft/tuners/tuners_utils.py:check_target_module_exists``): ``exclude_modules``,
``modules_to_save``, ``target_modules``, ``layers_to_transform`` and ``layers_pattern``.
Shared by LG104 (weights of a module PEFT does not select are dropped) and LG202 (forms of
the layer selection PEFT fails on)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["PeftSelection", "peft_selection", "refused_form"]

_FIRST_INDEX = re.compile(r".*?\.[^.]*\.(?P<idx>\d+)\.")
"""PEFT's layer index without ``layers_pattern``: the first numbered part of the name."""
_PLAIN = re.compile(r"[\w-]+(?:\.[\w-]+)*")
"""A ``modules_to_save`` name or ``layers_pattern`` read here: no regex syntax (PEFT
interpolates these into regexes; anything else gets no verdict rather than a regex from a
file). ``target_modules`` / ``exclude_modules`` regexes are bounded when the config is read."""


def _ends_with(module: str, names: list[str]) -> str | None:
    """The entry of ``names`` that names ``module`` (the whole path, or its last parts)."""
    return next((n for n in names if module == n or module.endswith("." + n)), None)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _shown(value: Any, limit: int = 60) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class PeftSelection:
    """The modules PEFT selects under one config (each field as the config holds it)."""

    targets: str | list[str]
    """``target_modules``: a list of names (the path or its last parts), or a regex that
    must match the whole path."""
    excluded: str | list[str]
    """``exclude_modules``: the same forms; empty: none."""
    saved: list[str]
    """``modules_to_save``: never a LoRA target."""
    layers: Any
    """``layers_to_transform``: None for every layer, an int, or a list PEFT reads with ``in``
    (so ``1.0`` and ``true`` select layer 1)."""
    patterns: tuple[str, ...]
    """``layers_pattern``: where the layer index is (empty: the first numbered part)."""
    parameters: tuple[str, ...] = ()
    """``target_parameters``: ``<module>.<parameter>`` names (the path or its last parts)."""

    def layer_of(self, module: str) -> int | None:
        """The layer index PEFT reads from ``module``'s name; None: none found."""
        if not self.patterns:
            found = _FIRST_INDEX.match(module)
            return int(found["idx"]) if found else None
        for pattern in self.patterns:
            found = re.match(rf"(?:^|.*?\.){pattern}\.(?P<idx>\d+)\.", module)
            if found:
                return int(found["idx"])
        return None

    def left_out(self, module: str) -> str | None:
        """Why PEFT puts no LoRA on ``module``, or None when it does. A LoRA module inside
        another's wrapper (``mha.base_layer.out_proj``: PEFT's MultiheadAttention) is
        selected with the wrapper's module."""
        module = module.split(".base_layer.", 1)[0]
        if any(_ends_with(f"{module}.{p.rpartition('.')[2]}", [p]) for p in self.parameters):
            return None  # a parameter target_parameters names (PEFT's ParamWrapper)
        return self._not_targeted(module) or self._layer_left_out(module)

    def _not_targeted(self, module: str) -> str | None:
        if isinstance(self.excluded, str):
            if self.excluded and re.fullmatch(self.excluded, module):
                return f"exclude_modules {_shown(self.excluded)} matches it"
        elif (named := _ends_with(module, self.excluded)) is not None:
            return f"exclude_modules names it ({named!r})"
        saved = next((m for m in self.saved if f".{m}." in f".{module}."), None)
        if saved:  # PEFT: re.match(rf"(^|.*\.){m}($|\..*)", module)
            return f"modules_to_save names it ({saved!r})"
        if isinstance(self.targets, str):
            if not re.fullmatch(self.targets, module):
                return f"target_modules {_shown(self.targets)} does not match it"
        elif not _ends_with(module, self.targets):
            return f"target_modules {_shown(self.targets)} does not name it"
        return None

    def _layer_left_out(self, module: str) -> str | None:
        if self.layers is None or self.layers == []:
            return None
        index = self.layer_of(module)
        if index is None:
            return (f"layers_to_transform {_shown(self.layers)} is set and PEFT finds no "
                    "layer index in its name")
        selected = index == self.layers if isinstance(self.layers, int) else (
            index in self.layers)
        return None if selected else (
            f"layers_to_transform {_shown(self.layers)} leaves out its layer {index}")

def peft_selection(config: Mapping[str, Any]) -> PeftSelection | None:
    """The modules PEFT selects for this config; None where this reading gives no verdict:
    ``target_modules`` null (PEFT's defaults by model type) or ``all-linear`` (every linear
    layer of the base), a form PEFT refuses (`refused_form`), or a name or
    ``layers_pattern`` with regex syntax where PEFT reads it as a regex."""
    targets = config.get("target_modules")
    if targets is None or not isinstance(targets, (str, list)) or (
            isinstance(targets, str) and targets.lower() == "all-linear"):
        return None
    if refused_form(config) is not None:
        return None
    excluded = config.get("exclude_modules") or []
    saved = config.get("modules_to_save") or []
    raw = config.get("layers_pattern")
    patterns = [p for p in ([raw] if isinstance(raw, str) else raw or []) if p]
    if not (isinstance(excluded, str) or _strings(excluded)) or not _strings(saved) or not (
            _strings(patterns) and all(_PLAIN.fullmatch(n) for n in [*saved, *patterns])):
        return None  # names PEFT reads as regexes (saved, patterns): plain ones only
    parameters = config.get("target_parameters") or []
    if not _strings(parameters):
        return None
    return PeftSelection(targets, excluded, saved, config.get("layers_to_transform"),
                         tuple(patterns), tuple(parameters))


def refused_form(config: Mapping[str, Any]) -> tuple[str, str] | None:
    """(variant, what) for a layer selection PEFT fails on: ``layers-form`` for a
    ``layers_to_transform`` that is neither an integer nor a list (``0 in 'x'`` raises),
    ``layers-refused`` for what ``LoraConfig.__post_init__`` refuses."""
    value = config.get("layers_to_transform")
    pattern = config.get("layers_pattern")
    if value is not None and not isinstance(value, (int, list)):
        return "layers-form", repr(value) if isinstance(value, str) else _shown(value)
    regex = isinstance(config.get("target_modules"), str)
    if regex and value is not None:
        return "layers-refused", "layers_to_transform is set with target_modules a regex string"
    if regex and pattern is not None:
        return "layers-refused", "layers_pattern is set with target_modules a regex string"
    if pattern and value is None:
        return "layers-refused", "layers_pattern is set without layers_to_transform"
    return None
