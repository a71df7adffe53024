"""lora_guard in front of PEFT: adapter loading and hot-swapping, checked before any write.

Guarded (PEFT >= 0.17):

- ``PeftModel.load_adapter``: the adapter folder's config and safetensors header (never the
  tensor data) go through the checker of ``lora-guard check``
  (`lora_guard.check_adapters`) before PEFT adds a single module, with what
  PEFT serves: every config feature allowed, LG109 against the live model's modules. So:
  malformed files (LG108), A/B rank disagreement or ranks that contradict
  ``r``/``rank_pattern`` (LG102), orphan halves (LG103), zero-size tensors (LG107), weights
  whose in/out dims do not fit the model (LG109); then the MoE layout against the adapters
  already on the model (LG002, one `LayoutRegistry` per model). Keys PEFT does not know and
  dtypes are PEFT's (it warns, it casts).
- ``PeftModel.add_adapter``: the MoE layout the config will create (LG002).
- ``PeftModel.delete_adapter``: releases the adapter's layout.
- ``peft.utils.hotswap.hotswap_adapter_from_state_dict`` (and so ``hotswap_adapter``, which
  calls it): the whole swap is validated before the first tensor is written: every shape
  against the current (possibly padded) shape (LG109 for in/out dims, LG102 for A/B ranks
  that disagree), the configs that change the computed function (LG105), and on a model
  prepared with ``prepare_model_for_compiled_hotswap`` a rank above the padded rank (LG001).
  A refused swap leaves the model's state dict bitwise unchanged. ``hotswap_adapter`` also
  runs the checker's checks (LG108, LG107, LG002 within the adapter) on what PEFT read: the
  config dict its ``from_json_file`` parsed and the tensors ``load_peft_weights`` loaded
  (kept by two hooks; nothing is read twice), in the same call, before the first write; when
  PEFT refuses the adapter before that (its config check), the checker reads the folder and
  raises from PEFT's error. Problems PEFT itself refuses before writing (unexpected keys, a
  merged adapter, another PEFT type) are left to PEFT, so its errors and its callers'
  ``except`` clauses stay as they are. The guard adds no walk of the model (PEFT's swap
  walks it twice itself: its modules, its state dict).

Example:
    >>> from lora_guard.integrations import peft as peft_guard
    >>> report = peft_guard.instrument()      # now, or when peft is imported
    >>> peft_guard.uninstrument()
"""

from __future__ import annotations

import contextvars
import os
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._checking.check_adapters import Expected, ServingLimits, spec_violations
from .._checking.checks import shape_of
from .._checking.invariants import settled_codes
from .._checking.invariants.lg104_unsupported_target import not_selected
from .._core.config import report
from .._core.errors import Violation, make_violation
from .._guarding.layouts import LayoutRegistry
from .._reading.adapters import FEATURES, AdapterSpec, other_method
from .._reading.bounded import Bounded
from .._reading.grammar import LAYER_INDEX as _LAYER
from ._base import (
    AttachReport,
    CleanVerdicts,
    Integration,
    Patch,
    loaded_adapter,
    local_adapter,
    read_key,
)

__all__ = ["INTEGRATION", "instrument", "layer_violations", "layout_registry", "uninstrument"]

name = "peft"
"""This integration's name, as `lora_guard.integrations.get` knows it."""

_REGISTRIES: weakref.WeakKeyDictionary[Any, LayoutRegistry] = weakref.WeakKeyDictionary()
_IN_LOAD: contextvars.ContextVar[bool] = contextvars.ContextVar("lora_guard_peft_load",
                                                                 default=False)
_PEFT_SERVES = ServingLimits(allow=frozenset(FEATURES))
_PEFT_LOADS = ServingLimits(allow=frozenset(FEATURES), engine="PEFT",
                            engine_rules=("peft-selects-modules",))
"""A load puts LoRA on the modules the config selects (a hot-swap keeps the loaded ones)."""
# What PEFT's LoraConfig fills in for a field the saved config leaves out: not malformed here.
PEFT_CONFIG_DEFAULTS: Mapping[str, Any] = {"r": 8, "lora_alpha": 8, "target_modules": None}
"""PEFT implements every config feature (DoRA, biases, modules_to_save, ...): no LG105."""
_LOAD_SETTLED_BY_PEFT = settled_codes("LG104", "LG106", "LG002", "LG116", "LG118")
"""Checks of the checker a load leaves out: keys PEFT does not know are PEFT's to warn
about (LG104), PEFT copies weights into its own parameters' dtype (LG106), the layout
registry reports LG002, within the adapter and against the model's other adapters; a PiSSA/
OLoRA adapter is right on the residual base PEFT users load it on (LG116), and PEFT loads
the base weights an adapter ships (LG118)."""
_SWAP_SETTLED_ELSEWHERE = settled_codes("LG102", "LG103", "LG104", "LG106")
"""Checks of the checker a hot-swap from a folder leaves out: PEFT zero-fills a missing half
on purpose (LG103) and refuses unexpected keys itself before writing (LG104); the swap guard
compares A and B with the loaded, possibly padded, tensors (LG102: an adapter saved from a
prepared model has tensors above its config's ``r``, legitimately); the swap casts (LG106)."""
# Config keys that change what a swapped adapter computes (PEFT checks these in
# hotswap_adapter, not in hotswap_adapter_from_state_dict). lora_dropout is left out: it
# does nothing at inference.
_SWAP_CONFIG_KEYS = ("use_rslora", "alpha_pattern", "use_dora")


def _bound(fn_params: tuple[str, ...], args: tuple[Any, ...], kwargs: dict[str, Any],
           wanted: str, default: Any = None) -> Any:
    if wanted in kwargs:
        return kwargs[wanted]
    index = fn_params.index(wanted)
    return args[index] if index < len(args) else default


def _folder(model_id: Any, kwargs: dict[str, Any]) -> Any:
    """The folder PEFT reads an adapter from (``subfolder=`` inside ``model_id``)."""
    subfolder = kwargs.get("subfolder")
    if isinstance(model_id, (str, os.PathLike)) and isinstance(subfolder, str) and subfolder:
        return os.path.join(model_id, subfolder)
    return model_id


def _peft_model(model: Any) -> Any:
    """The PeftModel behind a ``torch.compile`` wrapper."""
    return getattr(model, "_orig_mod", model)


def layout_registry(model: Any) -> LayoutRegistry:
    """The MoE `LayoutRegistry` of a PEFT model, seeded with the adapters already on it.

    Example:
        >>> from lora_guard.integrations.peft import layout_registry
        >>> class Model:   # any object stands in for a PeftModel here
        ...     def state_dict(self): return {}
        >>> layout_registry(Model()).layout is None
        True
    """
    model = _peft_model(model)
    registry = _REGISTRIES.get(model)
    if registry is None:
        registry = LayoutRegistry()
        for adapter, weights in _adapters_on(model).items():
            registry.admit(adapter, weights)
        _REGISTRIES[model] = registry
    return registry


def _adapters_on(model: Any) -> dict[str, dict[str, Any]]:
    names = list(getattr(model, "peft_config", {}) or {})
    found: dict[str, dict[str, Any]] = {name: {} for name in names}
    for key, value in model.state_dict().items():
        for adapter in names:
            marker = f".{adapter}."
            if marker in key and ".lora_" in key:
                found[adapter][key.replace(marker, ".")] = value
    return found


# --- load_adapter / add_adapter ------------------------------------------------------------

def _base_layer(module: Any) -> Any:
    seen = 0
    while hasattr(module, "base_layer") and seen < 8:
        module = module.base_layer
        seen += 1
    return module


def _module_dims(model: Any, spec: AdapterSpec) -> dict[str, tuple[Expected, Expected]]:
    """Each adapter module's in/out dims on the live model, for the checker's LG109."""
    dims: dict[str, tuple[Expected, Expected]] = {}
    for path in spec.modules:
        try:
            wrapper = model.get_submodule(f"base_model.model.{path}")
        except AttributeError:
            continue  # PEFT reports targets that do not exist in its own words
        # A module PEFT has wrapped already knows the dims its LoRA factors take (for a
        # target_parameters ParamWrapper, the parameter's, not the module's in/out features);
        # a plain module gives its own.
        wrapped_dims = [getattr(wrapper, n, None) for n in ("in_features", "out_features")]
        module = wrapper if hasattr(wrapper, "base_layer") and all(
            isinstance(d, int) and not isinstance(d, bool) for d in wrapped_dims
        ) else _base_layer(wrapper)
        found = []
        for names in (("in_features", "num_embeddings"), ("out_features", "embedding_dim")):
            name = next((n for n in names if isinstance(getattr(module, n, None), int)), None)
            value = getattr(module, name) if name else None
            found.append((value, f"{type(module).__name__}.{name} {value}"))
        if found[0][0] is not None or found[1][0] is not None:
            dims[path] = (found[0], found[1])
    return dims


def layer_violations(model: Any, spec: AdapterSpec, subject: str) -> list[Violation]:
    """LG109 for adapter modules of layers the live model does not have (a 4-layer adapter
    loaded into a 2-layer model: PEFT would only warn about unexpected keys and leave the
    model's layers half adapted).

    Example:
        >>> import torch
        >>> from lora_guard.integrations.peft import layer_violations
        >>> class Spec: modules = {}
        >>> layer_violations(torch.nn.Module(), Spec(), "adapter 'a'")
        []
    """
    counts: dict[str, int | None] = {}
    beyond: list[tuple[str, int, int]] = []
    for path, module in spec.modules.items():
        match = _LAYER.search(path)
        if module.layer is None or match is None:
            continue
        container = path[:match.end()].rsplit(".", 1)[0]  # model.layers
        if container not in counts:
            try:
                holder = model.get_submodule(f"base_model.model.{container}")
                counts[container] = len(holder)
            except (AttributeError, TypeError):
                counts[container] = None
        count = counts[container]
        if count is not None and module.layer >= count:
            beyond.append((module.a_key or module.b_key or path, module.layer, count))
    if not beyond:
        return []
    key, layer, count = max(beyond, key=lambda item: item[1])
    more = f"{key} (and {len(beyond) - 1} more)" if len(beyond) > 1 else key
    return [make_violation("LG109", "layer", subject, key=more, layer=layer, layers=count)]


def _call_admitted(registry: LayoutRegistry, adapter_name: str, newly: bool,
                   wrapped: Callable[..., Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Any:
    """Call PEFT; when it fails, release the adapter this call admitted."""
    try:
        return wrapped(*args, **kwargs)
    except BaseException:
        if newly:
            registry.release(adapter_name)
        raise


def _load_adapter(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
    params = ("model_id", "adapter_name")
    model_id = _bound(params, args, kwargs, "model_id")
    adapter_name = str(_bound(params, args, kwargs, "adapter_name"))
    subject = f"adapter {adapter_name!r}"
    registry = layout_registry(instance)
    was_admitted = adapter_name in registry
    newly = False
    spec, violations = local_adapter(_folder(model_id, kwargs), subject, lora_only=True,
                                     config_defaults=PEFT_CONFIG_DEFAULTS)
    if spec is not None:
        renamed = kwargs.get("ignore_mismatched_sizes") or kwargs.get("key_mapping")
        violations += spec_violations(
            spec, _PEFT_LOADS, subject=subject, skip=_LOAD_SETTLED_BY_PEFT,
            module_dims=None if renamed else _module_dims(instance, spec))
        # LG104 is PEFT's own at a load but for the weights of modules the config does not
        # select, which it drops without a word
        violations += not_selected(spec, subject, "PEFT")
        if not renamed:
            violations += layer_violations(instance, spec, subject)
    report(violations)
    if spec is not None and spec.tensors:
        registry.admit(adapter_name, spec.tensors)
        newly = not was_admitted
    token = _IN_LOAD.set(True)
    try:
        return _call_admitted(registry, adapter_name, newly, wrapped, args, kwargs)
    finally:
        _IN_LOAD.reset(token)


def _predicted_weights(model: Any, config: Any) -> dict[str, tuple[int, ...]]:
    """Pseudo weights whose names show the MoE layout ``config`` would create."""
    weights: dict[str, tuple[int, ...]] = {}
    for param in getattr(config, "target_parameters", None) or ():
        if "experts" in str(param):
            weights[f"{param}.lora_A.weight"] = (1, 1)
    if weights:
        return weights
    try:
        from peft.tuners.tuners_utils import check_target_module_exists
    except ImportError:  # pragma: no cover - the signature check keeps us on known releases
        return weights
    for module_name, _ in model.named_modules():
        if ".experts." in module_name and module_name.rsplit(".", 1)[-1] not in {
                "experts"} and check_target_module_exists(config, module_name):
            weights[f"{module_name}.lora_A.weight"] = (1, 1)
    return weights


def _add_adapter(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
    if _IN_LOAD.get():
        return wrapped(*args, **kwargs)  # load_adapter admitted the weights already
    params = ("adapter_name", "peft_config")
    adapter_name = str(_bound(params, args, kwargs, "adapter_name"))
    config = _bound(params, args, kwargs, "peft_config")
    registry = layout_registry(instance)
    newly = adapter_name not in registry
    registry.admit(adapter_name, _predicted_weights(instance, config))
    return _call_admitted(registry, adapter_name, newly, wrapped, args, kwargs)


def _delete_adapter(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
    adapter_name = _bound(("adapter_name",), args, kwargs, "adapter_name")
    result = wrapped(*args, **kwargs)
    registry = _REGISTRIES.get(_peft_model(instance))
    if registry is not None:
        registry.release(str(adapter_name))
    return result


# --- hot-swapping ------------------------------------------------------------------------

def _rank_axis(key: str) -> int | None:
    if ".lora_A." in key or ".lora_embedding_A." in key:
        return 0
    if ".lora_B." in key or ".lora_embedding_B." in key:
        return 1
    return None


def _prepared(modules: dict[str, Any], adapter_name: str) -> bool:
    """Was ``prepare_model_for_compiled_hotswap`` called? (LoRA scalings became tensors; it
    converts every LoRA layer's, so the layers the swap writes to tell.)"""
    import torch

    for module in modules.values():
        scaling = getattr(module, "scaling", None)
        if isinstance(scaling, dict) and isinstance(scaling.get(adapter_name), torch.Tensor):
            return True
    return False


def _lora_module(model: Any, module: str, modules: dict[str, Any]) -> Any:
    """The submodule named ``module``, found as PEFT's ``attrgetter`` finds it, each prefix
    resolved once for all the swap's keys (``modules`` keeps them; None: not there)."""
    if module in modules:
        return modules[module]
    parent_name, _, leaf = module.rpartition(".")
    parent = _lora_module(model, parent_name, modules) if parent_name else model
    found = None if parent is None else _attribute(parent, leaf)
    modules[module] = found
    return found


_REGISTRIES_OF_A_MODULE = ("_parameters", "_buffers", "_modules")
"""Where a torch module keeps what ``nn.Module.__getattr__`` returns, in its order."""
_REGISTERED = Bounded[tuple[type, str], bool](
    4096, "(module class, attribute name) pairs for which getattr was seen to return the "
    "module's registered parameter, buffer or submodule: no class attribute shadows it")


def _attribute(owner: Any, name: str) -> Any:
    """``getattr(owner, name, None)``. For a torch module whose class gave its registered
    parameter, buffer or submodule for ``name`` before, the entry is read from the module's
    registries directly: what ``nn.Module.__getattr__`` returns, without its Python call
    (a swap resolves some 70 attributes, and each such call costs about a microsecond)."""
    state = getattr(owner, "__dict__", None)
    if not isinstance(state, dict):
        return getattr(owner, name, None)
    if name not in state and _REGISTERED.get((type(owner), name)):
        for registry in _REGISTRIES_OF_A_MODULE:
            table = state.get(registry)
            if table is not None and name in table:
                return table[name]
    found = getattr(owner, name, None)
    if found is not None and any((state.get(registry) or {}).get(name) is found
                                 for registry in _REGISTRIES_OF_A_MODULE):
        _REGISTERED.put((type(owner), name), True)
    return found


def swap_violations(model: Any, state_dict: Mapping[str, Any], adapter_name: str,
                    config: Any = None, parameter_prefix: str = "lora_") -> list[Violation]:
    """Everything that would make PEFT's hot-swap fail part-way, or silently break the model.

    Reads shapes only. Unexpected keys are not reported: PEFT refuses them before writing.

    Example:
        >>> import torch
        >>> from lora_guard.integrations.peft import swap_violations
        >>> model = torch.nn.Module()
        >>> model.lin = torch.nn.Linear(4, 4)
        >>> swap_violations(model, {}, "default")
        []
    """
    subject = f"hot-swap of adapter {adapter_name!r}"
    found = _swap_config_violations(model, adapter_name, config, subject)
    layers: dict[str, Any] = {}  # the LoRA layers the keys name: the model is not walked
    shape_changes: list[tuple[str, str, int | None, tuple[int, ...], tuple[int, ...]]] = []
    new_ranks: dict[str, dict[int, int]] = {}
    for key, new_value in state_dict.items():
        # the tensor PEFT will write to, found as PEFT finds it (attrgetter; a compiled
        # model's wrapper resolves it through _orig_mod)
        if parameter_prefix not in key or adapter_name not in key:
            continue  # not one of this adapter's tensors: PEFT refuses it before writing
        parent = _lora_module(model, key.rsplit(".", 1)[0], layers)
        old_value = _attribute(parent, key.rsplit(".", 1)[1]) if parent is not None \
            else None
        new_shape, old_shape = shape_of(new_value), shape_of(old_value)
        if new_shape is None or old_shape is None:
            continue  # unexpected keys: PEFT refuses them before writing anything
        axis = _rank_axis(key)
        module = key.split(f".{parameter_prefix}", 1)[0].removeprefix("base_model.model.")
        if axis is not None and len(new_shape) > axis:
            new_ranks.setdefault(module, {})[axis] = new_shape[axis]
        if new_shape != old_shape:
            shape_changes.append((key, module, axis, old_shape, new_shape))
    if shape_changes:
        owners = {k.split(f".{parameter_prefix}", 1)[0] for k, *_ in shape_changes}
        prepared = _prepared(
            {name: _lora_module(model, name, layers) for name in owners}, adapter_name)
        for key, module, axis, old_shape, new_shape in shape_changes:
            found += _shape_change(subject, key, module, axis, old_shape, new_shape, prepared)
    found += _rank_mismatches(subject, state_dict, new_ranks)
    return found


def _swap_config_violations(model: Any, adapter_name: str, config: Any,
                            subject: str) -> list[Violation]:
    """LG105 for each config key whose change alters what the swapped adapter computes."""
    # a compiled model's wrapper hands peft_config on from its _orig_mod itself (a look for
    # _orig_mod on a PeftModel would raise and catch AttributeError through three modules)
    loaded = (getattr(model, "peft_config", None) or {}).get(adapter_name)
    if config is None or loaded is None:
        return []
    return [make_violation("LG105", "hotswap-config", subject, key=key,
                           old=getattr(loaded, key, None), new=getattr(config, key, None))
            for key in _SWAP_CONFIG_KEYS
            if getattr(loaded, key, None) != getattr(config, key, None)]


def _shape_change(subject: str, key: str, module: str, axis: int | None,
                  old_shape: tuple[int, ...], new_shape: tuple[int, ...],
                  prepared: bool) -> list[Violation]:
    """LG109 for a changed in/out dim (or number of dims); LG001 for a rank above the
    padded one on a model prepared for compiled hot-swapping."""
    if len(new_shape) != len(old_shape):
        return [make_violation(
            "LG109", "dim", subject, key=key, which="number of", got=len(new_shape),
            module_kind=module, expected=len(old_shape),
            source=f"the loaded tensor has shape {old_shape}")]
    found = [
        make_violation(
            "LG109", "dim", subject, key=key, which=_axis_name(axis, i), got=new_dim,
            module_kind=module, expected=old_dim,
            source=f"the loaded tensor has shape {old_shape}, the new one {new_shape}")
        for i, (old_dim, new_dim) in enumerate(zip(old_shape, new_shape, strict=False))
        if i != axis and old_dim != new_dim
    ]
    if axis is not None and prepared and new_shape[axis] > old_shape[axis]:
        found.append(make_violation("LG001", "hotswap", subject, key=key,
                                    new=new_shape[axis], old=old_shape[axis]))
    return found


def _axis_name(axis: int | None, i: int) -> str:
    """The in/out name of axis ``i`` of a LoRA factor whose rank sits on ``axis``."""
    if axis == 0 and i == 1:
        return "in"
    if axis == 1 and i == 0:
        return "out"
    return f"axis-{i}"


def _rank_mismatches(subject: str, state_dict: Mapping[str, Any],
                     new_ranks: dict[str, dict[int, int]]) -> list[Violation]:
    """LG102 for each module whose new A and B disagree on the rank."""
    found: list[Violation] = []
    for module, sides in sorted(new_ranks.items()):
        if len(sides) != 2 or sides[0] == sides[1]:
            continue
        prefix = f"base_model.model.{module}."
        a_key = next((k for k in state_dict if k.startswith(prefix) and _rank_axis(k) == 0),
                     module)
        b_key = next((k for k in state_dict if k.startswith(prefix) and _rank_axis(k) == 1),
                     module)
        shape_a, shape_b = shape_of(state_dict[a_key]), shape_of(state_dict[b_key])
        if len(shape_a or ()) == 2 == len(shape_b or ()):
            found.append(make_violation(
                "LG102", "a-b", subject, module=module, rank_a=sides[0], shape_a=shape_a,
                rank_b=sides[1], shape_b=shape_b))
    return found


_SWAP_PARAMS = ("model", "state_dict", "adapter_name", "config", "parameter_prefix")


@dataclass
class _SwapRead:
    """A ``hotswap_adapter`` of a local folder under way: what PEFT read from it (its
    ``adapter_config.json`` as parsed, the tensors it loaded), kept by the hooks on PEFT's
    readers for the checks, which run once (``checked``) before the first write."""

    folder: str | os.PathLike[str]
    subject: str
    config: dict[str, Any] | None = None
    weights: Mapping[str, Any] | None = None
    checked: bool = False


_SWAP: contextvars.ContextVar[_SwapRead | None] = contextvars.ContextVar(
    "lora_guard_peft_swap", default=None)


def _read_violations(read: _SwapRead) -> list[Violation]:
    """The checker's checks of the adapter a swap reads: on PEFT's config and tensors when
    the hooks saw them (nothing read again; only ``added_tokens.json``, which PEFT does not
    read, from the folder), else on the checker's own read of the folder."""
    read.checked = True
    if read.config is None or read.weights is None:
        spec, found = local_adapter(read.folder, read.subject, lora_only=True,
                                    config_defaults=PEFT_CONFIG_DEFAULTS)
    elif other_method(read.config.get("peft_type")):
        return []  # another PEFT method: PEFT speaks for itself
    else:
        return _loaded_violations(read.folder, read.config, read.weights, read.subject)
    if spec is not None:
        found += spec_violations(spec, _PEFT_SERVES, subject=read.subject,
                                 skip=_SWAP_SETTLED_ELSEWHERE)
    return found


def _loaded_violations(folder: str | os.PathLike[str], config: dict[str, Any],
                       weights: Mapping[str, Any], subject: str) -> list[Violation]:
    """The checks of what PEFT read. A config and tensors (names, shapes, dtypes) found
    clean before, with the same checks registered, are clean again (the adapters of one
    recipe, swapped in turn): only the folder's files rules and whether it ships an
    ``added_tokens.json`` are looked at again."""
    key = read_key(config, weights)
    if _CLEAN_SWAPS.clean(key, _PEFT_SERVES, folder):
        return []
    spec, found = loaded_adapter(folder, {**PEFT_CONFIG_DEFAULTS, **config}, weights, subject,
                                 key=key)
    if spec is not None:
        found += spec_violations(spec, _PEFT_SERVES, subject=subject,
                                 skip=_SWAP_SETTLED_ELSEWHERE)
        if not found and "added_tokens" not in spec.features:
            _CLEAN_SWAPS.remember(key, _PEFT_SERVES)
    return found


_CLEAN_SWAPS = CleanVerdicts("adapters PEFT read for a hot-swap and found clean: (config, "
                             "tensors' names, shapes and dtypes)")


def _hotswap_from_state_dict(wrapped: Callable[..., Any], instance: Any,
                             args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    model = _bound(_SWAP_PARAMS, args, kwargs, "model")
    state_dict = _bound(_SWAP_PARAMS, args, kwargs, "state_dict")
    adapter_name = str(_bound(_SWAP_PARAMS, args, kwargs, "adapter_name"))
    config = _bound(_SWAP_PARAMS, args, kwargs, "config")
    prefix = _bound(_SWAP_PARAMS, args, kwargs, "parameter_prefix", "lora_")
    read = _SWAP.get()
    found = _read_violations(read) if read is not None and not read.checked else []
    if isinstance(state_dict, Mapping):
        found += swap_violations(model, state_dict, adapter_name, config, prefix)
    report(found)
    return wrapped(*args, **kwargs)


def _hotswap_adapter(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> Any:
    """A swap from a local folder: PEFT reads it (the hooks keep what it read) and the
    checks run on that in `_hotswap_from_state_dict`, before the first write; when PEFT
    refuses the adapter before (its config check, a file it cannot parse), the checker
    reads the folder and reports every defect with its fix, from PEFT's error."""
    params = ("model", "model_name_or_path", "adapter_name")
    folder = _folder(_bound(params, args, kwargs, "model_name_or_path"), kwargs)
    if not isinstance(folder, (str, os.PathLike)) or not os.path.isdir(folder):
        return wrapped(*args, **kwargs)  # a Hub id: PEFT speaks for itself
    adapter_name = _bound(params, args, kwargs, "adapter_name")
    read = _SwapRead(folder, f"hot-swap of adapter {adapter_name!r}")
    token = _SWAP.set(read)
    try:
        return wrapped(*args, **kwargs)
    except Exception:
        if not read.checked:  # PEFT refused before what it read reached the checks
            report(_read_violations(_SwapRead(folder, read.subject)))
        raise
    finally:
        _SWAP.reset(token)


def _config_read(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
    """``PeftConfigMixin.from_json_file``: the config dict PEFT parsed, kept for a swap."""
    config = wrapped(*args, **kwargs)
    read = _SWAP.get()
    if read is not None and not read.checked and isinstance(config, dict):
        read.config = config
    return config


def _weights_read(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
    """``hotswap.load_peft_weights``: the tensors PEFT loaded, kept for a swap."""
    weights = wrapped(*args, **kwargs)
    read = _SWAP.get()
    if read is not None and not read.checked and isinstance(weights, Mapping):
        read.weights = weights
    return weights


INTEGRATION = Integration(
    name=name,
    distribution="peft",
    min_version="0.17",
    patches=(
        Patch("peft.peft_model", "PeftModel.load_adapter",
              ("self", "model_id", "adapter_name"), _load_adapter),
        Patch("peft.peft_model", "PeftModel.add_adapter",
              ("self", "adapter_name", "peft_config"), _add_adapter),
        Patch("peft.peft_model", "PeftModel.delete_adapter", ("self", "adapter_name"),
              _delete_adapter),
        Patch("peft.utils.hotswap", "hotswap_adapter_from_state_dict",
              ("model", "state_dict", "adapter_name", "config"), _hotswap_from_state_dict),
        Patch("peft.utils.hotswap", "hotswap_adapter",
              ("model", "model_name_or_path", "adapter_name"), _hotswap_adapter),
        Patch("peft.utils.hotswap", "load_peft_weights", ("model_id", "device"),
              _weights_read, optional=True),
        Patch("peft.config", "PeftConfigMixin.from_json_file", ("cls", "path_json_file"),
              _config_read, optional=True),
    ),
    on_uninstrument=_REGISTRIES.clear,
)


def instrument() -> AttachReport:
    """Guard PEFT's adapter loading and hot-swapping, now or when PEFT is imported.

    Returns the `lora_guard.integrations.AttachReport` (hooks attached, missing, pending).

    Example:
        >>> from lora_guard.integrations import peft as peft_guard
        >>> report = peft_guard.instrument(); peft_guard.INTEGRATION.instrumented
        True
        >>> peft_guard.uninstrument()
    """
    return INTEGRATION.instrument()


def uninstrument() -> None:
    """Restore PEFT's original functions exactly; a hook firing later does nothing.

    Example:
        >>> from lora_guard.integrations import peft as peft_guard
        >>> peft_guard.uninstrument(); peft_guard.INTEGRATION.instrumented
        False
    """
    INTEGRATION.uninstrument()
