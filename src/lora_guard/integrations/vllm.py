"""lora_guard in front of vLLM's LoRA loading and slot activation.

Guarded (vLLM 0.29.0 to 0.34.0, each release run by the engine tier ``tests/engines/``, with
that release's profile: ``vllm.lora.lora_model`` / ``model_manager`` / ``worker_manager`` /
``peft_helper``, where every release of the range keeps these functions with these
parameters (``tests/engines/fingerprints/``); another release is patched where the signatures
match, with an `IntegrationWarning`, and `lora-guard doctor` lists each hook):

- ``LoRAModel.from_local_checkpoint`` (the successor of ``vllm.lora.models``'): what vLLM
  read, the config its ``PEFTHelper`` was made from and the tensors' names, shapes and
  dtypes, goes through the checks of ``lora-guard check`` (`lora_guard.check_adapters`)
  in ``LoRAModel.from_lora_tensors``, before a ``LoRAModel`` exists (the folder is not read
  twice; when vLLM refuses the adapter first, the checker reads it and its error, every
  defect with its fix, is raised from vLLM's), with the one vLLM profile that
  ``lora-guard check --engine vllm`` and ``ServingLimits.for_engine("vllm", ...)`` use
  (the same codes for the same adapter; the engine tier asserts it), filled with the
  engine's limits: ``max_lora_rank`` (LG101, for ``r``, ``rank_pattern`` and the tensors),
  ``expected_lora_modules`` (LG104, unless a ``weights_mapper`` renames the weights) and
  ``model_vocab_size`` (LG109 for an embedding's A or lm_head's B). So vLLM also gets the
  checker's LG102, LG103, LG104 key grammar, LG105 (every config feature vLLM does not
  serve: DoRA, ``lora_bias``, ``bias``, ``modules_to_save``, ...), LG107, LG108 and LG002
  within the adapter, and LG106 as the vLLM profile has it: mixed or unlisted float dtypes
  pass (vLLM casts every weight to its LoRA dtype), integer weights do not (cast, they serve
  garbage).
  ``max_lora_rank`` comes from the ``WorkerLoRAManager._load_adapter`` that calls it; called
  directly (an offline tool), from the ``LoRAConfig`` its ``PEFTHelper.validate_legal`` was
  given, else the current vLLM config, else vLLM's default (16). ``modules_to_save`` of a
  sequence-classification head only (``score``, ``classifier``) is served (vLLM 0.31 and later
  do, on a pooling model; 0.29 and 0.30 refuse every ``modules_to_save``).
- ``LoRAModelManager.activate_adapter`` (and so the LRU manager's): the slot table
  ``lora_index_to_id`` against the active adapters before and after activation (LG201), and
  an activation with no free slot (LG201) instead of a bare "No free lora slots".

Example:
    >>> from lora_guard.integrations import vllm as vllm_guard
    >>> report = vllm_guard.instrument()   # which hooks attached (or are pending)
    >>> vllm_guard.uninstrument()
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .._checking.check_adapters import ServingLimits, spec_violations
from .._checking.checks import check_slot_maps_violations
from .._checking.engines import SPECS
from .._checking.invariants.lg104_unsupported_target import names_not_served
from .._checking.limits import running_limits
from .._core.config import report
from .._core.errors import Violation, make_violation
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

__all__ = ["INTEGRATION", "instrument", "slot_violations", "uninstrument"]

name = "vllm"
"""This integration's name, as `lora_guard.integrations.get` knows it."""

class _Server:
    """What a vLLM worker's loads are checked against, computed once per server (and again
    only when its ``LoRAConfig``, model or limits change): kept on the worker itself."""

    __slots__ = ("base", "expected", "heads", "key", "limits", "mapped", "max_rank", "served")

    def __init__(self, worker: Any, key: tuple[Any, ...]) -> None:
        manager = getattr(worker, "_adapter_manager", None)
        model = getattr(manager, "model", None)
        self.key = key
        self.max_rank = _usable_rank(getattr(getattr(worker, "lora_config", None),
                                             "max_lora_rank", None))
        self.base = _text_config(getattr(model, "config", None))
        self.heads = any(getattr(model, h, None) is not None for h in _CLASSIFIER_HEADS)
        self.expected = _expected_modules(manager)
        self.mapped = bool(getattr(model, "hf_to_vllm_mapper", None))
        rank = self.max_rank if self.max_rank is not None else _max_rank(None)
        self.limits = _limits(self.expected, self.mapped, rank, self.heads, self.base)
        self.served = _served(self.expected)


_SERVER_SLOT = "_lora_guard_vllm_server"


def _server(worker: Any) -> _Server:
    """The worker's `_Server`, made on its first load and whenever what it reads changed."""
    manager = getattr(worker, "_adapter_manager", None)
    lora_config = getattr(worker, "lora_config", None)
    key = (lora_config, getattr(lora_config, "max_lora_rank", None), manager,
           getattr(manager, "model", None), getattr(manager, "supported_lora_modules", None))
    kept = getattr(worker, _SERVER_SLOT, None)
    if type(kept) is _Server and len(kept.key) == len(key) and all(
            a is b for a, b in zip(kept.key, key, strict=True)):
        return kept
    server = _Server(worker, key)
    note(worker, _SERVER_SLOT, server)
    return server


_LOADING: contextvars.ContextVar[_Server | None] = contextvars.ContextVar(
    "lora_guard_vllm_loading", default=None)
"""The server whose worker ``_load_adapter`` runs (its limits, base and max rank)."""


class _Load:
    """One adapter folder vLLM is loading, and whether lora_guard has checked it yet."""

    __slots__ = ("checked", "expected", "lora_dir", "mapped", "peft_helper", "server", "vocab")

    def __init__(self, lora_dir: str | os.PathLike[str], expected: Any, *, mapped: bool,
                 peft_helper: Any, vocab: Any, server: _Server | None) -> None:
        self.lora_dir, self.expected, self.mapped = lora_dir, expected, mapped
        self.peft_helper, self.vocab, self.server = peft_helper, vocab, server
        self.checked = False

    def check_dir(self) -> None:
        """The checker's own read of the folder, then its checks (`_check_dir`)."""
        self.checked = True
        _check_dir(self.lora_dir, self.expected, mapped=self.mapped,
                   peft_helper=self.peft_helper, vocab=self.vocab, server=self.server)


_CURRENT: contextvars.ContextVar[_Load | None] = contextvars.ContextVar(
    "lora_guard_vllm_load", default=None)
"""The folder whose load is under way (its tensors reach ``from_lora_tensors``)."""


def _load_adapter(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
    """The worker's load. Its checks run on what vLLM reads (`_from_lora_tensors`); when
    vLLM refuses the adapter before they ran (its ``PEFTHelper`` or module checks), the
    checker reads the folder and reports every defect with its fix, from vLLM's error."""
    server = _server(instance)
    lora_request = kwargs.get("lora_request", args[0] if args else None)
    path = getattr(lora_request, "lora_path", None)
    load = None
    if isinstance(path, (str, os.PathLike)):
        load = _Load(path, server.expected, mapped=server.mapped, peft_helper=None,
                     vocab=getattr(instance, "vocab_size", None), server=server)
    token, current = _LOADING.set(server), _CURRENT.set(load)
    try:
        return wrapped(*args, **kwargs)
    except Exception:
        if load is not None and not load.checked and os.path.isdir(path):  # type: ignore[arg-type]
            load.check_dir()  # reports (raising from vLLM's error); else vLLM's error stands
        raise
    finally:
        _CURRENT.reset(current)
        _LOADING.reset(token)


def _expected_modules(manager: Any) -> set[str] | None:
    """The modules vLLM's worker expects adapter weights for (its own computation)."""
    supported = getattr(manager, "supported_lora_modules", None)
    packed = getattr(manager, "packed_modules_mapping", None) or {}
    if not isinstance(supported, Iterable):
        return None
    expected: set[str] = set()
    for module in supported:
        expected.update(packed.get(module, [module]) if isinstance(packed, dict) else [module])
        if module == "experts":
            expected.add(module)
    return expected


def _text_config(config: Any) -> dict[str, Any] | None:
    """The served model's text config, as the checker reads a ``config.json``."""
    text = getattr(config, "get_text_config", None)
    if callable(text):
        with contextlib.suppress(Exception):  # no text part: the config whole
            config = text()
    to_dict = getattr(config, "to_dict", None)
    if not callable(to_dict):
        return None
    try:
        found = to_dict()
    except Exception:  # a config that cannot say its fields: the dims are not checked
        return None
    return found if isinstance(found, dict) and found.get("hidden_size") else None


_CLASSIFIER_HEADS = frozenset({"classifier", "score"})
"""The ``modules_to_save`` vLLM 0.34 serves: a sequence-classification head."""
_VALIDATED_SLOT = "_lora_guard_max_lora_rank"
"""Where a ``PEFTHelper`` keeps the ``max_lora_rank`` its ``validate_legal`` saw."""


def _usable_rank(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if ok else None


def _validate_legal(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
    result = wrapped(*args, **kwargs)
    _note_rank(instance, args[0] if args else kwargs.get("lora_config"))
    return result


def _note_rank(helper: Any, lora_config: Any) -> None:
    """Keep on the helper the ``max_lora_rank`` it was validated against (`_max_rank`)."""
    max_rank = _usable_rank(getattr(lora_config, "max_lora_rank", None))
    if max_rank is not None:
        note(helper, _VALIDATED_SLOT, max_rank)


def _validate_fast(original: Callable[..., Any],
                   guarded: Callable[..., Any]) -> Callable[..., Any]:
    """``validate_legal`` checks nothing here: it notes the rank, in one call."""
    if not takes_exactly(original, 2):
        return guarded

    def validate_legal(self: Any, lora_config: Any) -> Any:
        result = original(self, lora_config)
        _note_rank(self, lora_config)
        return result
    return validate_legal


def _max_rank(peft_helper: Any) -> int | None:
    """The server's ``max_lora_rank`` for this load: the worker's that calls it; else the
    ``LoRAConfig`` this adapter's `PEFTHelper` was validated against (an offline tool's
    ``validate_legal(lora_config)``); else the current vLLM config's; else vLLM's default."""
    loading = _LOADING.get()
    if loading is not None and loading.max_rank is not None:
        return loading.max_rank
    validated = _usable_rank(getattr(peft_helper, _VALIDATED_SLOT, None))
    if validated is not None:
        return validated
    config_module = sys.modules.get("vllm.config")
    current = getattr(config_module, "get_current_vllm_config_or_none", None)
    if callable(current):
        try:
            config = current()
        except Exception:
            config = None
        found = _usable_rank(getattr(getattr(config, "lora_config", None), "max_lora_rank",
                                     None))
        if found is not None:
            return found
    lora_config = getattr(config_module, "LoRAConfig", None)
    fields = getattr(lora_config, "__dataclass_fields__", {})
    default = getattr(fields.get("max_lora_rank"), "default", None)
    return _usable_rank(default)


def _limits(expected: Any, mapped: bool, max_rank: int | None, heads: bool,
            base: dict[str, Any] | None) -> ServingLimits:
    """The vLLM profile of ``lora-guard check --engine vllm`` (the installed release's rules:
    packed names loaded only where the model has them, weights cast to the LoRA dtype, the
    classification heads of a pooling model), with this server's ``max_lora_rank``, the
    modules its model expects weights for and its base config."""
    served = None
    if not mapped and isinstance(expected, Iterable) and not isinstance(expected, str):
        served = frozenset(m for m in expected if isinstance(m, str) and m) or None
        if served is not None and heads:
            served = served | _CLASSIFIER_HEADS
    narrow: dict[str, Any] = {"max_rank": max_rank, "target_modules": served}
    if not heads:  # the served model has no classification head to load one into
        narrow["served_heads"] = None
    return running_limits("vllm", INTEGRATION.version(), base_config=base,
                          max_lora_rank=max_rank, runner="pooling" if heads else None,
                          narrow=narrow)


_OFFLINE: dict[tuple[Any, ...], ServingLimits] = {}
"""The limits of loads outside a worker, by what they are made from (a tool loads many
adapters against one set of modules and one rank)."""


def _offline_limits(expected: Any, mapped: bool, max_rank: int | None) -> ServingLimits:
    """`_limits` for vLLM's loader called directly: no served model, so no base config and
    the classification heads allowed; made once per (modules, mapping, rank)."""
    try:
        key = (expected if expected is None or isinstance(expected, str) else
               frozenset(expected), mapped, max_rank)
        limits = _OFFLINE.get(key)
    except TypeError:  # unhashable names: nothing to keep
        return _limits(expected, mapped, max_rank, True, None)
    if limits is None:
        if len(_OFFLINE) >= 32:
            _OFFLINE.clear()
        limits = _OFFLINE[key] = _limits(expected, mapped, max_rank, True, None)
    return limits


def _check_dir(lora_dir: Any, expected: Any, *, mapped: bool, peft_helper: Any,
               vocab: Any, server: _Server | None = None) -> None:
    subject = _subject(lora_dir)
    spec, violations = local_adapter(lora_dir, subject)
    report(_checked_spec(spec, violations, expected, mapped=mapped, peft_helper=peft_helper,
                         vocab=vocab, server=server, subject=subject))


def _subject(lora_dir: str | os.PathLike[str]) -> str:
    return f"adapter {os.path.basename(os.path.normpath(lora_dir))!r}"


def _checked_spec(spec: AdapterSpec | None, violations: list[Violation], expected: Any, *,
                  mapped: bool, peft_helper: Any, vocab: Any, server: _Server | None,
                  subject: str, limits: ServingLimits | None = None) -> list[Violation]:
    """The checker's checks of one adapter with vLLM's profile and this load's limits."""
    if spec is None:
        return violations
    if limits is None:
        limits = _limits_for(expected, mapped=mapped, peft_helper=peft_helper, server=server)
    violations = violations + spec_violations(
        spec, limits, subject=subject,
        vocab_size=vocab if isinstance(vocab, int) and vocab > 0 else None)
    served = server.served if server is not None and limits is server.limits else _served(
        expected)
    return violations + _packed_names(spec, served, subject, violations)


def _limits_for(expected: Any, *, mapped: bool, peft_helper: Any,
                server: _Server | None) -> ServingLimits:
    # weights_mapper: the names on disk are not the served names
    if server is not None and server.mapped == mapped and (
            expected is server.expected or expected == server.expected):
        return server.limits  # the worker's own load: its limits, made once
    if (loading := _LOADING.get()) is not None:  # another folder, inside a worker load
        return _limits(expected, mapped, _max_rank(peft_helper), loading.heads, loading.base)
    return _offline_limits(expected, mapped, _max_rank(peft_helper))  # an offline tool


def _served(expected: Any) -> frozenset[str] | None:
    """The leaf names vLLM loads adapter weights for (`_packed_names`), with the
    classification heads; None when it expects none or they are unknown."""
    if not isinstance(expected, Iterable) or isinstance(expected, str):
        return None
    served = frozenset(m for m in expected if isinstance(m, str))
    return served | _CLASSIFIER_HEADS if served - _CLASSIFIER_HEADS else None


def _packed_names(spec: AdapterSpec, served: frozenset[str] | None, subject: str,
                  found: list[Violation]) -> list[Violation]:
    """vLLM matches the leaf name of each adapter module exactly against the modules it
    expects (``served``: the parts of a packed layer, ``q_proj``, not ``qkv_proj``; a weights
    mapper renames prefixes, not leaves): a fused name whose parts are served, which the
    checker accepts for engines that split it, is refused by vLLM."""
    if served is None or any(v.code in ("LG104", "LG109") for v in found):
        return []
    return names_not_served(spec, served, subject)


def _from_local_checkpoint(wrapped: Callable[..., Any], instance: Any,
                           args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """vLLM reads the adapter (config: its ``PEFTHelper``; weights: its tensors) and the
    checks run on what it read (`_from_lora_tensors`), before the ``LoRAModel`` is made; a
    helper whose config lora_guard did not see, an expert-parallel load (vLLM skips other
    ranks' experts) or vLLM refusing first: the checker reads the folder itself."""
    lora_dir = kwargs.get("lora_dir", args[0] if args else None)
    if not isinstance(lora_dir, (str, os.PathLike)) or kwargs.get("tensorizer_config_dict"):
        return wrapped(*args, **kwargs)
    expected = kwargs.get("expected_lora_modules", args[1] if len(args) > 1 else None)
    peft_helper = kwargs.get("peft_helper", args[2] if len(args) > 2 else None)
    mapped = bool(kwargs.get("weights_mapper"))
    read = _config_of(peft_helper) is not None and kwargs.get("moe_ep_spec") is None
    outer = _CURRENT.get()
    if outer is not None and outer.lora_dir == lora_dir and not outer.checked:
        load = outer  # the worker's load of this folder (its hook reports a refusal)
        load.expected, load.mapped, load.peft_helper = expected, mapped, peft_helper
        if read:
            return wrapped(*args, **kwargs)
    else:
        load = _Load(lora_dir, expected, mapped=mapped, peft_helper=peft_helper,
                     vocab=kwargs.get("model_vocab_size"), server=None)
    if not read:
        load.check_dir()
        return wrapped(*args, **kwargs)
    token = _CURRENT.set(load)
    try:
        return wrapped(*args, **kwargs)
    except Exception:
        if not load.checked:  # vLLM refused before its tensors reached the checks
            load.check_dir()
        raise
    finally:
        _CURRENT.reset(token)


def _from_lora_tensors(wrapped: Callable[..., Any], instance: Any,
                       args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    load = _CURRENT.get()
    if load is not None and not load.checked:  # a folder vLLM has just read (not a dummy)
        _check_tensors(load, kwargs.get("tensors", args[1] if len(args) > 1 else None))
    return wrapped(*args, **kwargs)


_TENSORS_PARAMS = ("cls", "lora_model_id", "tensors", "peft_helper", "device", "dtype",
                   "model_vocab_size", "weights_mapper", "skip_prefixes")
"""``LoRAModel.from_lora_tensors``'s parameters in every supported release (0.29.0-0.34.0,
``tests/engines/fingerprints/``), with the defaults `_TENSORS_DEFAULTS`."""
_TENSORS_DEFAULTS = ("cuda", None, None, None, None)


def _tensors_fast(original: Callable[..., Any],
                  guarded: Callable[..., Any]) -> Callable[..., Any]:
    """The checks of a folder's load run in this one call, before vLLM's (a load under way
    is only ever set by a guarded outer call: `_from_local_checkpoint`, `_load_adapter`).
    vLLM passes its eight arguments by keyword: where the method's parameters and defaults
    are the known ones, this function has them too and passes them on by position (about
    6,600 instructions a load less than gathering them into a dict and spreading it again)."""
    if takes_exactly(original, len(_TENSORS_PARAMS), names=_TENSORS_PARAMS,
                     defaults=_TENSORS_DEFAULTS):
        def from_lora_tensors(cls: Any, lora_model_id: Any, tensors: Any, peft_helper: Any,
                              device: Any = "cuda", dtype: Any = None,
                              model_vocab_size: Any = None, weights_mapper: Any = None,
                              skip_prefixes: Any = None) -> Any:
            load = _CURRENT.get()
            if load is not None and not load.checked:
                _check_tensors(load, tensors)
            return original(cls, lora_model_id, tensors, peft_helper, device, dtype,
                            model_vocab_size, weights_mapper, skip_prefixes)
        return from_lora_tensors

    def from_lora_tensors_any(cls: Any, /, *args: Any, **kwargs: Any) -> Any:
        load = _CURRENT.get()
        if load is not None and not load.checked:
            _check_tensors(load, kwargs.get("tensors", args[1] if len(args) > 1 else None))
        return original(cls, *args, **kwargs)
    return from_lora_tensors_any


def _check_tensors(load: _Load, tensors: Any) -> None:
    load.checked = True
    config = _config_of(load.peft_helper)
    if isinstance(tensors, dict) and config is not None:
        _check_loaded(load, config, tensors)
    else:
        load.check_dir()


def _check_loaded(load: _Load, config: dict[str, Any], tensors: dict[str, Any]) -> None:
    """The checks of an adapter vLLM has read, on its config and tensors. One found clean
    before under the same limits (`CleanVerdicts`: a recipe's adapters, one loaded again) is
    not checked again: only the files vLLM read (the reader's file rules) and whether the
    folder ships an ``added_tokens.json`` (which vLLM does not read) are looked at again."""
    limits = _limits_for(load.expected, mapped=load.mapped, peft_helper=load.peft_helper,
                         server=load.server)
    key = read_key(config, tensors, load.vocab)
    if _CLEAN.clean(key, limits, load.lora_dir):
        return
    subject = _subject(load.lora_dir)
    if not _VLLM_KEYS.isdisjoint(config):
        config = dict(config)
        for added in _VLLM_KEYS:
            config.pop(added, None)
    spec, violations = loaded_adapter(load.lora_dir, config, tensors, subject, key=key)
    found = _checked_spec(spec, violations, load.expected, mapped=load.mapped,
                          peft_helper=load.peft_helper, vocab=load.vocab, server=load.server,
                          subject=subject, limits=limits)
    report(found)
    if not found and spec is not None and "added_tokens" not in spec.features:
        _CLEAN.remember(key, limits)


_CLEAN = CleanVerdicts("vLLM loads found clean: (config, tensors, vocabulary)")


_CONFIG_SLOT = "_lora_guard_config"
"""Where a ``PEFTHelper`` keeps the ``adapter_config.json`` it was made from, as vLLM parsed
it (its fields alone drop what vLLM does not read, and the checks read those too)."""
_VLLM_KEYS = frozenset({"vllm_max_position_embeddings"})
"""Keys vLLM adds to the config it read before making the helper."""


def _from_dict(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> Any:
    helper = wrapped(*args, **kwargs)
    _note_config(helper, args[0] if args else kwargs.get("config_dict"))
    return helper


def _note_config(helper: Any, config: Any) -> None:
    """Keep on the helper the config it was made from (`_config_of`)."""
    if isinstance(config, dict):
        note(helper, _CONFIG_SLOT, config)


def _from_dict_fast(original: Callable[..., Any],
                    guarded: Callable[..., Any]) -> Callable[..., Any]:
    """``from_dict`` checks nothing: it notes the config, in one call."""
    if not takes_exactly(original, 2):
        return guarded

    def from_dict(cls: Any, config_dict: Any) -> Any:
        helper = original(cls, config_dict)
        _note_config(helper, config_dict)
        return helper
    return from_dict


def _config_of(peft_helper: Any) -> dict[str, Any] | None:
    """The config a `PEFTHelper` was made from, as vLLM parsed it (with the keys vLLM adds);
    None for a helper made before lora_guard was on."""
    config = getattr(peft_helper, _CONFIG_SLOT, None)
    return config if isinstance(config, dict) else None


def slot_violations(manager: Any) -> list[Violation]:
    """LG201 for a vLLM LoRA manager whose slot table and active adapters disagree.

    Example:
        >>> import types
        >>> from lora_guard.integrations.vllm import slot_violations
        >>> manager = types.SimpleNamespace(lora_index_to_id=[1, None], _active_adapters={1: None})
        >>> slot_violations(manager)
        []
    """
    slots: Sequence[Any] | None = getattr(manager, "lora_index_to_id", None)
    active = getattr(manager, "_active_adapters", None)
    if slots is None or active is None:
        return []
    table = list(slots)
    uid_to_slot = {uid: table.index(uid) if uid in table else -1 for uid in list(active)}
    return check_slot_maps_violations(uid_to_slot, table, slots=len(table),
                                      subject="vLLM LoRA slots")


def _activate_adapter(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> Any:
    lora_id = args[0] if args else kwargs.get("lora_id")
    table: Any = getattr(instance, "lora_index_to_id", None)
    active = getattr(instance, "_active_adapters", None)
    found = slot_violations(instance)
    if not found and table is not None and lora_id not in (active or {}) and None not in table:
        found.append(make_violation("LG201", "exhausted", "vLLM LoRA slots",
                                    needed=len(active or {}) + 1, slots=len(table)))
    report(found)
    result = wrapped(*args, **kwargs)
    found = slot_violations(instance)
    report(found)
    if not found:
        _verified(instance)
    return result


_MANAGERS: weakref.WeakSet[Any] = weakref.WeakSet()
"""The managers whose slot table (``lora_index_to_id``) is a `HeardList` (given their own
lists back on uninstrument). Its ``verified`` holds the ids of the adapters found in it, active,
at that check; vLLM replacing the table with a list of its own (``remove_all_adapters``) leaves
no ``verified`` to read."""


def _verified(manager: Any) -> None:
    """Remember the manager's slot table as consistent: the ids in it that are active."""
    table = getattr(manager, "lora_index_to_id", None)
    active = getattr(manager, "_active_adapters", None)
    if not isinstance(table, list) or active is None:
        return
    try:
        ids = frozenset(i for i in table if i is not None and i in active)
    except TypeError:  # unhashable ids: nothing remembered, every call checked
        return
    if type(table) is HeardList:
        table.verified = ids
        return
    if note(manager, "lora_index_to_id", HeardList(table, ids)):
        with contextlib.suppress(TypeError):  # not weakly referable: keeps our table
            _MANAGERS.add(manager)


_BY_KEYWORD = object()


def _activate_fast(original: Callable[..., Any],
                   guarded: Callable[..., Any]) -> Callable[..., Any]:
    """Every step activates each adapter of the batch; one in the slot table this guard
    verified last, with no write to the table since (`HeardList`), is vLLM's own early return:
    nothing new to check, the original is called at once (no comparison, no copy). Where
    vLLM's method takes ``(self, lora_id)`` alone (every supported release), so does this
    function: Python's cheapest call, both into it and on to vLLM's."""
    if takes_exactly(original, 2):
        def activate_adapter(self: Any, lora_id: Any) -> Any:
            try:
                if lora_id in self.lora_index_to_id.verified:
                    return original(self, lora_id)
            except (AttributeError, TypeError):  # vLLM's own list, one written, an odd id
                pass
            return guarded(self, lora_id)
        return activate_adapter

    def activate_any(self: Any, lora_id: Any = _BY_KEYWORD, /, *args: Any,
                     **kwargs: Any) -> Any:
        try:
            if lora_id in self.lora_index_to_id.verified:
                return original(self, lora_id, *args, **kwargs)
        except (AttributeError, TypeError):
            pass
        if lora_id is _BY_KEYWORD:
            return guarded(self, *args, **kwargs)
        return guarded(self, lora_id, *args, **kwargs)
    return activate_any


def _forget() -> None:
    _OFFLINE.clear()
    _CLEAN.clear()
    for manager in list(_MANAGERS):  # vLLM's managers get plain lists back
        table = getattr(manager, "lora_index_to_id", None)
        if type(table) is HeardList:
            note(manager, "lora_index_to_id", table.give_back())
    _MANAGERS.clear()


INTEGRATION = Integration(
    name=name,
    distribution="vllm",
    min_version=SPECS["vllm"].releases[-1],
    max_version="0.34.1",
    on_uninstrument=_forget,
    patches=(
        Patch("vllm.lora.lora_model", "LoRAModel.from_local_checkpoint",
              ("cls", "lora_dir", "expected_lora_modules", "peft_helper"),
              _from_local_checkpoint),
        Patch("vllm.lora.lora_model", "LoRAModel.from_lora_tensors",
              ("cls", "lora_model_id", "tensors", "peft_helper"), _from_lora_tensors,
              fast=_tensors_fast),
        Patch("vllm.lora.peft_helper", "PEFTHelper.from_dict", ("cls", "config_dict"),
              _from_dict, optional=True, fast=_from_dict_fast),
        Patch("vllm.lora.worker_manager", "WorkerLoRAManager._load_adapter",
              ("self", "lora_request"), _load_adapter, optional=True),
        Patch("vllm.lora.peft_helper", "PEFTHelper.validate_legal", ("self", "lora_config"),
              _validate_legal, optional=True, fast=_validate_fast),
        Patch("vllm.lora.model_manager", "LoRAModelManager.activate_adapter",
              ("self", "lora_id"), _activate_adapter, fast=_activate_fast),
    ),
)


def instrument() -> AttachReport:
    """Guard vLLM's adapter loading and slot activation, now or when vLLM is imported.

    Example:
        >>> from lora_guard.integrations import vllm as vllm_guard
        >>> report = vllm_guard.instrument(); vllm_guard.INTEGRATION.instrumented
        True
        >>> vllm_guard.uninstrument()
    """
    return INTEGRATION.instrument()


def uninstrument() -> None:
    """Restore vLLM's original functions exactly; a hook firing later does nothing.

    Example:
        >>> from lora_guard.integrations import vllm as vllm_guard
        >>> vllm_guard.uninstrument(); vllm_guard.INTEGRATION.instrumented
        False
    """
    INTEGRATION.uninstrument()
