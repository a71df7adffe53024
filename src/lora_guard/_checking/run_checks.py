"""The checks of one adapter, run: `check_spec` (every check registered for one adapter, on
one `AdapterContext`, in report order) and `spec_violations` (the same for a guard that holds
the spec). The checks themselves: one module per code in ``lora_guard._checking.invariants``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from lora_guard._checking.invariants import CHECKS, adapter_codes
from lora_guard._checking.limits import ServingLimits, limits_argument, names, positive_int
from lora_guard._checking.registry import plugin_checks
from lora_guard._checking.rules.context import AdapterContext
from lora_guard._checking.rules.recipe_outcome import RecipeOutcome
from lora_guard._checking.rules.shared import Expected
from lora_guard._core.errors import Violation
from lora_guard._reading.adapters import AdapterSpec

__all__ = ["check_spec", "spec_violations"]


def check_spec(subject: str, spec: AdapterSpec, limits: ServingLimits, *,
               vocab_size: int | None = None,
               module_dims: Mapping[str, tuple[Expected, Expected]] | None = None,
               shared: RecipeOutcome | None = None,
               ) -> list[Violation]:
    """Every check of one adapter, in report order (each check's violations together, the
    built-in checks by position, then those of ``adapter_invariant`` by code)."""
    ctx = AdapterContext(subject, spec, limits, vocab_size=vocab_size,
                         module_dims=module_dims, shared=shared)
    found: list[Violation] = []
    for check in _CHECKS:
        found += check(ctx)
    for _, plugin_check in plugin_checks():
        found += plugin_check(ctx)
    return found


_CHECKS = tuple(built_in.check for built_in in CHECKS)


def spec_violations(
    spec: AdapterSpec,
    limits: ServingLimits | None = None,
    *,
    subject: str | None = None,
    skip: Iterable[str] = (),
    vocab_size: int | None = None,
    module_dims: Mapping[str, tuple[Expected, Expected]] | None = None,
) -> list[Violation]:
    """What `check_adapters` finds in one adapter, for a guard that already holds its spec.

    The checks of one adapter (LG101-LG107, LG109, and LG002 within it; not LG108, which is
    the reading's, nor LG110 and LG002 across a set), in the order `check_adapters` reports
    them. For an engine in front of which a guard stands:

    - ``subject`` names the adapter in messages (default ``adapter '<folder>'``);
    - ``skip`` names codes the engine settles itself or accepts by design (e.g. ``"LG106"``
      where it casts every weight to its own dtype);
    - ``vocab_size`` is the base model's vocab when the engine knows no more of it (an
      embedding's A and lm_head's B are checked against it, LG109);
    - ``module_dims`` maps module paths to their ``((in, source), (out, source))`` dims on
      the live model; a module listed there is checked against them instead of
      ``limits.base_config``.

    Example:
        >>> import tempfile, lora_guard as lg
        >>> from lora_guard.testing import write_adapter
        >>> from lora_guard._checking.check_adapters import spec_violations
        >>> spec = lg.inspect_adapter(write_adapter(tempfile.mkdtemp() + "/a", rank=32))
        >>> [v.code for v in spec_violations(spec, lg.ServingLimits(max_rank=16))]
        ['LG101']
        >>> spec_violations(spec, lg.ServingLimits(max_rank=16), skip=("LG101",))
        []
    """
    limits = limits_argument("spec_violations", limits)
    skipped = names("spec_violations", "skip", skip, "('LG106',)") if skip else None
    if skipped:
        codes = adapter_codes()
        unknown = sorted(skipped - set(codes))
        if unknown:
            raise ValueError(
                f"spec_violations(skip=...) got {unknown}; it takes codes of one adapter's "
                f"checks: {', '.join(codes)}"
            )
    positive_int("spec_violations", "vocab_size", vocab_size)
    found = check_spec(subject or f"adapter {spec.name!r}", spec, limits,
                        vocab_size=vocab_size, module_dims=module_dims)
    return [v for v in found if v.code not in skipped] if skipped and found else found
