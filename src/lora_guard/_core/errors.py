"""Violations and the exceptions that carry them, all derived from the catalogue."""

from __future__ import annotations

import re
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lora_guard._core.catalogue import INVARIANTS, Invariant

__all__ = [
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
    "error_class",
    "make_violation",
]

_EMPTY: Mapping[str, Any] = types.MappingProxyType({})


@dataclass(frozen=True)
class Violation:
    """One broken invariant: what was observed, about what, and how to fix it.

    Example:
        >>> import lora_guard as lg
        >>> v = lg.Violation("LG003", "cache key 'k' holds another shape.", "Use keys with shape.",
        ...                  subject="k")
        >>> v.invariant
        'cache-key-collision'
    """

    code: str
    """The invariant's code, e.g. ``"LG001"``."""
    message: str
    """What happened: the subject, the old and the new values."""
    hint: str
    """The first fix, one line."""
    subject: str = ""
    """What the violation is about: an adapter, a call, a cache key."""
    details: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    """The values involved, for programs and reports."""
    location: str = ""
    """Where it was observed (``file:line in function``), when known."""

    def __post_init__(self) -> None:
        if not isinstance(self.details, types.MappingProxyType):  # read-only, whatever came in
            object.__setattr__(self, "details", types.MappingProxyType(dict(self.details)))

    def __reduce__(self) -> tuple[Any, ...]:  # mapping proxies don't pickle; dicts do
        return (Violation, (self.code, self.message, self.hint, self.subject,
                            dict(self.details), self.location))

    @property
    def invariant(self) -> str:
        """The invariant's slug, e.g. ``"pool-shape-drift"``; ``"unregistered"`` once a
        made-up invariant was removed (`remove_invariant`) after it was reported."""
        entry = INVARIANTS.get(self.code)
        return entry.slug if entry is not None else "unregistered"

    def __str__(self) -> str:
        return f"{self.code} {self.invariant}: {self.message} Fix: {self.hint}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form: code, invariant, message, hint, subject, details, location."""
        return {
            "code": self.code,
            "invariant": self.invariant,
            "message": self.message,
            "hint": self.hint,
            "subject": self.subject,
            "details": {k: _jsonable(v) for k, v in self.details.items()},
            "location": self.location,
        }


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    return str(value)


class LoRAGuardError(Exception):
    """Base of every error lora_guard raises for a broken invariant.

    Each subclass also inherits the builtin class the engines raise for the same problem, so
    an existing ``except RuntimeError`` or ``except ValueError`` keeps working.

    Example:
        >>> import lora_guard as lg
        >>> try:
        ...     lg.assert_slot_maps_consistent({"a": 0}, {0: "b"})
        ... except lg.LoRAGuardError as e:
        ...     print(e.code, e.invariant)
        LG201 registry-inconsistent
    """

    violations: list[Violation]
    """Every violation found by the refused call; the first is the headline."""

    def __init__(self, violations: Sequence[Violation] | str, /, *, code: str = "") -> None:
        if isinstance(violations, str):  # raised by hand, e.g. in a user's own check
            code = code or _only_code(type(self))
            violations = [Violation(code, violations, INVARIANTS[code].hint)]
        if not violations:
            raise TypeError(f"{type(self).__name__} needs a message or at least one Violation")
        self.violations = list(violations)
        super().__init__("\n".join(str(v) for v in self.violations))

    @property
    def code(self) -> str:
        """The code of the first violation."""
        return self.violations[0].code

    @property
    def invariant(self) -> str:
        """The slug of the first violation's invariant."""
        return self.violations[0].invariant

    @property
    def hint(self) -> str:
        """The first fix for the first violation."""
        return self.violations[0].hint

    @property
    def details(self) -> Mapping[str, Any]:
        """The values involved in the first violation."""
        return self.violations[0].details

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across processes (xdist, spawn)
        return (type(self), (self.violations,))


class PoolShapeDriftError(LoRAGuardError, RuntimeError):
    """LG001: a dimension frozen at first allocation changed on a later call.

    Example:
        >>> import lora_guard as lg, torch
        >>> @lg.shapes(a="slots rank", frozen=("rank",))
        ... def set_lora(a): ...
        >>> set_lora(torch.empty(4, 16, device="meta"))
        >>> try:
        ...     set_lora(torch.empty(4, 8, device="meta"))
        ... except RuntimeError as e:
        ...     print(type(e).__name__, e.code, e.details["old"], e.details["new"])
        PoolShapeDriftError LG001 16 8
    """


class MixedMoELayoutError(LoRAGuardError, RuntimeError):
    """LG002: MoE adapters sharing one pool disagree on layout.

    Example:
        >>> import lora_guard as lg
        >>> pool = lg.LayoutRegistry()
        >>> _ = pool.admit("math", {"layers.0.mlp.experts.gate_up_proj.lora_A": (1, 32, 64)})
        >>> try:
        ...     pool.admit("code", {"layers.0.mlp.experts.0.gate_proj.lora_A.weight": (16, 64)})
        ... except RuntimeError as e:
        ...     print(type(e).__name__, e.code, e.details["owner"])
        MixedMoELayoutError LG002 math
    """


class CacheKeyCollisionError(LoRAGuardError, ValueError):
    """LG003: one cache key maps to tensors of different shape or dtype.

    Example:
        >>> import lora_guard as lg, torch
        >>> store = lg.GuardedCache({"q_proj.lora_A": torch.empty(16, 64, device="meta")})
        >>> try:
        ...     store["q_proj.lora_A"] = torch.empty(8, 64, device="meta")
        ... except ValueError as e:
        ...     print(type(e).__name__, e.code, e.details["old_shape"], e.details["new_shape"])
        CacheKeyCollisionError LG003 (16, 64) (8, 64)
    """


class ShapeContractError(LoRAGuardError, ValueError):
    """LG004: a call's arguments disagree with their declared dims.

    Example:
        >>> import lora_guard as lg, torch
        >>> @lg.shapes(a="rank hidden", b="hidden rank")
        ... def lora_delta(a, b): ...
        >>> try:
        ...     lora_delta(torch.empty(16, 64, device="meta"), torch.empty(64, 8, device="meta"))
        ... except ValueError as e:
        ...     print(type(e).__name__, e.code, e.details["argument"], e.details["dim"])
        ShapeContractError LG004 b rank
    """


class AdapterError(LoRAGuardError, ValueError):
    """LG101-LG110: an adapter that cannot be served as it is.

    The checker reports these as violations; a loader that refuses an adapter raises this.

    Example:
        >>> import lora_guard as lg
        >>> err = lg.AdapterError("adapter 'math': rank 64 of q_proj is above the served "
        ...                       "max rank 16.", code="LG101")
        >>> err.code, err.invariant, isinstance(err, ValueError)
        ('LG101', 'rank-exceeds-limit', True)
    """


class RegistryError(LoRAGuardError, RuntimeError):
    """LG201: adapter/slot bookkeeping disagrees with itself.

    Example:
        >>> import lora_guard as lg
        >>> try:
        ...     lg.assert_slot_maps_consistent({"math": 0}, ["chat", None])
        ... except RuntimeError as e:
        ...     print(type(e).__name__, e.code, len(e.violations))
        RegistryError LG201 2
    """


class RankDivergenceError(LoRAGuardError, RuntimeError):
    """LG301: tensor-parallel ranks disagree on pool shapes, slot maps or adapter sets.

    Example:
        >>> import lora_guard as lg
        >>> err = lg.RankDivergenceError("slot map: rank 1 differs from rank 0.")
        >>> err.code, err.invariant, isinstance(err, RuntimeError)
        ('LG301', 'rank-divergence', True)
    """


class LoRAGuardWarning(UserWarning):
    """Issued instead of an error in ``warn`` mode; ``.violation`` holds the record.

    Example:
        >>> import lora_guard as lg, warnings
        >>> issubclass(lg.LoRAGuardWarning, UserWarning)
        True
    """

    def __init__(self, violation: Violation) -> None:
        self.violation = violation
        super().__init__(str(violation))


_CLASSES: dict[str, type[LoRAGuardError]] = {
    cls.__name__: cls
    for cls in (
        PoolShapeDriftError,
        MixedMoELayoutError,
        CacheKeyCollisionError,
        ShapeContractError,
        AdapterError,
        RegistryError,
        RankDivergenceError,
    )
}


# Raised from this private module, shown under the package users import.
for _cls in (*_CLASSES.values(), LoRAGuardError, LoRAGuardWarning):
    _cls.__module__ = "lora_guard"
del _cls


def error_class(code: str) -> type[LoRAGuardError]:
    """The exception class that raises invariant ``code``, from its catalogue entry."""
    return _CLASSES[INVARIANTS[code].error]


def _only_code(cls: type[LoRAGuardError]) -> str:
    codes = [inv.code for inv in INVARIANTS.values() if _CLASSES[inv.error] is cls]
    if len(codes) != 1:
        raise TypeError(
            f"{cls.__name__}(message) needs code=...: it raises {codes or 'no code'}"
        )
    return codes[0]


_MAX_TEXT = 300


_LONG_NUMBER = re.compile(r"\d{21,}")
_UNPRINTABLE = re.compile(r"[^\w \t!-/:-@\[-`{-~]")  # fast path: most text has none


def _short_number(match: re.Match[str]) -> str:
    digits = match.group()
    return f"{digits[:5]}...{digits[-4:]} ({len(digits):,} digits)"


def _escape(char: str) -> str:
    if char.isprintable():
        return char
    return char.encode("unicode_escape", "backslashreplace").decode("ascii")


def printable(text: str) -> str:
    """``text`` (from a file a user uploaded) as a terminal can show it: long numbers
    shortened (``12345...6789 (5,000 digits)``), control characters and lone surrogates
    escaped (``\\ud800``). Every message goes through this, in `make_violation`."""
    if len(text) > 20 and any(c.isdigit() for c in text):
        text = _LONG_NUMBER.sub(_short_number, text)
    if _UNPRINTABLE.search(text):
        text = "".join(_escape(c) for c in text)
    return text


def _clip(text: str) -> str:
    """`printable` text of at most about 300 characters."""
    text = printable(text)
    if len(text) <= _MAX_TEXT:
        return text
    return f"{text[:200]}...{text[-60:]} ({len(text):,} chars)"


def _huge(value: Any) -> Any:
    """An int too long for str() (past Python's 4,300-digit limit) as a short text."""
    if isinstance(value, int) and value.bit_length() > 14_000:
        return f"an integer of about {int(value.bit_length() * 0.30103):,} digits"
    return value


def make_violation(
    code: str, variant: str, subject: str, /, *, hint: str | None = None, **details: Any
) -> Violation:
    """Build a violation of ``code`` with the message template ``variant`` of its entry."""
    inv: Invariant = INVARIANTS[code]
    # Names come from files users upload: a 1 MB tensor key must not become a 1 MB message.
    details = {k: _clip(v) if isinstance(v, str) else v for k, v in details.items()}
    shown = {k: _huge(v) for k, v in details.items()}
    message = inv.messages[variant].format(subject=_clip(subject), **shown)
    if len(message) > 40:  # a number from a file (an int detail, a shape) printed short
        message = _LONG_NUMBER.sub(_short_number, message)
    return Violation(code, message, hint or _fill(inv.hint_for(variant), details), subject,
                     details)


def _fill(fix: str, details: Mapping[str, Any]) -> str:
    """A fix that names what was found: ``{name}`` fields filled from the details (a fix
    without fields, or whose fields the details lack, is kept as written)."""
    if "{" not in fix:
        return fix
    try:
        return fix.format(**details)
    except (KeyError, IndexError, ValueError, AttributeError):
        return fix
