"""lora_guard: stop LoRA serving bugs before they reach the GPU.

One catalogue of invariants (`INVARIANTS`), checked by runtime guards (decorators and proxies
over pools, loaders and caches), by a checker of adapters on disk, and by a pytest plugin.

Public names are imported on first use (PEP 562), so that ``import lora_guard`` (and the
pytest plugin's entry module, which lives in this package) costs nothing until a guard is
used; ``from lora_guard import shapes`` and ``lg.shapes`` work as usual.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._checking.check_adapters import Report, ServingLimits, adapter_servable, check_adapters
    from ._checking.one_adapter import check_adapter
    from ._core.catalogue import INVARIANTS, Invariant
    from ._core.config import Recording, configure, get_mode, recording
    from ._core.errors import (
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
    from ._guarding.cache import GuardedCache, guard_cache_lookup, weight_cache_key
    from ._guarding.distributed import (
        assert_rank_consistent,
        guard_rank_consistency,
        rank_consistent,
        rank_fingerprint,
    )
    from ._guarding.layouts import LayoutRegistry, detect_moe_layout, guard_adapter_load
    from ._guarding.predicates import (
        assert_slot_maps_consistent,
        cache_entry_matches,
        check_slot_maps,
        is_lora_guard_error,
        layouts_uniform,
        pool_shapes_stable,
        shapes_conform,
        slot_maps_consistent,
    )
    from ._guarding.shapes import frozen_dims, shapes, unfreeze
    from ._reading.adapters import AdapterSpec, LoRAModuleSpec, TensorInfo
    from ._reading.inspect import inspect_adapter
    from ._reading.moe import MoELayout

__version__ = "0.1.0"

# Where each public name lives; the TYPE_CHECKING imports above say the same for type
# checkers, and a test keeps the two in step.
_PUBLIC: dict[str, tuple[str, ...]] = {
    "._reading.adapters": ("AdapterSpec", "LoRAModuleSpec", "TensorInfo"),
    "._reading.inspect": ("inspect_adapter",),
    "._guarding.cache": ("GuardedCache", "guard_cache_lookup", "weight_cache_key"),
    "._core.catalogue": ("INVARIANTS", "Invariant"),
    "._checking.check_adapters": ("Report", "ServingLimits", "adapter_servable", "check_adapters"),
    "._reading.moe": ("MoELayout",),
    "._checking.one_adapter": ("check_adapter",),
    "._core.config": ("Recording", "configure", "get_mode", "recording"),
    "._guarding.distributed": (
        "assert_rank_consistent",
        "guard_rank_consistency",
        "rank_consistent",
        "rank_fingerprint",
    ),
    "._core.errors": (
        "AdapterError",
        "CacheKeyCollisionError",
        "LoRAGuardError",
        "LoRAGuardWarning",
        "MixedMoELayoutError",
        "PoolShapeDriftError",
        "RankDivergenceError",
        "RegistryError",
        "ShapeContractError",
        "Violation",
    ),
    "._guarding.layouts": ("LayoutRegistry", "detect_moe_layout", "guard_adapter_load"),
    "._guarding.predicates": (
        "assert_slot_maps_consistent",
        "cache_entry_matches",
        "check_slot_maps",
        "is_lora_guard_error",
        "layouts_uniform",
        "pool_shapes_stable",
        "shapes_conform",
        "slot_maps_consistent",
    ),
    "._guarding.shapes": ("frozen_dims", "shapes", "unfreeze"),
}
_HOME = {name: module for module, names in _PUBLIC.items() for name in names}

__all__ = [
    "INVARIANTS",
    "AdapterError",
    "AdapterSpec",
    "CacheKeyCollisionError",
    "GuardedCache",
    "Invariant",
    "LayoutRegistry",
    "LoRAGuardError",
    "LoRAGuardWarning",
    "LoRAModuleSpec",
    "MixedMoELayoutError",
    "MoELayout",
    "PoolShapeDriftError",
    "RankDivergenceError",
    "Recording",
    "RegistryError",
    "Report",
    "ServingLimits",
    "ShapeContractError",
    "TensorInfo",
    "Violation",
    "adapter_servable",
    "assert_rank_consistent",
    "assert_slot_maps_consistent",
    "cache_entry_matches",
    "check_adapter",
    "check_adapters",
    "check_slot_maps",
    "configure",
    "detect_moe_layout",
    "frozen_dims",
    "get_mode",
    "guard_adapter_load",
    "guard_cache_lookup",
    "guard_rank_consistency",
    "inspect_adapter",
    "is_lora_guard_error",
    "layouts_uniform",
    "pool_shapes_stable",
    "rank_consistent",
    "rank_fingerprint",
    "recording",
    "shapes",
    "shapes_conform",
    "slot_maps_consistent",
    "unfreeze",
    "weight_cache_key",
]


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'lora_guard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later look-ups are plain module attributes
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
