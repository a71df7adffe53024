"""The one catalogue of invariants: a registry by code, one module per code.

Every fact about an invariant lives in its entry: code, slug, the error class that raises it,
its message templates, its hint (the first fix), the docs' sections and `lora-guard explain`.
Nothing else in the package spells a message or a hint.

Each built-in code's entry is a module of this package, named for its code and slug
(``lg101_rank_exceeds_limit.py`` holds ``ENTRY``, LG101's entry): the modules found here are
imported and registered when the package is, in code order, and a module whose name does not
match its entry's code and slug is refused. There is no list of codes to edit: a new module is
a new code. The check of an adapter code lives one layer up, in the module of the same name
under ``lora_guard._checking.invariants`` (CONTRIBUTING, "Add an invariant").

`INVARIANTS` is a read-only view of the registry; `register` adds an entry (refusing a code
that is taken or malformed). An invariant defined with its check in one unit
(``lora_guard._checking.registry.adapter_invariant``, a plugin's) registers itself the same
way, so the catalogue, ``lora-guard codes``/``explain``, the pytest summary and the docs
reference see it without another edit.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterator, Mapping

from lora_guard._core.catalogue._invariant import Invariant, entry, fix_as_documented

__all__ = ["INVARIANTS", "Invariant", "entry", "fix_as_documented", "register", "unregister"]

_CODE_MODULE = re.compile(r"lg\d{3}_[a-z0-9_]+")


def _built_in() -> tuple[Invariant, ...]:
    """The entries of this package's code modules, in code order; a module whose name is not
    its entry's code and slug (``lg101_rank_exceeds_limit``) is refused."""
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not _CODE_MODULE.fullmatch(info.name):
            continue
        invariant = importlib.import_module(f"{__name__}.{info.name}").ENTRY
        expected = f"{invariant.code.lower()}_{invariant.slug.replace('-', '_')}"
        if info.name != expected:
            raise ImportError(f"{__name__}.{info.name} holds {invariant.code} "
                              f"{invariant.slug}: name the module {expected}")
        found.append(invariant)
    return tuple(found)


_ENTRIES = _built_in()

_REGISTRY: dict[str, Invariant] = {}
_ORDER: tuple[str, ...] = ()  # the codes in code order, replaced whole on each change
_BUILT_IN: frozenset[str] = frozenset(e.code for e in _ENTRIES)
_CODE = re.compile(r"LG\d{3}")
_SLUG = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


def register(invariant: Invariant) -> Invariant:
    """Add ``invariant`` to the catalogue, kept in code order; return it.

    Refuses (ValueError, the catalogue unchanged) a code that is not ``LG`` and three digits,
    a code or slug already registered, a slug that is not kebab-case, or an entry without a
    fix or a message.
    """
    if not isinstance(invariant, Invariant):
        raise TypeError(f"register() takes an Invariant, got {type(invariant).__name__}")
    problem = _problem(invariant)
    if problem:
        raise ValueError(f"cannot register invariant {invariant.code!r}: {problem}")
    global _ORDER
    _REGISTRY[invariant.code] = invariant  # no entry is ever missing, even for an instant
    _ORDER = tuple(sorted(_REGISTRY))
    return invariant


def _problem(invariant: Invariant) -> str | None:
    if not _CODE.fullmatch(invariant.code):
        return "a code is 'LG' and three digits, such as 'LG150'"
    if invariant.code in _REGISTRY:
        return f"the code is taken by {_REGISTRY[invariant.code].slug!r}; pick a free number"
    if not _SLUG.fullmatch(invariant.slug):
        return f"the slug {invariant.slug!r} is not kebab-case (e.g. 'zero-scaling')"
    taken = [inv.code for inv in _REGISTRY.values() if inv.slug == invariant.slug]
    if taken:
        return f"the slug {invariant.slug!r} is taken by {taken[0]}"
    if not invariant.fixes or not invariant.messages:
        return "an entry needs at least one fix and one message template"
    return None


def unregister(code: str) -> None:
    """Remove an invariant added with `register` (a test's made-up one); the built-in
    entries stay. Unknown codes are ignored."""
    global _ORDER
    if code in _BUILT_IN:
        raise ValueError(f"{code} is a built-in invariant of lora_guard; it cannot be removed")
    _ORDER = tuple(c for c in _ORDER if c != code)
    _REGISTRY.pop(code, None)


class _Catalogue(Mapping[str, Invariant]):
    """The registry as users read it: read-only, in code order. Registering a code (an
    ``adapter_invariant`` of a plugin, at its import) adds it in place, so a thread reading
    the catalogue meanwhile never finds an entry missing."""

    __slots__ = ()

    def __getitem__(self, code: str) -> Invariant:
        return _REGISTRY[code]

    def __contains__(self, code: object) -> bool:
        return code in _REGISTRY

    def __iter__(self) -> Iterator[str]:
        return iter(_ORDER)

    def __len__(self) -> int:
        return len(_ORDER)

    def __repr__(self) -> str:
        return f"<lora_guard.INVARIANTS: {', '.join(_ORDER)}>"


for _inv in _ENTRIES:
    register(_inv)
del _inv

INVARIANTS: Mapping[str, Invariant] = _Catalogue()
"""Every invariant, by code: the single source of codes, messages, hints and docs.

A read-only mapping of code to `Invariant`; errors, `lora-guard explain`, the pytest summary
and the invariants reference all read it.

Example:
    >>> import lora_guard as lg
    >>> [code for code in lg.INVARIANTS if code.startswith("LG00")]
    ['LG001', 'LG002', 'LG003', 'LG004']
    >>> lg.INVARIANTS["LG002"].slug
    'mixed-moe-layout'
"""
