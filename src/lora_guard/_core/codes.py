"""Validating invariant codes written by users (markers, options): light, imports no torch.

Used by ``lora_guard.testing.check_codes`` and by the pytest11 module at collection.

Example:
    >>> from lora_guard._core.codes import check_codes
    >>> check_codes(("LG001", "LG003"), where="allow")
    ('LG001', 'LG003')
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

from lora_guard._core.catalogue import INVARIANTS

__all__ = ["check_codes"]


def check_codes(codes: str | Iterable[str], *, where: str) -> tuple[str, ...]:
    """Validate invariant codes (one code or several); return them as a tuple.

    Raises `ValueError` naming each unknown code, the closest known code, and every valid
    code, so a misspelling is caught where it is written, not as a silently unmet check.

    Example:
        >>> from lora_guard.testing import check_codes
        >>> check_codes("LG001", where="allow")
        ('LG001',)
        >>> check_codes(["LG01"], where="allow")
        Traceback (most recent call last):
        ...
        ValueError: allow: 'LG01' is not a lora_guard code (did you mean 'LG001'?) ...
    """
    if isinstance(codes, str):
        codes = (codes,)
    try:
        items = tuple(codes)
    except TypeError:
        raise TypeError(
            f"{where}: expected a code or a tuple of codes such as ('LG001', 'LG003'), "
            f"got {type(codes).__name__}"
        ) from None
    problems = []
    for code in items:
        if not isinstance(code, str):
            problems.append(f"{code!r} is not a string")
        elif code not in INVARIANTS:
            close = _closest(code)
            guess = f" (did you mean {close!r}?)" if close else ""
            problems.append(f"{code!r} is not a lora_guard code{guess}")
    if problems:
        raise ValueError(
            f"{where}: {'; '.join(problems)}; valid codes: {', '.join(INVARIANTS)} "
            "(`lora-guard codes` lists them with their names)."
        )
    return items


def _closest(code: str) -> str | None:
    digits = re.sub(r"\D", "", code)
    if digits and f"LG{int(digits):03d}" in INVARIANTS:  # 'lg1', 'LG01', 'LG-001'
        return f"LG{int(digits):03d}"
    close = difflib.get_close_matches(code.upper(), list(INVARIANTS), n=1, cutoff=0.75)
    return close[0] if close else None
