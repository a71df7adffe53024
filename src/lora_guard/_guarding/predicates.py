"""Plain predicates: each invariant as a function that returns a bool and raises nothing;
and `assert_slot_maps_consistent`, the predicate's asserting twin."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

from typing_extensions import TypeIs

from lora_guard._checking.checks import (
    check_cache_entry,
    check_moe_layouts,
    check_slot_maps_violations,
    shape_of,
    weights_of,
)
from lora_guard._checking.dims import bind_dims, parse_spec
from lora_guard._core.config import report
from lora_guard._core.errors import LoRAGuardError
from lora_guard._guarding.shapes import frozen_dims

if TYPE_CHECKING:
    import torch

__all__ = [
    "assert_slot_maps_consistent",
    "cache_entry_matches",
    "check_slot_maps",
    "is_lora_guard_error",
    "layouts_uniform",
    "pool_shapes_stable",
    "shapes_conform",
    "slot_maps_consistent",
]


def pool_shapes_stable(obj: object, expected: Mapping[str, int | Sequence[int]]) -> bool:
    """LG001 as a predicate: do ``obj``'s pool shapes still match what the server expects?

    ``expected`` maps a frozen dim to its size (compared with `frozen_dims`), or an attribute
    of ``obj`` to its shape (e.g. ``{"_w1_delta": (4, 512, 32)}``). A dim not frozen yet, or an
    attribute that is still None, counts as stable: nothing has been allocated.

    Example:
        >>> import lora_guard as lg, torch
        >>> class Sink:
        ...     _w1_delta = torch.empty(4, 512, 32, device="meta")
        >>> lg.pool_shapes_stable(Sink(), {"_w1_delta": (4, 512, 32)})
        True
        >>> lg.pool_shapes_stable(Sink(), {"_w1_delta": (4, 512, 16)})
        False
    """
    frozen = frozen_dims(obj)
    for name, want in expected.items():
        if isinstance(want, int):
            if name in frozen and frozen[name] != want:
                return False
            continue
        value = getattr(obj, name, None)
        if value is None:
            continue
        if shape_of(value) != tuple(want):
            return False
    return True


def layouts_uniform(adapters: Mapping[str, Any] | Iterable[Any]) -> bool:
    """LG002 as a predicate: do these adapters (weights mappings or specs) share one MoE layout?

    Example:
        >>> import lora_guard as lg
        >>> shared = {"layers.0.mlp.experts.gate_up_proj.lora_A": (1, 32, 64)}
        >>> per_expert = {"layers.0.mlp.experts.0.gate_proj.lora_A.weight": (16, 64)}
        >>> lg.layouts_uniform([shared, shared])
        True
        >>> lg.layouts_uniform({"math": shared, "code": per_expert})
        False
    """
    items = adapters.values() if isinstance(adapters, Mapping) else adapters
    seen = set()
    for adapter in items:
        layout, violations = check_moe_layouts("adapter", weights_of(adapter))
        if violations:
            return False
        if layout is not None:
            seen.add(layout)
    return len(seen) <= 1


def cache_entry_matches(cached: torch.Tensor | None, weight: torch.Tensor) -> TypeGuard[
        torch.Tensor]:
    """LG003 as a predicate: is ``cached`` a tensor of ``weight``'s shape and dtype?

    Narrows ``cached`` to a tensor when True. (``TypeGuard`` rather than ``TypeIs``: a False
    result does not mean ``cached`` is None, so the negative branch must not narrow.)

    Example:
        >>> import lora_guard as lg, torch
        >>> w = torch.empty(16, 64)
        >>> lg.cache_entry_matches(torch.empty(16, 64), w), lg.cache_entry_matches(None, w)
        (True, False)
    """
    return cached is not None and check_cache_entry("", cached, weight) is None


def shapes_conform(
    specs: Mapping[str, str],
    values: Mapping[str, Any],
    *,
    where: Callable[[dict[str, int]], bool] | None = None,
) -> bool:
    """LG004 as a predicate: do ``values`` agree with the dim ``specs`` of `lora_guard.shapes`?

    Example:
        >>> import lora_guard as lg, torch
        >>> specs = {"a": "slots rank hidden", "b": "slots hidden rank"}
        >>> lg.shapes_conform(specs, {"a": torch.empty(4, 16, 64), "b": torch.empty(4, 64, 16)})
        True
        >>> lg.shapes_conform(specs, {"a": torch.empty(4, 16, 64), "b": torch.empty(4, 64, 8)})
        False
    """
    parsed = {arg: parse_spec(text, argument=arg) for arg, text in specs.items()}
    _, _, violations = bind_dims("shapes_conform", parsed, values, where=where)
    return not violations


def slot_maps_consistent(
    uid_to_slot: Mapping[Any, int],
    slot_to_uid: Mapping[int, Any] | Sequence[Any],
    *,
    slots: int | None = None,
    empty: object = None,
) -> bool:
    """LG201 as a predicate: are the adapter->slot and slot->adapter maps exact inverses?

    Example:
        >>> import lora_guard as lg
        >>> lg.slot_maps_consistent({"a": 0, "b": 1}, ["a", "b", None])
        True
        >>> lg.slot_maps_consistent({"a": 0, "b": 1}, ["a", "a", None])
        False
    """
    return not check_slot_maps_violations(uid_to_slot, slot_to_uid, slots=slots, empty=empty)


def assert_slot_maps_consistent(
    uid_to_slot: Mapping[Any, int],
    slot_to_uid: Mapping[int, Any] | Sequence[Any],
    *,
    slots: int | None = None,
    empty: object = None,
    subject: str = "slot map",
) -> None:
    """Report LG201 (raise, in ``raise`` mode) unless the slot maps are exact inverses.

    The asserting twin of `slot_maps_consistent`, as `assert_rank_consistent` is for ranks.
    ``slot_to_uid`` is a mapping or a list indexed by slot (its length is the slot count
    unless ``slots`` says otherwise); a slot holding ``empty`` is free. Pass another ``empty``
    marker when None is a real adapter id (sglang's base-model uid). Formerly
    ``check_slot_maps``, which still works with a ``DeprecationWarning``.

    Example:
        >>> import lora_guard as lg
        >>> lg.assert_slot_maps_consistent({"a": 0}, ["a", None])
        >>> lg.assert_slot_maps_consistent({"a": 0, "b": 1}, ["a", None])
        Traceback (most recent call last):
        ...
        lora_guard.RegistryError: LG201 registry-inconsistent: slot map: adapter 'b' maps to ...
    """
    report(check_slot_maps_violations(
        uid_to_slot, slot_to_uid, slots=slots, empty=empty, subject=subject))


def check_slot_maps(
    uid_to_slot: Mapping[Any, int],
    slot_to_uid: Mapping[int, Any] | Sequence[Any],
    *,
    slots: int | None = None,
    empty: object = None,
    subject: str = "slot map",
) -> None:
    """Deprecated name of `assert_slot_maps_consistent`.

    Every other ``check_*`` returns a report (`check_adapters`, `check_adapter`); this one
    raises, so it is named as the ``assert_*`` it is. Warns with a ``DeprecationWarning``
    naming the new name, then behaves exactly like it.

    Example:
        >>> import warnings, lora_guard as lg
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     lg.check_slot_maps({"a": 0}, ["a", None])
        >>> "assert_slot_maps_consistent" in str(caught[0].message)
        True
    """
    warnings.warn(
        "lora_guard.check_slot_maps is deprecated: use lora_guard.assert_slot_maps_consistent, "
        "the same check under the name of what it does (it raises; check_* functions return "
        "a report).",
        DeprecationWarning,
        stacklevel=2,
    )
    assert_slot_maps_consistent(uid_to_slot, slot_to_uid, slots=slots, empty=empty,
                                subject=subject)


def is_lora_guard_error(exc: BaseException) -> TypeIs[LoRAGuardError]:
    """True for an error raised by lora_guard, whatever builtin class it was caught as.

    Example:
        >>> import lora_guard as lg
        >>> try:
        ...     lg.assert_slot_maps_consistent({"a": 3}, [None])
        ... except RuntimeError as exc:
        ...     print(lg.is_lora_guard_error(exc) and exc.code)
        LG201
    """
    return isinstance(exc, LoRAGuardError)
