"""One invariant, one unit: the checks of one adapter, registered by code.

A built-in code of one adapter is two modules of the same name, one per layer: its words in
``lora_guard._core.catalogue`` (``lg101_rank_exceeds_limit.py``: ``ENTRY``) and its check in
``lora_guard._checking.invariants`` (``lg101_rank_exceeds_limit.py``), registered here with
`adapter_check`. A check reads one `AdapterContext` (``lora_guard._checking.rules.context``:
the adapter, the limits, and the facts several checks share, computed once) and yields
violations. A check's ``position`` is where its violations go in a report: what the adapter
holds first (no tensors, an init, features), then its keys, its modules, its ranks, its dtypes,
its fit to the base. The order of a report, the codes ``skip=`` accepts and the codes of an
engine's rules are read from what is registered here: there is no list of codes to edit.

A code defined outside lora_guard (a plugin's, a test's) is entry and check in one decorator,
`adapter_invariant`, which registers both; its violations follow the built-in ones, in code
order::

    from lora_guard._checking.registry import adapter_invariant
    from lora_guard._core.errors import make_violation

    @adapter_invariant(
        code="LG150", slug="alpha-missing", title="lora_alpha is missing",
        summary="...", triggers=("...",), fixes=("Save lora_alpha in adapter_config.json.",),
        error="AdapterError",
        messages={"missing": "{subject}: adapter_config.json has no lora_alpha."},
    )
    def alpha_missing(ctx):
        if "lora_alpha" not in ctx.spec.config:
            yield make_violation("LG150", "missing", ctx.subject)

Example:
    >>> from lora_guard._checking.registry import registered_checks
    >>> isinstance(registered_checks(), tuple)
    True
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from lora_guard._core.catalogue import INVARIANTS, Invariant, entry, register, unregister
from lora_guard._core.errors import _CLASSES, Violation
from lora_guard._reading.adapters import LoRAModuleSpec

__all__ = [
    "AdapterCheck",
    "BuiltInCheck",
    "ModuleRule",
    "adapter_check",
    "adapter_invariant",
    "built_in_checks",
    "module_rule",
    "module_rules",
    "plugin_checks",
    "plugin_codes",
    "registered_checks",
    "remove_invariant",
]

# The context is `lora_guard._checking.rules.context.AdapterContext`, a layer above this one
# (it runs the module rules registered here): Any in these aliases, the type in each check.
AdapterCheck = Callable[[Any], Iterable[Violation]]
"""A check of one adapter: ``check(ctx) -> violations`` (a list or a generator).

``ctx.subject`` names the adapter in messages (``adapter 'path'``); the check reads the
spec's metadata only and raises nothing for a bad adapter: a finding is a `Violation`."""

ModuleRule = Callable[[Any, LoRAModuleSpec, Any, list[Violation]], None]
"""The part of a check that looks at one LoRA module: run for every module in the one pass
over an adapter's modules (`AdapterContext.modules`) with a ``ModuleContext`` (what of the
limits a module is held to: served modules, engine rules, the base's dims; the config's
``PARTS_FIELDS``; the vocab), it adds findings to ``grouped`` (one violation per kind, with a
count) or, for a finding that names the adapter, to ``found``. What it finds is remembered
under those values and the adapter's parts: a rule reads nothing else. Of a module's names
(its path, its keys) a rule reads what the same module of every layer shares (the path
without its layer index: its tower, type, block) and its layer index only against the
base's layer count, since the pass runs the rules once per such shape and says each
module's findings by its own names (`lora_guard._checking.rules.context`, which lists the
cases where a module is matched by its whole path and every module is checked alone)."""


@dataclass(frozen=True)
class BuiltInCheck:
    """A built-in check of one adapter: its code, where its violations go in a report, and
    the check."""

    code: str
    position: int
    check: AdapterCheck


_BUILT_IN: dict[str, BuiltInCheck] = {}
_MODULE_RULES: dict[str, tuple[ModuleRule, bool]] = {}
_Fn = TypeVar("_Fn", bound=Callable[..., Any])


def adapter_check(code: str, *, position: int) -> Callable[[_Fn], _Fn]:
    """Decorator of a built-in check (in ``lora_guard._checking.invariants``): registers it
    for ``code``, whose entry must be in the catalogue, at ``position`` in a report.

    Refuses (ValueError) a code without an entry, a code or position already taken."""
    if code not in INVARIANTS:
        raise ValueError(f"adapter_check({code!r}): no catalogue entry has this code; add its "
                         "module to lora_guard/_core/catalogue/ first")

    def decorate(check: _Fn) -> _Fn:
        taken = [c for c in _BUILT_IN.values() if c.code == code or c.position == position]
        if taken:
            raise ValueError(f"adapter_check({code!r}, position={position}): taken by "
                             f"{taken[0].code} at position {taken[0].position}")
        _BUILT_IN[code] = BuiltInCheck(code, position, check)
        return check

    return decorate


def module_rule(code: str, *, empty_halves: bool = False) -> Callable[[_Fn], _Fn]:
    """Decorator of the part of ``code``'s check that looks at one module at a time (see
    `ModuleRule`). ``empty_halves``: it also sees the modules with a zero-size half (which
    the other rules skip: LG107 reports them)."""

    def decorate(rule: _Fn) -> _Fn:
        if code in _MODULE_RULES:
            raise ValueError(f"module_rule({code!r}): {code} has a module rule already")
        _MODULE_RULES[code] = (rule, empty_halves)
        return rule

    return decorate


def built_in_checks() -> tuple[BuiltInCheck, ...]:
    """The built-in checks registered so far, in report order (all of them once
    ``lora_guard._checking.invariants`` is imported: read them there)."""
    return tuple(sorted(_BUILT_IN.values(), key=lambda c: c.position))


def module_rules() -> tuple[tuple[str, ModuleRule, bool], ...]:
    """The module rules registered so far: (code, rule, sees the modules with a zero-size
    half), in code order."""
    return tuple((code, *_MODULE_RULES[code]) for code in sorted(_MODULE_RULES))


def plugin_codes() -> tuple[str, ...]:
    """The codes of `adapter_invariant`, in code order."""
    return tuple(code for code, _ in _ORDERED)


_Check = TypeVar("_Check", bound=AdapterCheck)
_CHECKS: dict[str, AdapterCheck] = {}
_ORDERED: tuple[tuple[str, AdapterCheck], ...] = ()  # by code; replaced whole on each change
_LOCK = threading.Lock()


def adapter_invariant(**fields: Any) -> Callable[[_Check], _Check]:
    """Decorator: register a catalogue entry (the keyword arguments, as `lora_guard.Invariant`
    takes them) together with the check of one adapter it decorates (``check(ctx)``).

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
    """The invariants defined with `adapter_invariant`, in code order, with their check."""
    return tuple((INVARIANTS[code], check) for code, check in _ORDERED)


def plugin_checks() -> tuple[tuple[str, AdapterCheck], ...]:
    """The checks of `adapter_invariant`, in code order: one tuple read per adapter (no
    lock, no sort)."""
    return _ORDERED


def remove_invariant(code: str) -> None:
    """Remove an invariant added with `adapter_invariant` (a test's made-up one), entry and
    check; the built-in entries stay."""
    with _LOCK:
        unregister(code)
        _CHECKS.pop(code, None)
        _reorder()
