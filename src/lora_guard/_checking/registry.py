"""One invariant, one unit: a catalogue entry and the check that enforces it, registered
together by code.

An invariant of a single adapter is written as one function under one decorator, in one
module: the decorator holds the catalogue entry (slug, title, summary, triggers, fixes, message
templates, ...), the function finds the violations::

    from lora_guard._checking.registry import adapter_invariant
    from lora_guard._core.errors import make_violation

    @adapter_invariant(
        code="LG150", slug="alpha-missing", title="lora_alpha is missing",
        summary="...", triggers=("...",), fixes=("Save lora_alpha in adapter_config.json.",),
        error="AdapterError",
        messages={"missing": "{subject}: adapter_config.json has no lora_alpha."},
    )
    def alpha_missing(subject, spec, limits):
        if "lora_alpha" not in spec.config:
            yield make_violation("LG150", "missing", subject)

Registering the entry puts it in `lora_guard.INVARIANTS` (so ``lora-guard codes``, ``lora-guard
explain``, the pytest plugin's codes and the docs reference show it), and registering the check
makes `check_adapters`, `lora_guard.check_adapter` and the integrations that run the checker
report it: the checker calls `registered_violations` once per adapter.

Example:
    >>> from lora_guard._checking.registry import registered_checks
    >>> isinstance(registered_checks(), tuple)
    True
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from lora_guard._core.catalogue import INVARIANTS, Invariant, entry, register, unregister
from lora_guard._core.errors import _CLASSES, Violation
from lora_guard._reading.adapters import AdapterSpec

if TYPE_CHECKING:
    from lora_guard._checking.limits import ServingLimits

__all__ = [
    "BUILT_IN_ORDER",
    "AdapterCheck",
    "adapter_codes",
    "adapter_invariant",
    "registered_checks",
    "registered_violations",
    "remove_invariant",
]

AdapterCheck = Callable[[str, AdapterSpec, "ServingLimits"], Iterable[Violation]]
"""A per-adapter check: ``(subject, spec, limits) -> violations`` (a list or a generator).

``subject`` names the adapter in messages (``adapter 'path'``); the check reads the spec's
metadata only and raises nothing for a bad adapter: a finding is a `Violation`."""

BUILT_IN_ORDER: tuple[str, ...] = (
    "LG115", "LG116", "LG105", "LG118", "LG104", "LG103", "LG107", "LG102", "LG101",
    "LG111", "LG112", "LG106", "LG109", "LG121", "LG002")
"""The codes of the built-in checks of one adapter (`check_spec`), in the order a report
lists them: what the adapter holds first (no tensors, an init, features), then its keys, its
modules, its ranks, its dtypes, its fit to the base. The one list of them: `adapter_codes`,
``skip=`` and the report order read it; a code registered with `adapter_invariant` follows
them, in code order."""

_RANK = {code: i for i, code in enumerate(BUILT_IN_ORDER)}


def report_rank(code: str) -> int:
    """Where a violation of ``code`` goes in one adapter's list (registered codes last)."""
    return _RANK.get(code, len(_RANK))


def adapter_codes() -> tuple[str, ...]:
    """Every code the checks of one adapter can report (built in and registered), in code
    order: what ``skip=`` of `check_adapter` and `spec_violations` accepts."""
    return tuple(sorted({*BUILT_IN_ORDER, *_CHECKS}))


_Check = TypeVar("_Check", bound=AdapterCheck)
_CHECKS: dict[str, AdapterCheck] = {}
_ORDERED: tuple[tuple[str, AdapterCheck], ...] = ()  # by code; replaced whole on each change
_LOCK = threading.Lock()


def adapter_invariant(**fields: Any) -> Callable[[_Check], _Check]:
    """Decorator: register a catalogue entry (the keyword arguments, as `lora_guard.Invariant`
    takes them) together with the per-adapter check it decorates.

    Refuses (ValueError, nothing registered) a code or slug already taken, an unknown
    ``error`` class name, a function that is not callable; the function is returned unchanged.
    """
    error = fields.get("error")
    if error not in _CLASSES:
        raise ValueError(
            f"adapter_invariant(error={error!r}): the error is the name of a lora_guard error "
            f"class, one of {', '.join(sorted(_CLASSES))}"
        )
    invariant = entry(**fields)

    def decorate(check: _Check) -> _Check:
        if not callable(check):
            raise TypeError(f"@adapter_invariant decorates a check function, got {check!r}")
        with _LOCK:
            register(invariant)
            _CHECKS[invariant.code] = check
            _reorder()
        return check

    return decorate


def _reorder() -> None:
    global _ORDERED
    _ORDERED = tuple((code, _CHECKS[code]) for code in sorted(_CHECKS))


def registered_checks() -> tuple[tuple[Invariant, AdapterCheck], ...]:
    """The invariants defined with their check, in code order, with that check."""
    return tuple((INVARIANTS[code], check) for code, check in _ORDERED)


def registered_violations(subject: str, spec: AdapterSpec,
                          limits: ServingLimits) -> list[Violation]:
    """The hook of the checker: every registered per-adapter check run on one adapter. Called
    once per adapter, so it reads one tuple (no lock, no sort): none registered costs a
    branch."""
    checks = _ORDERED
    if not checks:
        return []
    found: list[Violation] = []
    for _, check in checks:
        found.extend(check(subject, spec, limits))
    return found


def remove_invariant(code: str) -> None:
    """Remove an invariant added with `adapter_invariant` (a test's made-up one), entry and
    check; the built-in entries stay."""
    with _LOCK:
        unregister(code)
        _CHECKS.pop(code, None)
        _reorder()
