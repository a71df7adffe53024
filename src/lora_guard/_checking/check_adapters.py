"""Will these adapters serve together? `check_adapters` -> `Report`: finds the adapters
(`discovery`), reads them a batch at a time, runs the checks of each one (`rules`) and those
across the set, and turns what cannot be read or checked into a verdict (LG108, LG900).

`ServingLimits` (`limits`) and `Report` (`report`) are re-exported here."""

from __future__ import annotations

import os
import pathlib
import types
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any, cast

from lora_guard._checking.checks import MoELayout
from lora_guard._checking.discovery import PathOrSpec, Target, as_list, discover_all, folder_path
from lora_guard._checking.engines.sglang import config_names, set_pool
from lora_guard._checking.invariants.lg104_unsupported_target import outside_set_pool
from lora_guard._checking.limits import ServingLimits, limits_argument
from lora_guard._checking.report import SCHEMA_VERSION, SET, Report
from lora_guard._checking.rules.recipe_outcome import PartsOutcome, RecipeOutcome
from lora_guard._checking.rules.shared import Expected
from lora_guard._checking.run_checks import check_spec, spec_violations
from lora_guard._core.errors import Violation, make_violation
from lora_guard._reading.adapters import (
    AdapterSpec,
    Malformed,
    Read,
    Recipe,
    load_spec,
    malformed_violation,
    read_recipes,
)
from lora_guard._reading.bounded import Bounded, ValueKey

__all__ = [
    "SCHEMA_VERSION",
    "Expected",
    "Report",
    "ServingLimits",
    "adapter_servable",
    "check_adapters",
    "spec_violations",
]


def check_adapters(
    paths_or_specs: PathOrSpec | Iterable[PathOrSpec],
    limits: ServingLimits | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
    scan_values: bool = False,
) -> Report:
    """Check a set of adapters against what a server serves; never raises for a bad adapter.

    Each path is an adapter folder, or a folder searched for adapter folders (a folder with
    ``adapter_config.json`` or adapter weights is an adapter; otherwise its subfolders are
    searched); `AdapterSpec` objects are checked as they are. A path that holds no readable
    adapter is itself reported (LG108). Every check of LG101-LG110 runs on each adapter, then
    LG110 and LG002 across the set. ``progress(done, total)`` is called after each adapter.

    ``scan_values=True`` also reads each local adapter's tensor values once, in bounded
    chunks: a ``lora_B`` that is all zeros (LG119: the adapter does nothing) and NaN or Inf
    values (LG120). It costs about one read of the files (see the performance page); remote
    adapters are checked from their headers only.

    A path may also be remote: ``hf://ORG/REPO[@REV][/SUB]`` (or a bare Hub id ``ORG/NAME``
    that is not a local path), ``s3://BUCKET/PREFIX`` or ``https://...``, read from ranged
    reads of the config and header only, many at once (the ``lora-guard[remote]`` extra; see
    the remote guide). A remote adapter that cannot be fetched is reported as LG140.

    The report is returned, not raised: call `Report.enforce` to report it through the mode.

    Example:
        >>> import tempfile, lora_guard as lg
        >>> from lora_guard.testing import write_adapter
        >>> root = tempfile.mkdtemp()
        >>> _ = write_adapter(f"{root}/ok"), write_adapter(f"{root}/dora", defects=("dora",))
        >>> report = lg.check_adapters(root)
        >>> [(v.code, v.subject.split("/")[-1]) for v in report.violations]
        [('LG105', "dora'")]
        >>> lg.check_adapters(root, lg.ServingLimits(allow={"dora"})).ok
        True
    """
    limits = limits_argument("check_adapters", limits)
    if progress is not None and not callable(progress):
        raise TypeError("check_adapters(progress=...) takes a callable(done, total) or None")
    if not isinstance(scan_values, bool):
        raise TypeError(f"check_adapters(scan_values=...) takes True or False, got "
                        f"{scan_values!r}")
    discovered = discover_all(as_list(paths_or_specs))
    run = _SetCheck(limits, scan_values)
    total = len(discovered)
    for start in range(0, total, _BATCH):
        batch = discovered[start:start + _BATCH]
        reads = _read_found(batch)
        for done, ((adapter_id, target), read) in enumerate(
                zip(batch, reads, strict=True), start + 1):
            run.add(adapter_id, target, read)
            if progress is not None:
                progress(done, total)
    return run.report()


_BATCH = 32
"""Adapters read together, a phase at a time (`read_recipes`), then checked one by one."""


def _read_found(batch: list[tuple[str, Target]]) -> list[Read | Exception | None]:
    """What `read_recipes` gives each folder the search found in ``batch``; None for the
    other targets (given specs, remote reads, named paths), which `_read` reads."""
    found = [i for i, (_, target) in enumerate(batch) if type(target) is str]
    reads: list[Read | Exception | None] = [None] * len(batch)
    if found:
        results = read_recipes([folder_path(cast(str, batch[i][1])) for i in found])
        for i, result in zip(found, results, strict=True):
            reads[i] = result
    return reads



_FILE_ERRORS = (OSError, ValueError, ArithmeticError, RecursionError, MemoryError)
"""Errors that say something about the adapter's files (unreadable, undecodable, a number
out of range): a verdict on the adapter (LG108). Any other exception is a bug in the checker
(LG900), re-raised with its traceback when ``LORA_GUARD_DEBUG=1``."""


def _debugging() -> bool:
    return os.environ.get("LORA_GUARD_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


def _internal_error(subject: str, exc: BaseException) -> Violation:
    """LG900: the checker itself failed on this adapter; where, for the bug report."""
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    where = (f"{os.path.basename(frame.tb_frame.f_code.co_filename)}:{frame.tb_lineno} "
             f"({frame.tb_frame.f_code.co_name})") if frame is not None else "unknown"
    return make_violation("LG900", "internal", subject, error=type(exc).__name__,
                          problem=str(exc)[:200], where=where)


def _read(adapter_id: str, subject: str, target: Target) -> AdapterSpec | Violation:
    """The spec of a target the search did not read (`_read_found` reads the folders it
    found), or the violation that says why it cannot be read."""
    if isinstance(target, Future):
        target = target.result()
    if isinstance(target, Malformed):
        return malformed_violation(subject, target)
    if isinstance(target, AdapterSpec):
        return target
    try:
        return load_spec(cast("str | pathlib.Path", target))
    except Exception as exc:
        return _unreadable(adapter_id, subject, exc)


def _unreadable(adapter_id: str, subject: str, exc: Exception) -> Violation:
    """The violation of an adapter whose reading raised ``exc``: LG108 for what the files
    say (never a crash for one bad adapter), LG900 for a bug in the reader (re-raised, with
    its traceback, when ``LORA_GUARD_DEBUG=1``)."""
    if isinstance(exc, Malformed):
        return malformed_violation(subject, exc)
    if isinstance(exc, _FILE_ERRORS):
        return malformed_violation(subject, Malformed(
            adapter_id, f"could not be checked ({type(exc).__name__}: {exc})"))
    if _debugging():
        raise exc
    return _internal_error(subject, exc)



def _verdict(adapter_id: str, subject: str, spec: AdapterSpec, limits: ServingLimits,
             scan_values: bool, shared: RecipeOutcome | None = None,
             ) -> tuple[list[Violation], bool]:
    """Every check of one readable adapter: its violations (LG900 for a bug in a check), and
    whether the checks ran to the end; ``shared``: what its recipe's adapters checked before
    it found about what they share."""
    try:
        found = check_spec(subject, spec, limits, shared=shared)
        if scan_values:
            from lora_guard._checking.values import (
                scan_violations,  # reads values: only when asked
            )

            found += scan_violations(spec, subject)
    except Malformed as exc:
        return [malformed_violation(subject, exc)], False
    except _FILE_ERRORS as exc:
        return [malformed_violation(subject, Malformed(
            adapter_id, f"could not be checked ({type(exc).__name__}: {exc})"))], False
    except Exception as exc:
        if _debugging():
            raise
        return [_internal_error(subject, exc)], False
    return found, True


class _SetCheck:
    """One pass over a set of adapters: each adapter's verdict as it is read, and only what
    the checks across the set need (the first MoE layout, the ranks of ``rank-from-set``).
    What a recipe's adapters share is checked with the first of them (`RecipeOutcome`)."""

    def __init__(self, limits: ServingLimits, scan_values: bool) -> None:
        self.limits = limits
        self.scan_values = scan_values
        self.specs: list[AdapterSpec] = []
        self.ids: list[str] = []
        self.by_adapter: dict[str, tuple[Violation, ...]] = {}
        self.pool: tuple[str, MoELayout] | None = None
        self.rank_from_set = ("rank-from-set" in limits.engine_rules
                              and limits.max_rank is None)
        self.largest_r: int | None = None
        self.targets_from_set = ("targets-from-set" in limits.engine_rules
                                 and limits.target_modules is None)
        self.checked: list[tuple[str, AdapterSpec]] = []
        self.patterns: list[tuple[str, Mapping[str, Any]]] = []
        self.outcomes: Bounded[Recipe, RecipeOutcome] = Bounded(
            256, "each recipe's outcomes in this run (a recipe pushed out is checked again)")
        self.parts: Bounded[ValueKey, PartsOutcome] = Bounded(
            256, "the module pass of each parts in this run (`Parts.key`: recipes that differ "
            "only in what the module rules do not read share it)")

    def add(self, adapter_id: str, target: Target,
            read_already: Read | Exception | None = None) -> None:
        """Check one adapter: ``read_already`` is its spec or the error reading it raised,
        when it was read with others (`_read_found`); else it is read here."""
        self.ids.append(adapter_id)
        subject = f"adapter {adapter_id!r}"
        read: AdapterSpec | Violation
        shared = None
        if read_already is None:
            read = _read(adapter_id, subject, target)
        elif isinstance(read_already, Exception):
            read = _unreadable(adapter_id, subject, read_already)
        else:
            read, recipe = read_already
            shared = self.outcomes.get_or_make(recipe, lambda: RecipeOutcome(
                parts=self.parts.get_or_make(recipe.parts.key, PartsOutcome)))
        if isinstance(read, Violation):
            self.by_adapter[adapter_id] = (read,)
            return
        found, checked = _verdict(adapter_id, subject, read, self.limits, self.scan_values,
                                  shared)
        if checked:
            self.specs.append(read)
            self._across(adapter_id, read, found)
        if found:
            self.by_adapter[adapter_id] = tuple(found)

    def _across(self, adapter_id: str, spec: AdapterSpec, found: list[Violation]) -> None:
        """Remember what the checks across the set need; LG002 against the pool's layout."""
        layout = spec.moe_layout
        if layout is not None and not any(v.code == "LG002" for v in found):
            if self.pool is None:
                self.pool = (adapter_id, layout)
            elif layout is not self.pool[1]:
                found.append(make_violation(
                    "LG002", "set", f"adapter {adapter_id!r}", layout=layout.value,
                    pool_layout=self.pool[1].value, owner=self.pool[0]))
        if self.targets_from_set:
            self.checked.append((adapter_id, spec))
        if self.rank_from_set:
            r = spec.config.get("r")
            if isinstance(r, int) and not isinstance(r, bool):
                self.largest_r = r if self.largest_r is None else max(self.largest_r, r)
            pattern = spec.config.get("rank_pattern")
            if pattern and isinstance(pattern, Mapping):
                self.patterns.append((adapter_id, pattern))

    def report(self) -> Report:
        by_adapter, ids, limits = self.by_adapter, self.ids, self.limits
        if self.rank_from_set and self.largest_r is not None:
            _rank_from_set(self.largest_r, self.patterns, by_adapter)
        if self.targets_from_set:  # no --lora-target-modules: the set's union is the pool's
            _targets_from_set(self.checked, limits, by_adapter)
        if limits.max_loras is not None and len(ids) > limits.max_loras:
            by_adapter[SET] = (make_violation(
                "LG110", "count", "adapter set", count=len(ids), max_loras=limits.max_loras),)
        if limits.max_loaded is not None and len(ids) > limits.max_loaded:
            by_adapter[SET] = (*by_adapter.get(SET, ()), make_violation(
                "LG110", "loaded", "adapter set", count=len(ids), limit=limits.max_loaded,
                engine=limits.engine or "the server",
                per_batch=limits.engine_options.get("max_loras_per_batch", "?")))
        violations = [v for i in [*ids, SET] for v in by_adapter.get(i, ())]
        return Report(
            adapters=tuple(self.specs), violations=tuple(violations), ids=tuple(ids),
            by_adapter=types.MappingProxyType(by_adapter), limits=limits,
        )



def _rank_from_set(pool: int, patterns: list[tuple[str, Mapping[str, Any]]],
                   by_adapter: dict[str, tuple[Violation, ...]]) -> None:
    """No max rank given (sglang): the pool's rank is the largest ``r`` of the set; a
    ``rank_pattern`` value above it does not fit."""
    for adapter_id, pattern in patterns:
        over = sorted((int(v), k) for k, v in pattern.items()
                      if isinstance(v, int) and v > pool)
        if over:
            rank, key = over[-1]
            by_adapter[adapter_id] = (*by_adapter.get(adapter_id, ()), make_violation(
                "LG101", "max", f"adapter {adapter_id!r}", rank=rank,
                module=f"rank_pattern[{key!r}]", max_rank=pool))


def _targets_from_set(checked: list[tuple[str, AdapterSpec]], limits: ServingLimits,
                      by_adapter: dict[str, tuple[Violation, ...]]) -> None:
    """No target modules given (sglang): the server's modules are the union of the set's
    ``target_modules``; a weight of another module is LG104."""
    pool = set_pool(spec.config for _, spec in checked)
    if pool is None:
        return
    clean: set[tuple[Any, frozenset[str] | None]] = set()  # what the verdict reads, by value
    for adapter_id, spec in checked:
        parts = None if spec.parts_key is None else (spec.parts_key, config_names(spec.config))
        if parts in clean:
            continue
        found = outside_set_pool(spec, pool, f"adapter {adapter_id!r}", limits)
        if found:
            by_adapter[adapter_id] = (*by_adapter.get(adapter_id, ()), *found)
        elif parts is not None:
            clean.add(parts)


def adapter_servable(spec: AdapterSpec | str | os.PathLike[str],
                     limits: ServingLimits | None = None) -> bool:
    """Every LG1xx check as a predicate: does this adapter serve within ``limits``?

    Raises nothing for a bad adapter (an unreadable one is simply not servable).

    Example:
        >>> import tempfile, lora_guard as lg
        >>> from lora_guard.testing import write_adapter
        >>> spec = lg.inspect_adapter(write_adapter(tempfile.mkdtemp() + "/a", rank=32))
        >>> lg.adapter_servable(spec, lg.ServingLimits(max_rank=64))
        True
        >>> lg.adapter_servable(spec, lg.ServingLimits(max_rank=16))
        False
    """
    return check_adapters([spec], limits).ok
