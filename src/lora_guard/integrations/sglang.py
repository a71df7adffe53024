"""lora_guard in front of sglang's LoRA serving: loading, the memory pool, MoE pools, slots.

Guarded (sglang 0.5.16 to 0.5.23, each release run by the engine tier ``tests/engines/``
with its profile; other releases get an `IntegrationWarning` and `lora-guard doctor` lists
each hook). Every adapter is checked with
the one sglang profile that ``lora-guard check --engine sglang`` and
``ServingLimits.for_engine("sglang", ...)`` use, filled with the running server's own
``--max-lora-rank``, ``--lora-target-modules`` and base model, so the guard in the server and
the checker on the files report the same codes (the engine tier asserts it adapter by adapter):

- ``LoRAManager.load_lora_adapter``, with ``LoRAAdapter._process_weight`` (each tensor as
  sglang read it) and ``LoRAAdapter._normalize_weights`` (where the checks run, before
  sglang stacks or drops any tensor): what sglang read, its parsed config and its tensors,
  goes through the checker of ``lora-guard check`` (`lora_guard.check_adapters`), nothing
  of the folder read again (where sglang refuses first, the checker reads the folder), with
  the server's limits: ranks of ``r``,
  ``rank_pattern`` and the tensors against ``--max-lora-rank`` (LG101; sglang compares
  ``r`` only), the profile's own rules (LG111 ranks that differ within q/k/v or gate/up,
  LG112 a scaling other than sglang's one ``lora_alpha / r``, LG202 a regex
  ``target_modules``), weights for modules outside ``--lora-target-modules`` (LG104, fused
  ``qkv_proj`` / ``gate_up_proj`` serving their parts) or outside LoRA key grammar (sglang
  drops such weights silently), config features sglang does not serve (LG105: DoRA,
  ``lora_bias``, ``bias``, ``modules_to_save``, trainable tokens, ...), LG102, LG103, LG107,
  LG108, and an embedding's or lm_head's vocab against the base model's (LG109); not LG106,
  since sglang casts every weight to its dtype. Then the adapter's MoE layout against the
  adapters already loaded (LG002). sglang's loader turns every exception into
  ``LoRAUpdateOutput(success=False, error_message=str(e))``; the guard keeps that contract
  and puts its full message there (never an empty string). A refused load leaves sglang's
  registries as they were (sglang records the config before it reads the weights: that
  entry is put back); sglang's own failed load that leaves its config behind is reported as
  LG201. An adapter read as one found clean before (same config and tensors, same limits,
  vocabulary and registered checks) is not checked again.
- ``LoRAManager.validate_new_adapter``: the same checks, for a caller that validates an
  adapter outside ``load_lora_adapter`` (inside it, the load guard checks what sglang reads).
- ``LoRAManager.init_state``: the start-up adapters (``--lora-paths``, loaded inside
  ``LoRAManager.__init__``), each through the same checks as a dynamic load, against
  ``--max-lora-rank`` (or, without it, the rank sglang infers: the largest ``r``) and
  ``--lora-target-modules``, and their MoE layouts (LG002), before any is loaded: a server
  that would serve them wrong does not start. ``unload_lora_adapter`` releases a layout.
- ``LoRAMemoryPool.prepare_lora_batch``: a batch needing more adapters than slots (LG201,
  before sglang's assert, its LRU marks or any map write), then the slot maps
  ``uid_to_buffer_id`` / ``buffer_id_to_uid`` (LG201, `lora_guard.check_slot_maps`) when they
  changed: once verified, the slot list is a list that hears its writes (copies and pickles
  are plain lists; ``uninstrument`` gives sglang its own list back).
- ``LoRAMemoryPool.load_lora_weight_to_buffer``: a slot out of range (LG201) or an adapter
  rank above the pool's (LG101) before the buffer is written; sglang's own refusal of a
  stale pinned hit (0.5.23 on) as LG003 with its fix.
- ``LoRAMemoryPool._get_maybe_cached_weight_for_transfer``: a pinned-cache hit of another
  shape or dtype (LG003, seed 002) before the stale tensor is returned, when sglang reads the
  store at all (pinning available, overlap loading on, a CPU weight not pinned yet; the
  store is each adapter layer's ``pinned_weights``). From 0.5.23 sglang refuses such a hit
  itself (a ``ValueError``): the method is left as it is and the swap-in guard reports the
  refusal, known by the code it was raised in and its type, never by its text.
- ``FusedMoEWithLoRA.set_lora_info`` and the Inkling shared sink's ``set_lora_info``, both
  versions (``InklingBatchDenseMLPWithLoRA`` and ``...V2``, in
  ``sglang.srt.models.inkling_common.lora``): the seed-000 contract, dims frozen at the first
  call per layer (LG001 before the layer changes anything, LG004 for a malformed call).

Example:
    >>> from lora_guard.integrations import sglang as sglang_guard
    >>> report = sglang_guard.instrument()    # before or after sglang is imported
    >>> sglang_guard.uninstrument()
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import os
import re
import sys
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from .._checking.check_adapters import ServingLimits, spec_violations
from .._checking.checks import check_cache_entry, check_slot_maps_violations
from .._checking.engines import SPECS
from .._checking.engines.sglang import set_pool
from .._checking.invariants import settled_codes
from .._checking.limits import running_limits
from .._core.config import STATE, report
from .._core.errors import LoRAGuardError, Violation, make_violation
from .._guarding.layouts import LayoutRegistry
from .._guarding.shapes import shapes
from .._reading.adapters import AdapterSpec
from ._base import (
    AttachReport,
    CleanVerdicts,
    HeardList,
    Integration,
    Patch,
    loaded_adapter,
    local_adapter,
    note,
    read_key,
    takes_exactly,
)

__all__ = ["INTEGRATION", "SET_LORA_INFO_DIMS", "instrument", "uninstrument"]

name = "sglang"
"""This integration's name, as `lora_guard.integrations.get` knows it."""

SET_LORA_INFO_DIMS = {
    "gate_up_lora_a_weights": "slots outer 2*rank hidden",
    "gate_up_lora_b_weights": "slots n 2*f rank",
    "down_lora_a_weights": "slots n rank f",
    "down_lora_b_weights": "slots outer hidden rank",
}
"""The seed-000 dims of ``set_lora_info`` (fused MoE and shared sink); slots, n, f and rank
are frozen per layer at its first call."""

_REGISTRIES: weakref.WeakKeyDictionary[Any, LayoutRegistry] = weakref.WeakKeyDictionary()
_GUARDED_SET_LORA: dict[Any, Callable[..., Any]] = {}


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, key: str,
         default: Any = None) -> Any:
    if key in kwargs:
        return kwargs[key]
    return args[index] if index < len(args) else default


def _registry(manager: Any) -> LayoutRegistry:
    registry = _REGISTRIES.get(manager)
    if registry is None:
        registry = _REGISTRIES[manager] = LayoutRegistry()
    return registry


def _subject(lora_ref: Any) -> str:
    return f"adapter {getattr(lora_ref, 'lora_name', None) or lora_ref!r}"


# --- LoRAManager -------------------------------------------------------------------------

# sglang pools fused projections; an adapter may train their parts (or the reverse).
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_SGLANG_SETTLES = settled_codes("LG106", "LG002")
"""Codes of the checker not reported at load: sglang casts every weight to its dtype
(LG106), and the layout guard reports LG002 against the pool as well as within an adapter."""
_IN_LOAD: contextvars.ContextVar[Any] = contextvars.ContextVar("lora_guard_sglang_load",
                                                                default=None)
_START_UP: contextvars.ContextVar[tuple[Any, ServingLimits] | None] = contextvars.ContextVar(
    "lora_guard_sglang_start_up", default=None)
"""The manager whose ``init_state`` runs, with the limits its arguments give (at start-up
``max_lora_rank`` / ``target_modules`` are not attributes yet)."""


def _served(targets: Any) -> frozenset[str] | None:
    """``--lora-target-modules`` as the checker takes it (fused names serve their parts)."""
    if isinstance(targets, (set, frozenset, list, tuple)) and targets and all(
            isinstance(t, str) and t for t in targets) and "all" not in targets:
        served = set(targets)
        for fused, parts in _FUSED.items():
            if fused in served or any(part in served for part in parts):
                served.add(fused)
                served.update(parts)
        return frozenset(served)
    return None


def _base_config(manager: Any) -> dict[str, Any] | None:
    """The served model's (text) config, as the checker reads a ``config.json``."""
    config = getattr(manager, "base_hf_config", None)
    to_dict = getattr(config, "to_dict", None)
    if not callable(to_dict):
        return None
    try:
        found = to_dict()
    except Exception:  # a config that cannot say its fields: the dims are not checked
        return None
    return found if isinstance(found, dict) and found.get("hidden_size") else None


def _rank(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else None


def _server_limits(manager: Any, max_rank: int | None, targets: Any) -> ServingLimits:
    """The sglang profile of ``lora-guard check --engine sglang`` (the installed release's
    rules: packed q/k/v and gate/up, one rank per packed module, one scaling, target_modules
    as a list), with this server's ``--max-lora-rank``, ``--lora-target-modules`` and base."""
    return running_limits(
        "sglang", INTEGRATION.version(), base_config=_base_config(manager),
        max_lora_rank=max_rank, narrow={"max_rank": max_rank, "target_modules": _served(targets)})


def _limits(manager: Any) -> ServingLimits:
    """What this server serves (``--max-lora-rank``, ``--lora-target-modules``, the base)."""
    start_up = _START_UP.get()
    if start_up is not None and start_up[0] is manager:
        return start_up[1]
    max_rank = _rank(getattr(manager, "max_lora_rank", None))
    targets = getattr(manager, "target_modules", None)
    config = getattr(manager, "base_hf_config", None)
    key = (max_rank, _frozen(targets), config)
    kept: tuple[Any, ServingLimits] | None = getattr(manager, _LIMITS_SLOT, None)
    if kept is not None and kept[0][0] == key[0] and kept[0][2] is config and \
            kept[0][1] == key[1]:
        return kept[1]  # the same server as at the last load: its limits, made then
    limits = _server_limits(manager, max_rank, targets)
    note(manager, _LIMITS_SLOT, (key, limits))  # a manager that takes none: made each load
    return limits


def _frozen(targets: Any) -> Any:
    """``--lora-target-modules`` as a value to compare with the next load's."""
    try:
        return frozenset(targets) if isinstance(targets, (set, list, tuple)) else targets
    except TypeError:  # unhashable names: not served anyway (see `_served`)
        return tuple(targets)


_LIMITS_SLOT = "_lora_guard_sglang_limits"
"""The limits of a manager's last load, kept on the manager with what they were made from
(``--max-lora-rank``, ``--lora-target-modules``, the base config): made again on a change."""


def _vocab(manager: Any) -> int | None:
    vocab = getattr(getattr(manager, "base_hf_config", None), "vocab_size", None)
    return vocab if isinstance(vocab, int) and vocab > 0 else None


def _check(manager: Any, lora_ref: Any) -> tuple[list[Violation], AdapterSpec | None]:
    """The checker's violations for the adapter ``lora_ref`` points at, read from its
    folder, and its spec."""
    subject = _subject(lora_ref)
    spec, violations = local_adapter(getattr(lora_ref, "lora_path", None), subject)
    if spec is not None:
        violations += _spec_violations(spec, _limits(manager), _vocab(manager), subject)
    return violations, spec


def _spec_violations(spec: AdapterSpec, limits: ServingLimits, vocab: int | None,
                     subject: str) -> list[Violation]:
    """`spec_violations` with the server's limits and sglang's settled codes."""
    return spec_violations(spec, limits, subject=subject, skip=_SGLANG_SETTLES,
                           vocab_size=vocab)


_CLEAN = CleanVerdicts("sglang loads found clean: (config, tensors, vocabulary)")


def _validate_new_adapter(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                          kwargs: dict[str, Any]) -> Any:
    if _IN_LOAD.get() is not instance:  # the load guard checks this adapter itself
        report(_check(instance, _arg(args, kwargs, 1, "lora_ref"))[0])
    return wrapped(*args, **kwargs)


def _failed(manager: Any, message: str) -> Any:
    make_result = getattr(manager, "create_lora_update_result", None)
    if callable(make_result):
        return make_result(success=False, error_message=message)
    io_struct = importlib.import_module("sglang.srt.managers.io_struct")
    return io_struct.LoRAUpdateOutput(success=False, error_message=message)


class _Read:
    """One ``load_lora_adapter`` of a local folder under way: the tensors sglang's
    ``LoRAAdapter`` read (each as ``_process_weight`` received it, before sglang drops or
    stacks any), checked with the config sglang parsed when its ``_normalize_weights``
    starts, before anything is transformed or registered beyond the config."""

    __slots__ = ("checked", "folder", "manager", "newly", "refusal", "subject", "tensors",
                 "uid")

    def __init__(self, manager: Any, uid: Any, folder: Any, subject: str) -> None:
        self.manager, self.uid, self.folder, self.subject = manager, uid, folder, subject
        self.tensors: dict[str, Any] = {}
        self.checked = False
        self.newly = False
        """Whether this load admitted the adapter's layout (released if the load fails)."""
        self.refusal: LoRAGuardError | None = None


_READ: contextvars.ContextVar[_Read | None] = contextvars.ContextVar(
    "lora_guard_sglang_read", default=None)
_READ_HOOKS = frozenset({("sglang.srt.lora.lora", "LoRAAdapter._process_weight"),
                         ("sglang.srt.lora.lora", "LoRAAdapter._normalize_weights")})
"""The hooks that see what sglang reads; without them (a release that lacks one) a load is
checked from the folder, read first."""


def _admit(read: _Read, tensors: Mapping[str, Any]) -> None:
    """The adapter's MoE layout against the adapters loaded (LG002)."""
    registry = _registry(read.manager)
    newly = read.uid not in registry
    registry.admit(read.uid, tensors)
    read.newly = newly


def _check_folder(read: _Read, *, admit: bool = False) -> None:
    """The checks on the folder, read by the checker (sglang has not read it, or refused it
    before its read reached the checks); ``admit``: then its layout (LG002)."""
    read.checked = True
    spec, found = local_adapter(read.folder, read.subject)
    if spec is not None:
        found += _spec_violations(spec, _limits(read.manager), _vocab(read.manager),
                                  read.subject)
    report(found)
    if admit and spec is not None and spec.tensors:
        _admit(read, spec.tensors)


def _check_read(read: _Read, config: Any) -> None:
    """The checks on what sglang read: its parsed ``adapter_config.json`` and the tensors of
    its weights file, nothing read again (only ``added_tokens.json``, when the folder has
    one, and the files' rules, as `loaded_adapter` says). A config and tensors found clean
    before under the same limits, vocabulary and registered checks are clean again."""
    read.checked = True
    if not isinstance(config, Mapping):  # not a config as json reads one: read the folder
        _check_folder(read)
        _admit(read, read.tensors)
        return
    limits, vocab = _limits(read.manager), _vocab(read.manager)
    key = read_key(config, read.tensors, vocab)
    if not _CLEAN.clean(key, limits, read.folder):
        spec, found = loaded_adapter(read.folder, config, read.tensors, read.subject, key=key)
        if spec is not None:
            found += _spec_violations(spec, limits, vocab, read.subject)
        report(found)
        if not found and spec is not None and "added_tokens" not in spec.features:
            _CLEAN.remember(key, limits)
    _admit(read, read.tensors)


def _weight_read(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
    """``LoRAAdapter._process_weight``: each tensor sglang read, kept (as read) for the
    checks of the load under way."""
    _note_weight(instance, _arg(args, kwargs, 0, "name"), _arg(args, kwargs, 1, "loaded_weight"))
    return wrapped(*args, **kwargs)


def _note_weight(adapter: Any, name: Any, weight: Any) -> None:
    """Keep a tensor sglang read for the checks of the load under way (its adapter's)."""
    read = _READ.get()
    if read is not None and not read.checked and getattr(adapter, "uid", None) == read.uid:
        read.tensors[name] = weight


_WEIGHT_PARAMS = ("self", "name", "loaded_weight")


def _weight_read_fast(original: Callable[..., Any],
                      guarded: Callable[..., Any]) -> Callable[..., Any]:
    """Every tensor of every load passes through ``_process_weight`` (224 for an r16
    adapter of every linear module of a 16-layer model), which only notes it: where
    sglang's method takes ``(self, name, loaded_weight)`` (every supported release), so does
    this function, passing them on by position, the cheapest call both ways (a load under
    way is only ever set by the guarded ``load_lora_adapter``)."""
    if not takes_exactly(original, len(_WEIGHT_PARAMS), names=_WEIGHT_PARAMS, defaults=()):
        return guarded

    def _process_weight(self: Any, name: Any, loaded_weight: Any) -> Any:
        _note_weight(self, name, loaded_weight)
        return original(self, name, loaded_weight)
    return _process_weight


def _weights_read(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
    """``LoRAAdapter._normalize_weights``: sglang has read every tensor; the checks run on
    them before sglang stacks or drops any (a refusal is sglang's failed result)."""
    read = _READ.get()
    if read is not None and not read.checked and getattr(instance, "uid", None) == read.uid:
        try:
            _check_read(read, getattr(getattr(instance, "config", None), "hf_config", None))
        except LoRAGuardError as error:
            read.refusal = error
            raise
    return wrapped(*args, **kwargs)


def _load_lora_adapter(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> Any:
    """A load of a local folder is checked on what sglang reads (`_weights_read`), before
    the adapter is made; when sglang refuses first, on the folder, read then. A refusal
    leaves sglang's registries as they were (sglang records the config before it reads the
    weights: that entry is put back) and is sglang's failed result with the full message."""
    lora_ref = _arg(args, kwargs, 0, "lora_ref")
    lora_id = getattr(lora_ref, "lora_id", None)
    folder = getattr(lora_ref, "lora_path", None)
    if not isinstance(lora_id, str):
        return wrapped(*args, **kwargs)
    read = _Read(instance, lora_id, folder, _subject(lora_ref))
    configs = getattr(instance, "configs", None)
    before = configs.get(lora_id, _NO_CONFIG) if isinstance(configs, dict) else _NO_CONFIG
    if not (INTEGRATION._applied.keys() >= _READ_HOOKS and isinstance(folder, (str, os.PathLike))
            and os.path.isdir(folder)):
        try:  # no hook sees sglang's read (or a Hub id): the checker reads the folder first
            _check_folder(read, admit=True)
        except LoRAGuardError as error:
            return _failed(instance, str(error))
    token, in_load = _READ.set(read), _IN_LOAD.set(instance)
    try:
        result = wrapped(*args, **kwargs)
    finally:
        _IN_LOAD.reset(in_load)
        _READ.reset(token)
    if not getattr(result, "success", True):
        return _load_failed(read, result, before)
    if not read.checked:  # loaded, unseen by the hooks (a release that reads otherwise)
        try:
            _check_folder(read, admit=True)
        except LoRAGuardError as error:
            instance.unload_lora_adapter(lora_ref)  # sglang's own undo of its load
            return _failed(instance, str(error))
    return result


def _load_failed(read: _Read, result: Any, before: Any) -> Any:
    """A load that failed: refused by the guard (in sglang's read, or from the folder when
    sglang refused first), or sglang's own failure, whose leftovers are LG201."""
    manager, lora_id = read.manager, read.uid
    if read.newly:
        _registry(manager).release(lora_id)
    if not read.checked:  # sglang refused before its read reached the checks
        try:
            _check_folder(read)
        except LoRAGuardError as error:
            read.refusal = error
    if read.refusal is not None:
        _put_back(manager, lora_id, before)
        return _failed(manager, str(read.refusal))
    stale = [where for where in ("configs", "loras", "lora_refs")
             if lora_id in (getattr(manager, where, None) or {})]
    if stale:
        try:
            report([make_violation("LG201", "stale-config", "LoRAManager", uid=lora_id,
                                   where=f"LoRAManager.{stale[0]}")])
        except LoRAGuardError as error:
            previous = getattr(result, "error_message", "") or ""
            result.error_message = f"{previous}\n{error}" if previous else str(error)
    return result


_NO_CONFIG = object()


def _put_back(manager: Any, lora_id: str, before: Any) -> None:
    """``configs[lora_id]`` as it was before a refused load (sglang records an adapter's
    config before it reads the weights, and a failed read leaves it there)."""
    configs = getattr(manager, "configs", None)
    if not isinstance(configs, dict):
        return
    if before is _NO_CONFIG:
        configs.pop(lora_id, None)
    else:
        configs[lora_id] = before


def _unload_lora_adapter(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                         kwargs: dict[str, Any]) -> Any:
    lora_ref = _arg(args, kwargs, 0, "lora_ref")
    result = wrapped(*args, **kwargs)
    lora_id = getattr(lora_ref, "lora_id", None)
    if getattr(result, "success", True) and isinstance(lora_id, str):
        _registry(instance).release(lora_id)
    return result


def _init_state(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any:
    """Start-up (``--lora-paths``): sglang loads these adapters inside ``init_state`` through
    its private ``_load_lora_adapter``, before ``max_lora_rank`` and ``target_modules`` are
    set, so each is checked here, against the limits the arguments give (a rank sglang infers
    is the largest ``r``, which a ``rank_pattern`` can exceed), before any is read."""
    max_rank = _arg(args, kwargs, 0, "max_lora_rank")
    targets = _arg(args, kwargs, 1, "target_modules")
    lora_paths = _arg(args, kwargs, 2, "lora_paths")
    registry = LayoutRegistry()  # init_state rebuilds the manager's state from scratch
    refs = list(lora_paths.values() if isinstance(lora_paths, Mapping) else (lora_paths or ()))
    specs: list[tuple[Any, AdapterSpec | None, list[Violation]]] = []
    for lora_ref in refs:
        spec, found = local_adapter(getattr(lora_ref, "lora_path", None), _subject(lora_ref))
        specs.append((lora_ref, spec, found))
    if _rank(max_rank) is None:  # sglang sizes the pool by the largest r of the set
        ranks = [_rank(spec.config.get("r")) for _, spec, _ in specs if spec is not None]
        max_rank = max([r for r in ranks if r is not None], default=None)
    if not targets:  # sglang's pool: the union of the start-up adapters' target_modules
        targets = set_pool(spec.config for _, spec, _ in specs if spec is not None)
    limits = _server_limits(instance, _rank(max_rank), targets)
    violations: list[Violation] = []
    for lora_ref, spec, found in specs:
        violations += found
        if spec is not None:
            violations += _spec_violations(spec, limits, _vocab(instance), _subject(lora_ref))
    report(violations)  # a server that would start wrong does not start
    for lora_ref, spec, _ in specs:
        lora_id = getattr(lora_ref, "lora_id", None)
        if isinstance(lora_id, str) and spec is not None and spec.tensors:
            registry.admit(lora_id, spec.tensors)
    _REGISTRIES[instance] = registry
    token = _IN_LOAD.set(instance)  # checked above: validate_new_adapter need not repeat it
    start_up = _START_UP.set((instance, limits))
    try:
        return wrapped(*args, **kwargs)
    finally:
        _START_UP.reset(start_up)
        _IN_LOAD.reset(token)


# --- LoRAMemoryPool ----------------------------------------------------------------------

def _empty_marker(pool: Any) -> Any:
    module = sys.modules.get(type(pool).__module__)
    return getattr(module, "EMPTY_SLOT", "")


def _prepare_lora_batch(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                        kwargs: dict[str, Any]) -> Any:
    """A batch needing more adapters than slots (LG201, before sglang changes anything);
    the slot maps before the step when they changed since the last (an unload, a write
    behind the pool's back) and after it."""
    cur_uids = _arg(args, kwargs, 0, "cur_uids")
    slots = getattr(instance, "max_loras_per_batch", None)
    if isinstance(slots, int) and cur_uids is not None:
        needed = len(cur_uids if type(cur_uids) is set else set(cur_uids))
        if needed > slots:
            report([make_violation("LG201", "exhausted", "LoRAMemoryPool.prepare_lora_batch",
                                   needed=needed, slots=slots)])
    _verify_maps(instance)
    result = wrapped(*args, **kwargs)
    _verify_maps(instance)
    return result


def _verify_maps(pool: Any) -> None:
    """LG201 for slot maps out of step, unless they are as verified last (`HeardList`).
    Found consistent, they are remembered so (sglang's list replaced, the first time)."""
    uid_to_slot = getattr(pool, "uid_to_buffer_id", None)
    slot_to_uid = getattr(pool, "buffer_id_to_uid", None)
    uids = getattr(slot_to_uid, "verified", None)
    if uids is not None and uids == uid_to_slot:
        return  # the maps this guard verified last, not written since: nothing to check
    if isinstance(uid_to_slot, Mapping) and slot_to_uid is not None:
        slots = getattr(pool, "max_loras_per_batch", None)
        found = check_slot_maps_violations(
            uid_to_slot, slot_to_uid, slots=slots if isinstance(slots, int) else None,
            empty=_empty_marker(pool), subject="LoRAMemoryPool slot maps")
        report(found)
        if not found:
            _verified(pool, uid_to_slot, slot_to_uid)


_POOLS: weakref.WeakSet[Any] = weakref.WeakSet()
"""The pools whose ``buffer_id_to_uid`` is a `HeardList` (given sglang's list back on
uninstrument). Its ``verified`` is a copy of ``uid_to_buffer_id`` as verified with it: sglang
writes both maps when it evicts, loads or removes an adapter, and a write to the dict alone
shows as the dict no longer equal to that copy."""


def _verified(pool: Any, uid_to_slot: Mapping[Any, Any], slot_to_uid: Any) -> None:
    """Remember the pool's maps as verified: a copy of the dict on the list that hears its
    writes (put in the place of sglang's list, the first time)."""
    uids = dict(uid_to_slot)
    if type(slot_to_uid) is HeardList:
        slot_to_uid.verified = uids
    elif type(slot_to_uid) is list:  # another type: nothing remembered, every step verified
        with contextlib.suppress(AttributeError, TypeError):  # a pool that refuses either
            _POOLS.add(pool)  # first: a list put in is always given back
            # set as sglang sets it (``vars(pool)`` would turn the pool's attributes into a
            # dict of their own: sglang's every ``self.`` read a little slower)
            pool.buffer_id_to_uid = HeardList(slot_to_uid, uids)


def _give_back(pool: Any) -> None:
    """sglang's own list back in the pool, holding the current slots."""
    slot_to_uid = getattr(pool, "buffer_id_to_uid", None)
    if type(slot_to_uid) is HeardList:
        pool.buffer_id_to_uid = slot_to_uid.give_back()


_PREPARE_PARAMS = ("self", "cur_uids", "lora_adapters", "lora_modules", "lora_refs",
                   "lora_embed_tokens_module", "lora_lm_head_module")


def _prepare_fast(original: Callable[..., Any],
                  guarded: Callable[..., Any]) -> Callable[..., Any]:
    """Every step prepares the batch's slots. A batch that fits the pool, on maps as verified
    last, calls sglang's method at once; after it, the maps are verified only if it wrote
    them (most steps: the adapters are resident, nothing written). Its parameters are
    sglang's own (every supported release): passed on by position, Python's cheapest call;
    a release that changes them gets the guarded path."""
    if not takes_exactly(original, len(_PREPARE_PARAMS), names=_PREPARE_PARAMS, defaults=()):
        return guarded

    def prepare_lora_batch(self: Any, cur_uids: Any, lora_adapters: Any, lora_modules: Any,
                           lora_refs: Any, lora_embed_tokens_module: Any,
                           lora_lm_head_module: Any) -> Any:
        try:  # len: at most as many adapters as slots, whatever the collection
            slot_to_uid = self.buffer_id_to_uid
            ready = slot_to_uid.verified == self.uid_to_buffer_id and \
                len(cur_uids) <= self.max_loras_per_batch
        except (AttributeError, TypeError):  # sglang's own list (not verified yet)
            ready = False
        if not ready:
            return guarded(self, cur_uids, lora_adapters, lora_modules, lora_refs,
                           lora_embed_tokens_module, lora_lm_head_module)
        result = original(self, cur_uids, lora_adapters, lora_modules, lora_refs,
                          lora_embed_tokens_module, lora_lm_head_module)
        if slot_to_uid.verified is None and INTEGRATION._active and not STATE.off:
            _verify_maps(self)  # an adapter swapped in: the maps sglang wrote
        return result
    return prepare_lora_batch


def _load_lora_weight_to_buffer(wrapped: Callable[..., Any], instance: Any,
                                args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    uid = _arg(args, kwargs, 0, "uid")
    buffer_id = _arg(args, kwargs, 1, "buffer_id")
    adapter = _arg(args, kwargs, 2, "lora_adapter")
    slots = getattr(instance, "max_loras_per_batch", None)
    found: list[Violation] = []
    if isinstance(slots, int) and not (isinstance(buffer_id, int) and 0 <= buffer_id < slots):
        found.append(make_violation("LG201", "range", "LoRAMemoryPool", uid=uid,
                                    slot=buffer_id, last=slots - 1))
    rank = getattr(getattr(adapter, "config", None), "r", None)
    max_rank = getattr(instance, "max_lora_rank", None)
    if isinstance(rank, int) and isinstance(max_rank, int) and rank > max_rank:
        found.append(make_violation("LG101", "max", f"adapter {uid!r}", rank=rank,
                                    module="r", max_rank=max_rank))
    report(found)
    try:
        return wrapped(*args, **kwargs)
    except ValueError as error:
        if not isinstance(error, LoRAGuardError):
            _engine_refused_hit(instance, error)
        raise


def _engine_refused_hit(pool: Any, error: ValueError) -> None:
    """LG003, with its fix, for sglang's own refusal of a stale pinned hit (sglang >=
    0.5.23): a ``ValueError`` raised in ``_get_maybe_cached_weight_for_transfer`` itself
    (the innermost frame of its traceback runs that method's code), for an entry of
    another shape or dtype than the weight; any other error is sglang's, unchanged."""
    tb = error.__traceback__
    if tb is None or not _CACHE_CODE:
        return
    while tb.tb_next is not None:
        tb = tb.tb_next
    if tb.tb_frame.f_code is not _CACHE_CODE[0]:
        return
    found = tb.tb_frame.f_locals
    _check_cached(pool, (found.get("pinned_weight_store"), found.get("cache_key"),
                         found.get("weight")), {})


def _cached_weight(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Any:
    _check_cached(instance, args, kwargs)
    return wrapped(*args, **kwargs)


def _cached_fast(original: Callable[..., Any],
                 guarded: Callable[..., Any]) -> Callable[..., Any]:
    """Where sglang refuses a stale pinned hit itself (>= 0.5.23), its method is left as it
    is (a hit costs nothing): the swap-in guard around it, which runs once per adapter
    swapped in, reports that refusal as LG003 with its fix (`_engine_refused_hit`, which
    knows the method by its code). Before, every lookup is checked first."""
    code = getattr(original, "__code__", None)
    _CACHE_CODE[:] = [] if code is None else [code]
    return original if _engine_checks_hits() else guarded


_CACHE_CODE: list[Any] = []
"""The code of sglang's ``_get_maybe_cached_weight_for_transfer``, as patched."""


def _consults_store(pool: Any, weight: Any) -> bool:
    """Whether sglang reads the pinned store for this weight at all: only with pinning
    available, overlap loading on, and a CPU weight not pinned yet (otherwise it returns the
    weight itself, or pins it afresh, and a stale entry is never served)."""
    if not getattr(pool, "pin_memory_available", True):
        return False
    if not getattr(pool, "enable_lora_overlap_loading", True):
        return False
    device = getattr(getattr(weight, "device", None), "type", "cpu")
    is_pinned = getattr(weight, "is_pinned", None)
    return device == "cpu" and not (callable(is_pinned) and is_pinned())


def _check_cached(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """LG003 for a pinned entry of another shape or dtype than the weight it stands for."""
    store = _arg(args, kwargs, 0, "pinned_weight_store")
    key = _arg(args, kwargs, 1, "cache_key")
    weight = _arg(args, kwargs, 2, "weight")
    if _consults_store(instance, weight) and store is not None and hasattr(store, "get"):
        violation = check_cache_entry(key, store.get(key), weight)
        if violation is not None:
            report([violation])


_HITS_CHECKED_FROM = (0, 5, 23)
"""The first sglang release whose ``_get_maybe_cached_weight_for_transfer`` refuses a pinned
hit of another shape or dtype itself (a ``ValueError`` before the stale tensor is returned)."""
_ENGINE_CHECKS: list[bool] = []


def _engine_checks_hits() -> bool:
    """Whether the installed sglang checks its pinned hits itself (asked once per process)."""
    if not _ENGINE_CHECKS:
        version = INTEGRATION.version() or ""
        parts = tuple(int(p) for p in re.findall(r"\d+", version)[:3])
        _ENGINE_CHECKS.append(len(parts) == 3 and parts >= _HITS_CHECKED_FROM)
    return _ENGINE_CHECKS[0]


# --- set_lora_info (fused MoE, shared sink) -----------------------------------------------

def _set_lora_info(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Any:
    function = getattr(wrapped, "__func__", None)
    if function is None or instance is None:
        return wrapped(*args, **kwargs)
    guarded = _GUARDED_SET_LORA.get(function)
    if guarded is None:
        guarded = shapes(
            SET_LORA_INFO_DIMS, where=lambda d: d["outer"] in (1, d["n"]),
            frozen=("slots", "n", "f", "rank"),
        )(function)
        _GUARDED_SET_LORA[function] = guarded
    return guarded(instance, *args, **kwargs)


def _forget() -> None:
    """On uninstrument: the layout registries, the release's answers; sglang's own slot
    lists back in their pools."""
    for pool in list(_POOLS):
        _give_back(pool)
    _POOLS.clear()
    _REGISTRIES.clear()
    _ENGINE_CHECKS.clear()
    _CACHE_CODE.clear()


_SET_LORA_PARAMS = ("self", "gate_up_lora_a_weights", "gate_up_lora_b_weights",
                    "down_lora_a_weights", "down_lora_b_weights")

INTEGRATION = Integration(
    name=name,
    distribution="sglang",
    min_version=SPECS["sglang"].releases[-1],
    max_version="0.5.24",
    patches=(
        Patch("sglang.srt.lora.lora_manager", "LoRAManager.validate_new_adapter",
              ("self", "lora_config", "lora_ref"), _validate_new_adapter),
        Patch("sglang.srt.lora.lora_manager", "LoRAManager.load_lora_adapter",
              ("self", "lora_ref"), _load_lora_adapter),
        Patch("sglang.srt.lora.lora_manager", "LoRAManager.unload_lora_adapter",
              ("self", "lora_ref"), _unload_lora_adapter),
        Patch("sglang.srt.lora.lora_manager", "LoRAManager.init_state",
              ("self", "max_lora_rank", "target_modules", "lora_paths"), _init_state,
              optional=True),
        Patch("sglang.srt.lora.lora", "LoRAAdapter._process_weight", _WEIGHT_PARAMS,
              _weight_read, fast=_weight_read_fast),
        Patch("sglang.srt.lora.lora", "LoRAAdapter._normalize_weights", ("self",),
              _weights_read),
        Patch("sglang.srt.lora.mem_pool", "LoRAMemoryPool.prepare_lora_batch",
              ("self", "cur_uids", "lora_adapters", "lora_modules"), _prepare_lora_batch,
              fast=_prepare_fast),
        Patch("sglang.srt.lora.mem_pool", "LoRAMemoryPool.load_lora_weight_to_buffer",
              ("self", "uid", "buffer_id", "lora_adapter"), _load_lora_weight_to_buffer),
        Patch("sglang.srt.lora.mem_pool", "LoRAMemoryPool._get_maybe_cached_weight_for_transfer",
              ("self", "pinned_weight_store", "cache_key", "weight"), _cached_weight,
              optional=True, fast=_cached_fast),
        Patch("sglang.srt.lora.layers", "FusedMoEWithLoRA.set_lora_info", _SET_LORA_PARAMS,
              _set_lora_info, optional=True),
        Patch("sglang.srt.models.inkling_common.lora",
              "InklingBatchDenseMLPWithLoRA.set_lora_info", _SET_LORA_PARAMS, _set_lora_info,
              optional=True),
        Patch("sglang.srt.models.inkling_common.lora",
              "InklingBatchDenseMLPWithLoRAV2.set_lora_info", _SET_LORA_PARAMS, _set_lora_info,
              optional=True),
    ),
    on_uninstrument=_forget,
)


def instrument() -> AttachReport:
    """Guard sglang's LoRA loading, memory pool and MoE layers, now or when imported.

    Example:
        >>> from lora_guard.integrations import sglang as sglang_guard
        >>> report = sglang_guard.instrument(); sglang_guard.INTEGRATION.instrumented
        True
        >>> sglang_guard.uninstrument()
    """
    return INTEGRATION.instrument()


def uninstrument() -> None:
    """Restore sglang's original functions exactly; a hook firing later does nothing.

    Example:
        >>> from lora_guard.integrations import sglang as sglang_guard
        >>> sglang_guard.uninstrument(); sglang_guard.INTEGRATION.instrumented
        False
    """
    INTEGRATION.uninstrument()
