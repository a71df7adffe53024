"""`RecipeOutcome`: what the checks of a recipe's first adapter found about what every
adapter of the recipe shares (its config and header), reused for the others; and its
`PartsOutcome`, shared with the recipes of equal parts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ModuleOutcome", "PartsOutcome", "RecipeOutcome"]


@dataclass(frozen=True, slots=True)
class ModuleOutcome:
    """What `_module_checks` found for a recipe's modules when it reported nothing (an
    outcome with a violation is not kept: its message names the adapter)."""

    grouped: tuple[tuple[tuple[Any, ...], str, int, dict[str, Any]], ...]
    """The findings grouped by kind (`Grouped` items), for the violations said once."""
    ranks: tuple[tuple[int, str], ...]
    """Each rank with the first module at it."""


@dataclass(slots=True)
class PartsOutcome:
    """The module pass of the adapters whose parts are equal (`Parts.key`: the tensor
    entries and the config fields the key grammar reads, which are all a module rule reads
    of the config: `ModuleContext`), in one run; None: not found yet, or found with a
    violation that names an adapter (not kept)."""

    modules: ModuleOutcome | None = None
    """LG102, LG103, LG104, LG109 of each module, when they reported nothing."""


@dataclass(slots=True)
class RecipeOutcome:
    """The outcomes of one `Recipe` in one run: each is found with the recipe's first
    adapter that gets that far, then read by the others (the run's limits are fixed, and a
    recipe's adapters have the same config, tensors and modules). None or False: not found
    yet."""

    empty: tuple[tuple[str, ...], frozenset[str]] | None = None
    """LG107: the zero-size tensors, in the header's order and as a set."""
    unmixed: bool = False
    """LG002 within one adapter: the header's MoE weights were found in one layout."""
    packed_uniform: bool = False
    """LG111: every packed module's parts were found at one rank."""
    parts: PartsOutcome = field(default_factory=PartsOutcome)
    """The module pass: shared with the recipes of equal parts in the run (`check_adapters`
    hands each recipe's outcome the one of its parts)."""
