"""The built-in checks of one adapter: one module per code, named as its catalogue entry's.

``lg101_rank_exceeds_limit.py`` here is LG101's check; its words (messages, fixes, docs) are
``lora_guard/_core/catalogue/lg101_rank_exceeds_limit.py``. Each module registers its check
with `lora_guard._checking.registry.adapter_check` (and, for a check that looks at each LoRA
module, the `module_rule` the one pass over the modules runs). The modules found here are
imported when this package is, in code order; one without a catalogue module of the same name
is refused. `CHECKS` (report order) and `adapter_codes` are read from what they registered:
there is no list of codes to edit.

Example:
    >>> from lora_guard._checking.invariants import CHECKS
    >>> CHECKS[0].code, CHECKS[0].position
    ('LG115', 10)
"""

from __future__ import annotations

import importlib
import pkgutil
import re

from lora_guard._checking.registry import BuiltInCheck, built_in_checks, plugin_codes
from lora_guard._core import catalogue

__all__ = ["CHECKS", "adapter_codes", "settled_codes"]

_CODE_MODULE = re.compile(r"lg\d{3}_[a-z0-9_]+")


def _import_checks() -> tuple[BuiltInCheck, ...]:
    words = {info.name for info in pkgutil.iter_modules(catalogue.__path__)}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not _CODE_MODULE.fullmatch(info.name):
            continue
        if info.name not in words:
            raise ImportError(f"{__name__}.{info.name}: no catalogue entry of that name; add "
                              f"lora_guard/_core/catalogue/{info.name}.py (its words)")
        importlib.import_module(f"{__name__}.{info.name}")
    return built_in_checks()


CHECKS: tuple[BuiltInCheck, ...] = _import_checks()
"""The built-in checks of one adapter, in the order a report lists their violations."""


def adapter_codes() -> tuple[str, ...]:
    """Every code the checks of one adapter can report (built in and registered with
    ``adapter_invariant``), in code order: what ``skip=`` of `lora_guard.check_adapter` and
    `spec_violations` accepts."""
    return tuple(sorted({*(check.code for check in CHECKS), *plugin_codes()}))


def settled_codes(*codes: str) -> tuple[str, ...]:
    """The codes of one adapter's checks that an integration leaves to its library (its
    ``skip=``), checked against the registry when the integration is imported.

    Example:
        >>> settled_codes("LG106")
        ('LG106',)
    """
    unknown = [code for code in codes if code not in adapter_codes()]
    if unknown:
        raise ValueError(f"settled_codes{codes}: {', '.join(unknown)} is no code of one "
                         f"adapter's checks ({', '.join(adapter_codes())})")
    return codes
