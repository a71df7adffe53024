"""`Memo`: what one run's checks remember across the adapters of a recipe."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from lora_guard._reading.adapters import LoRAModuleSpec

__all__ = ["Memo", "ModuleOutcome", "remember"]


class ModuleOutcome(NamedTuple):
    """What `_module_checks` found for one header's modules at one config ``r``."""

    modules: Mapping[str, LoRAModuleSpec]
    tensors: Mapping[str, Any]
    grouped: tuple[tuple[tuple[Any, ...], str, int, dict[str, Any]], ...]
    ranks: tuple[tuple[int, str], ...]



class Memo:
    """What one run's checks remember across adapters: outcomes that depend only on a
    header's tensors and modules (and the run's fixed limits). The reader hands adapters whose
    headers differ only in their metadata (a recipe's adapters) the same ``tensors`` and
    ``modules`` mappings, so each outcome is computed once per recipe, not once per adapter.
    Entries are keyed by the mappings' identities and hold the mappings (an identity cannot
    be reused while its entry lives); each memory is bounded."""

    __slots__ = ("empty", "modules", "moe", "packed")

    def __init__(self) -> None:
        self.empty: dict[int, tuple[Mapping[str, Any],
                                    tuple[tuple[str, ...], frozenset[str]]]] = {}
        self.modules: dict[tuple[int, int], ModuleOutcome] = {}
        self.moe: dict[int, Mapping[str, Any]] = {}
        self.packed: dict[int, Mapping[str, Any]] = {}


_MEMO_SIZE = 256


def remember(memory: dict[Any, Any], key: Any, value: Any) -> None:
    if len(memory) >= _MEMO_SIZE:
        memory.clear()
    memory[key] = value
