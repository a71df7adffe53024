"""lora_guard: stop LoRA serving bugs before they reach the GPU.

One catalogue of invariants (`INVARIANTS`), checked by runtime guards (decorators and proxies
over pools, loaders and caches), by a checker of adapters on disk, and by a pytest plugin.
"""

from __future__ import annotations

from ._cache import GuardedCache, guard_cache_lookup, weight_cache_key
from ._catalogue import INVARIANTS, Invariant
from ._checks import MoELayout
from ._config import Recording, configure, get_mode, recording
from ._errors import (
    AdapterError,
    CacheKeyCollisionError,
    LoRAGuardError,
    LoRAGuardWarning,
    MixedMoELayoutError,
    PoolShapeDriftError,
    RankDivergenceError,
    RegistryError,
    ShapeContractError,
    Violation,
)
from ._layouts import LayoutRegistry, detect_moe_layout, guard_adapter_load
from ._predicates import (
    cache_entry_matches,
    check_slot_maps,
    is_lora_guard_error,
    layouts_uniform,
    pool_shapes_stable,
    shapes_conform,
    slot_maps_consistent,
)
from ._shapes import frozen_dims, shapes, unfreeze

__version__ = "0.1.0"

__all__ = [
    "INVARIANTS",
    "AdapterError",
    "CacheKeyCollisionError",
    "GuardedCache",
    "Invariant",
    "LayoutRegistry",
    "LoRAGuardError",
    "LoRAGuardWarning",
    "MixedMoELayoutError",
    "MoELayout",
    "PoolShapeDriftError",
    "RankDivergenceError",
    "Recording",
    "RegistryError",
    "ShapeContractError",
    "Violation",
    "cache_entry_matches",
    "check_slot_maps",
    "configure",
    "detect_moe_layout",
    "frozen_dims",
    "get_mode",
    "guard_adapter_load",
    "guard_cache_lookup",
    "is_lora_guard_error",
    "layouts_uniform",
    "pool_shapes_stable",
    "recording",
    "shapes",
    "shapes_conform",
    "slot_maps_consistent",
    "unfreeze",
    "weight_cache_key",
]

# Errors are raised from private modules; show them under the package users import.
for _cls in (
    LoRAGuardError, PoolShapeDriftError, MixedMoELayoutError, CacheKeyCollisionError,
    ShapeContractError, AdapterError, RegistryError, RankDivergenceError, LoRAGuardWarning,
):
    _cls.__module__ = __name__
del _cls
