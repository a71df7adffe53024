"""`check_adapter`: the checker's checks of one adapter, for a server that holds its spec."""

from __future__ import annotations

import types
from collections.abc import Iterable

from lora_guard._checking.check_adapters import Report, ServingLimits, spec_violations
from lora_guard._checking.invariants import adapter_codes
from lora_guard._core.errors import Violation
from lora_guard._reading.adapters import AdapterSpec

__all__ = ["adapter_check_codes", "check_adapter"]


def adapter_check_codes() -> tuple[str, ...]:
    """The codes `check_adapter` can report (and ``skip`` accepts), in code order."""
    return adapter_codes()


def _skipped(skip: str | Iterable[str]) -> frozenset[str]:
    items = (skip,) if isinstance(skip, str) else skip
    if not isinstance(items, Iterable) or not all(isinstance(c, str) for c in items):
        raise TypeError(f"check_adapter(skip=...) takes codes such as ('LG106',), got {skip!r}")
    codes = frozenset(items)
    unknown = sorted(codes - set(adapter_check_codes()))
    if unknown:
        raise ValueError(
            f"check_adapter(skip=...) got {unknown}; it takes codes of one adapter's checks: "
            f"{', '.join(adapter_check_codes())}"
        )
    return codes


def check_adapter(
    spec: AdapterSpec,
    limits: ServingLimits | None = None,
    *,
    subject: str | None = None,
    skip: str | Iterable[str] = (),
    vocab_size: int | None = None,
) -> Report:
    """Check one adapter you have read (`inspect_adapter`) against what your server serves.

    The per-adapter checks of `check_adapters` (LG101-LG107, LG109, LG002 within the adapter,
    and every other code one adapter can break), for a server or loader that reads adapters
    itself and wants lora_guard's verdict before it allocates anything. Returns a `Report`
    of this one adapter; never raises for a bad adapter (call `Report.enforce` to raise or
    warn through the mode). Checks across a set (LG110, LG002 between adapters) need the set:
    use `check_adapters`.

    - ``subject`` names the adapter in messages (default ``adapter '<folder name>'``);
    - ``skip`` names codes your server settles itself (e.g. ``"LG106"`` where it casts every
      weight to its own dtype); an unknown code is a ValueError naming the valid ones;
    - ``vocab_size`` is the base model's vocabulary size when you know no more of it (an
      embedding's A and lm_head's B are checked against it, LG109).

    Example:
        >>> import tempfile, lora_guard as lg
        >>> from lora_guard.testing import write_adapter
        >>> spec = lg.inspect_adapter(write_adapter(tempfile.mkdtemp() + "/a", rank=32))
        >>> report = lg.check_adapter(spec, lg.ServingLimits(max_rank=16))
        >>> report.ok, report.codes()
        (False, ['LG101'])
        >>> lg.check_adapter(spec, lg.ServingLimits(max_rank=16), skip="LG101").ok
        True
    """
    if not isinstance(spec, AdapterSpec):
        raise TypeError(
            "check_adapter takes an lg.AdapterSpec (read one with lg.inspect_adapter(path)); "
            f"got {type(spec).__name__}. For paths or folders, use lg.check_adapters."
        )
    if limits is None:
        limits = ServingLimits()
    skipped = _skipped(skip)
    found: list[Violation] = [
        v for v in spec_violations(spec, limits, subject=subject, vocab_size=vocab_size)
        if v.code not in skipped
    ]
    adapter_id = str(spec.path)
    return Report(
        adapters=(spec,), violations=tuple(found), ids=(adapter_id,),
        by_adapter=types.MappingProxyType({adapter_id: tuple(found)} if found else {}),
        limits=limits,
    )
