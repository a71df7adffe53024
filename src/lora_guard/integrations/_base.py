"""What every integration shares: post-import hooks, exact patching, version checks, and
the reading of an adapter folder a library is about to load (`local_adapter`; the checks
themselves are the checker's, `lora_guard.check_adapters`).

An `Integration` names the functions it guards (`Patch`: module, attribute path, the
parameters it expects, and the wrapper). `instrument()` registers a wrapt post-import hook
per module, so the library is patched when (and only when) it is imported, whichever comes
first; `uninstrument()` puts the very objects it replaced back and turns every hook that
fires later into a no-op. A release whose signatures differ from the ones the integration
knows, or that is older than it supports, is left alone with an `IntegrationWarning`.

This module imports neither torch nor any guarded library.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import marshal
import math
import os
import pathlib
import re
import stat
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MethodType
from typing import Any

import wrapt

from .._checking.limits import ServingLimits
from .._checking.registry import plugin_checks
from .._core.config import STATE
from .._core.errors import Violation
from .._reading.adapters import (
    ADDED_TOKENS_NAME,
    CONFIG_NAME,
    AdapterSpec,
    FrozenConfig,
    Malformed,
    _read_added_tokens,
    build_spec,
    checked_config,
    load_spec,
    malformed_violation,
    other_method,
    read_config,
)
from .._reading.bounded import Bounded, ValueKey
from .._reading.files import join_name, lexists, open_regular
from .._reading.safetensors import TensorInfo

__all__ = ["AttachReport", "CleanVerdicts", "HeardList", "Integration", "IntegrationWarning",
           "Patch", "loaded_adapter", "local_adapter", "note", "read_key", "takes_exactly"]

Wrapper = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]
_MISSING = object()


class IntegrationWarning(UserWarning):
    """An integration could not (or would not) patch a library; the library runs unguarded.

    Example:
        >>> from lora_guard.integrations import IntegrationWarning
        >>> issubclass(IntegrationWarning, UserWarning)
        True
    """


@dataclass(frozen=True)
class Patch:
    """One guarded attribute: ``module`` + ``path`` (``"Class.method"``), the leading
    parameters its signature must have, and the wrapper that guards it (wrapt's convention).

    The wrapper is called as ``wrapper(wrapped, instance, args, kwargs)`` and calls
    ``wrapped(*args, **kwargs)`` itself once its checks pass; see `Integration`.

    Example:
        >>> from lora_guard.integrations import Patch
        >>> def passthrough(wrapped, instance, args, kwargs):
        ...     return wrapped(*args, **kwargs)
        >>> Patch("mylib.lora", "Manager.load", ("self", "path"), passthrough).path
        'Manager.load'
    """

    module: str
    path: str
    params: tuple[str, ...]
    wrapper: Wrapper
    optional: bool = False
    """A target missing from this release is skipped (with a warning naming it and the
    version) instead of leaving the whole module unpatched."""
    fast: Callable[[Callable[..., Any], Callable[..., Any]], Callable[..., Any]] | None = None
    """For a method (or classmethod) an engine calls on every step or every load:
    ``fast(original, guarded)`` returns the function installed, which calls
    ``original(self, ...)`` itself when the state it guards is as last verified, or when it
    only notes what the engine was given (nothing new to check: one Python call on the
    engine's path), and ``guarded(self, ...)`` (the wrapper, as without ``fast``) otherwise;
    or ``original`` itself, where this release needs no guard on the method (the hook's
    signature is still checked, and `lora-guard doctor` lists it). For a classmethod,
    ``self`` is the class."""


@dataclass(frozen=True)
class AttachReport:
    """What `Integration.instrument` did: each hook attached, missing (with why) or pending.

    ``supported`` is whether the installed version is in the range the engine tier tests
    (``tests/engines/``); ``pending`` lists modules not imported yet (their hooks attach on
    import; call `Integration.report` again after it).

    Example:
        >>> from lora_guard.integrations import get
        >>> report = get("vllm").report()
        >>> sorted(report.as_dict())  # doctest: +NORMALIZE_WHITESPACE
        ['attached', 'import_errors', 'integration', 'missing', 'pending', 'supported',
         'supported_range', 'version']
    """

    integration: str
    version: str | None
    supported: bool
    supported_range: str
    attached: tuple[str, ...]
    missing: dict[str, str]
    pending: tuple[str, ...]
    import_errors: dict[str, str] = field(default_factory=dict)
    """Module -> why it does not import (`Integration.diagnose`): its hooks cannot attach."""

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {"integration": self.integration, "version": self.version,
                "supported": self.supported, "supported_range": self.supported_range,
                "attached": list(self.attached), "missing": dict(self.missing),
                "pending": list(self.pending), "import_errors": dict(self.import_errors)}


@dataclass
class _Applied:
    parent: Any
    attr: str
    original: Any  # the raw object found in parent.__dict__, or _MISSING if it was inherited
    installed: Any


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in re.split(r"[.+-]", version):
        match = re.match(r"\d+", piece)
        if match is None:
            break
        parts.append(int(match.group()))
    return tuple(parts)


def _raw_function(obj: Any) -> Any:
    if isinstance(obj, (classmethod, staticmethod)):
        return obj.__func__
    return obj


@dataclass
class Integration:
    """Guards for one library, put in front of its functions by post-import hooks.

    The base of the PEFT, sglang and vLLM integrations, and of yours: name the functions to
    guard (`Patch`: module, ``"Class.method"`` path, the leading parameters the signature
    must have, and a wrapt-style wrapper ``(wrapped, instance, args, kwargs)``) and the
    versions you support. The class owns the rest:

    - `instrument` patches now if the module is imported, else on its import (a wrapt
      post-import hook: importing lora_guard never imports the library); calling it again
      changes nothing; it returns an `AttachReport` (attached, missing, pending hooks);
    - `uninstrument` puts back the very objects it replaced (``is`` identity), and a hook
      firing later does nothing;
    - a release older than ``min_version``, or whose signature differs from ``params``, is
      left unpatched with an `IntegrationWarning` (a guard on an unknown signature would be
      wrong); one at or past ``max_version`` is patched where signatures match, with a warning;
    - in mode ``off`` every wrapper is a pass-through; `diagnose` is what ``lora-guard
      doctor`` prints.

    Register it for ``integrations.get`` and ``--lora-guard-instrument`` through the
    ``lora_guard.integrations`` entry-point group.

    Example:
        >>> import sys, types, lora_guard as lg
        >>> from lora_guard.integrations import Integration, Patch
        >>> mylib = types.ModuleType("mylib"); mylib.__version__ = "1.2"
        >>> def load_adapter(path, max_rank):
        ...     return f"loaded {path}"
        >>> mylib.load_adapter = load_adapter; sys.modules["mylib"] = mylib
        >>> def check_first(wrapped, instance, args, kwargs):
        ...     spec = lg.inspect_adapter(args[0])
        ...     lg.check_adapter(spec, lg.ServingLimits(max_rank=args[1])).enforce()
        ...     return wrapped(*args, **kwargs)
        >>> guard = Integration(name="mylib", distribution="mylib", min_version="1.0",
        ...                     patches=(Patch("mylib", "load_adapter", ("path", "max_rank"),
        ...                                    check_first),))
        >>> guard.instrument().attached
        ('mylib:load_adapter',)
        >>> from lora_guard.testing import write_adapter
        >>> import tempfile; folder = write_adapter(tempfile.mkdtemp() + "/a", rank=32)
        >>> mylib.load_adapter(folder, 16)
        Traceback (most recent call last):
        ...
        lora_guard.AdapterError: LG101 rank-exceeds-limit: ...
        >>> guard.uninstrument(); mylib.load_adapter is load_adapter
        True
        >>> del sys.modules["mylib"]
    """

    name: str
    distribution: str
    """The top-level package (and distribution) whose version is checked."""
    min_version: str
    patches: tuple[Patch, ...]
    on_uninstrument: Callable[[], None] | None = None
    max_version: str | None = None
    """The first version outside the supported range (exclusive), or None for no bound.
    ``[min_version, max_version)`` is exactly what the engine tier tests."""
    _active: bool = field(default=False, init=False)
    _pending: set[str] = field(default_factory=set, init=False)
    _applied: dict[tuple[str, str], _Applied] = field(default_factory=dict, init=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, init=False)
    _warned_untested: bool = field(default=False, init=False)
    skipped: dict[str, str] = field(default_factory=dict, init=False)
    """Targets left unpatched, with the reason (an unknown signature, a missing attribute)."""

    # --- public surface ------------------------------------------------------------------

    @property
    def instrumented(self) -> bool:
        """True between `instrument` and `uninstrument`."""
        return self._active

    @property
    def patched(self) -> list[str]:
        """The attributes patched right now, as ``module:path``."""
        with self._lock:
            return sorted(f"{module}:{path}" for module, path in self._applied)

    @property
    def supported_range(self) -> str:
        """The versions the engine tier tests, as a specifier (``>=0.34.0,<0.35``)."""
        upper = f",<{self.max_version}" if self.max_version else ""
        return f">={self.min_version}{upper}"

    def supports(self, version: str | None) -> bool:
        """Whether ``version`` is in `supported_range` (None, not installed: False)."""
        if version is None:
            return False
        found = _version_tuple(version)
        if found < _version_tuple(self.min_version):
            return False
        return self.max_version is None or found < _version_tuple(self.max_version)

    def instrument(self) -> AttachReport:
        """Guard the library now if it is imported, or as soon as it is; idempotent.

        Returns the `AttachReport`: each hook attached, missing (a warning names it and the
        version) or pending (its module is not imported yet).
        """
        with self._lock:
            self._active = True
            for module in dict.fromkeys(p.module for p in self.patches):
                if module in sys.modules:
                    self._on_import(sys.modules[module])
                elif module not in self._pending:
                    # wrapt fires a hook once, on the module's next import, then drops it.
                    self._pending.add(module)
                    wrapt.register_post_import_hook(self._on_import_hook, module)
            return self.report()

    def report(self) -> AttachReport:
        """Which hooks are attached, missing or pending right now (see `AttachReport`)."""
        with self._lock:
            attached = tuple(self.patched)
            missing = dict(sorted(self.skipped.items()))
            pending = tuple(sorted({
                p.module for p in self.patches
                if f"{p.module}:{p.path}" not in attached and f"{p.module}:{p.path}" not in
                missing}))
            version = self.version()
            return AttachReport(self.name, version, self.supports(version),
                                self.supported_range, attached, missing, pending)

    def uninstrument(self) -> None:
        """Put back exactly the objects `instrument` replaced; later hooks do nothing."""
        with self._lock:
            self._active = False
            for (module, path), applied in list(self._applied.items()):
                current = vars(applied.parent).get(applied.attr, _MISSING)
                if current is not applied.installed:
                    warnings.warn(
                        f"lora_guard.integrations.{self.name}: {module}.{path} was patched "
                        "again by someone else after lora_guard; it is left in place (the "
                        "lora_guard layer inside it is now a pass-through).",
                        IntegrationWarning,
                        stacklevel=2,
                    )
                elif applied.original is _MISSING:
                    delattr(applied.parent, applied.attr)
                else:
                    setattr(applied.parent, applied.attr, applied.original)
                del self._applied[(module, path)]
            self.skipped.clear()
            if self.on_uninstrument is not None:
                self.on_uninstrument()

    def diagnose(self) -> AttachReport | None:
        """Import every module this integration guards, attach, report, and put it all back.

        None when the library is not installed. A module that does not import is reported
        missing with the import error (its hooks would never fire). What `lora-guard doctor`
        prints per engine.

        Example:
            >>> from lora_guard.integrations import get
            >>> report = get("vllm").diagnose()
            >>> report is None or report.integration == "vllm"
            True
        """
        if self.version() is None:
            return None
        failed: dict[str, str] = {}
        for module in dict.fromkeys(p.module for p in self.patches):
            try:
                importlib.import_module(module)
            except Exception as exc:  # a broken or absent module: the hooks never fire
                failed[module] = f"{type(exc).__name__}: {exc}"
        was_active = self._active
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", IntegrationWarning)
            found = self.instrument()
        if not was_active:
            self.uninstrument()
        missing = dict(found.missing)
        for patch in self.patches:
            key = f"{patch.module}:{patch.path}"
            if patch.module in failed and key not in found.attached:
                missing[key] = f"module {patch.module} does not import ({failed[patch.module]})"
        pending = tuple(m for m in found.pending if m not in failed)
        return AttachReport(found.integration, found.version, found.supported,
                            found.supported_range, found.attached, dict(sorted(missing.items())),
                            pending, failed)

    def version(self) -> str | None:
        """The guarded library's version, or None when it is not imported/installed."""
        package = sys.modules.get(self.distribution)
        version = getattr(package, "__version__", None)
        if isinstance(version, str):
            return version
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None

    def __repr__(self) -> str:
        state = "instrumented" if self._active else "not instrumented"
        return f"<lora_guard integration {self.name!r}: {state}, patched {self.patched}>"

    # --- machinery -------------------------------------------------------------------------

    def _on_import_hook(self, module: Any) -> None:
        with self._lock:
            self._pending.discard(getattr(module, "__name__", ""))
            self._on_import(module)

    def _on_import(self, module: Any) -> None:
        with self._lock:
            if not self._active:
                return  # a hook that fires after uninstrument does nothing
            name = module.__name__
            todo = [p for p in self.patches
                    if p.module == name and (p.module, p.path) not in self._applied]
            if not todo:
                return
            version = self.version() or "unknown"
            problems = self._too_old(version)
            resolved, absent = self._resolve_all(module, todo, problems)
            if problems:
                self._refuse(name, todo, version, problems)
                return
            self._warn_absent(version, absent)
            self._warn_untested(version)
            for patch, parent, attr in resolved:
                original = vars(parent).get(attr, _MISSING)
                setattr(parent, attr, _guarded(self, original, patch.wrapper,
                                               method=isinstance(parent, type),
                                               fast=patch.fast))
                self._applied[(name, patch.path)] = _Applied(
                    parent, attr, original, vars(parent)[attr])

    def _too_old(self, version: str) -> list[str]:
        if version != "unknown" and _version_tuple(version) < _version_tuple(self.min_version):
            return [f"version {version} is older than {self.min_version}"]
        return []

    def _resolve_all(self, module: Any, todo: list[Patch], problems: list[str],
                     ) -> tuple[list[tuple[Patch, Any, str]], list[str]]:
        """Each patch's (parent, attribute); an optional one that is missing is skipped (and
        listed in the second list), any other failure is appended to ``problems``."""
        resolved: list[tuple[Patch, Any, str]] = []
        absent: list[str] = []
        for patch in todo:
            found = self._resolve(module, patch)
            if not isinstance(found, str):
                resolved.append((patch, *found))
            elif patch.optional and found.startswith("missing"):
                self.skipped[f"{module.__name__}:{patch.path}"] = found
                absent.append(f"{module.__name__}.{patch.path} ({found})")
            else:
                problems.append(f"{patch.path}: {found}")
        return resolved, absent

    def _warn_absent(self, version: str, absent: list[str]) -> None:
        if absent:
            warnings.warn(
                f"lora_guard.integrations.{self.name}: {self.distribution} {version} has "
                f"no {', '.join(absent)}; that hook is not attached, the rest are. "
                f"lora_guard is tested on {self.distribution} {self.supported_range} "
                "(`lora-guard doctor` lists every hook).",
                IntegrationWarning,
                stacklevel=4,
            )

    def _warn_untested(self, version: str) -> None:
        if (version == "unknown" or self.max_version is None or self._warned_untested
                or _version_tuple(version) < _version_tuple(self.max_version)):
            return
        self._warned_untested = True
        warnings.warn(
            f"lora_guard.integrations.{self.name}: {self.distribution} {version} is "
            f"newer than the range lora_guard is tested on ({self.supported_range}); "
            "hooks whose signatures match are attached, check `lora-guard doctor`.",
            IntegrationWarning,
            stacklevel=4,
        )

    def _refuse(self, name: str, todo: list[Patch], version: str, problems: list[str]) -> None:
        reason = "; ".join(problems)
        for patch in todo:
            self.skipped[f"{name}:{patch.path}"] = reason
        warnings.warn(
            f"lora_guard.integrations.{self.name}: {self.distribution} {version} is "
            f"not patched in {name} (its guards would be wrong there): {reason}. "
            f"The library runs unguarded; lora_guard is tested on {self.distribution} "
            f"{self.supported_range} with the signatures it documents.",
            IntegrationWarning,
            stacklevel=4,
        )

    @staticmethod
    def _resolve(module: Any, patch: Patch) -> tuple[Any, str] | str:
        *owners, attr = patch.path.split(".")
        parent = module
        for owner in owners:
            parent = getattr(parent, owner, None)
            if parent is None:
                return f"missing {owner}"
        raw = vars(parent).get(attr, _MISSING) if hasattr(parent, "__dict__") else _MISSING
        if raw is _MISSING:
            return f"missing {attr}"
        fn = _raw_function(raw)
        try:
            params = tuple(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            return "has no inspectable signature"
        want = patch.params
        if params[: len(want)] != want:
            return (
                f"parameters ({', '.join(params)}) differ from the known "
                f"({', '.join(want)}, ...)"
            )
        return parent, attr


def _guarded(integration: Integration, raw: Any, wrapper: Wrapper, *, method: bool,
             fast: Callable[[Callable[..., Any], Callable[..., Any]], Callable[..., Any]]
             | None = None) -> Any:
    """What goes in place of ``raw``: a plain function with the original's name and
    signature (``__wrapped__``) that calls ``wrapper(wrapped, instance, args, kwargs)`` while
    the integration is active and the mode is not ``off``, else the original itself.

    A plain function, not a wrapt proxy: the engines call some of these on every step, and a
    Python function's call is the cheapest dispatch there is (about a third of a wrapt
    ``FunctionWrapper``'s; ``bench/bench_engine_paths.py`` measures the engines' paths).
    """
    fn = _raw_function(raw)
    if isinstance(raw, classmethod) or (method and not isinstance(raw, staticmethod)):
        call = (_class_call if isinstance(raw, classmethod) else _method_call)(
            integration, fn, wrapper)
        installed = call if fast is None else fast(fn, call)
        if installed is not fn:
            functools.update_wrapper(installed, fn)
        return classmethod(installed) if isinstance(raw, classmethod) else installed
    call = functools.update_wrapper(_plain_call(integration, fn, wrapper), fn)
    return staticmethod(call) if isinstance(raw, staticmethod) else call


def _method_call(integration: Integration, fn: Any, wrapper: Wrapper) -> Callable[..., Any]:
    def call(owner: Any, /, *args: Any, **kwargs: Any) -> Any:
        if not integration._active or STATE.off:
            return fn(owner, *args, **kwargs)
        return wrapper(MethodType(fn, owner), owner, args, kwargs)
    return call


def _class_call(integration: Integration, fn: Any, wrapper: Wrapper) -> Callable[..., Any]:
    def call(cls: Any, /, *args: Any, **kwargs: Any) -> Any:
        bound = MethodType(fn, cls)
        if not integration._active or STATE.off:
            return bound(*args, **kwargs)
        return wrapper(bound, cls, args, kwargs)
    return call


def _plain_call(integration: Integration, fn: Any, wrapper: Wrapper) -> Callable[..., Any]:
    """A module's function, or a staticmethod (no instance)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        if not integration._active or STATE.off:
            return fn(*args, **kwargs)
        return wrapper(fn, None, args, kwargs)
    return call


# --- adapters on disk: read by the checker, for the library that loads them next ------------

def local_adapter(
    path: Any,
    subject: str,
    *,
    lora_only: bool = False,
    config_defaults: Mapping[str, Any] | None = None,
) -> tuple[AdapterSpec | None, list[Violation]]:
    """An adapter folder about to be loaded by a library, read as the checker reads it.

    Returns ``(spec, violations)``: the `AdapterSpec` (config and safetensors header, never
    tensor data) for `spec_violations`, or None with an LG108 when the folder cannot be read
    safely. None and no violation where the library should speak for itself: a path that is
    not a local folder (a Hub id), a folder without ``adapter_config.json``, or, with
    ``lora_only``, a ``peft_type`` naming another method (the reader's `NotLoRA`; LoRA's own
    in a spelling the library does not read is the profile's LG117). Weight files other than
    safetensors (a pickle ``.bin`` the library opens itself) give a spec of the config alone.

    Example:
        >>> from lora_guard.integrations._base import local_adapter
        >>> local_adapter("org/some-adapter-on-the-hub", "adapter 'a'")
        (None, [])
    """
    if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path):
        return None, []
    if not os.path.lexists(os.path.join(path, CONFIG_NAME)):
        return None, []
    try:
        spec = load_spec(path, require_weights=False, config_defaults=config_defaults)
    except Malformed as exc:
        if lora_only and _not_lora(path):
            return None, []  # another PEFT type's config need not read as LoRA's
        return None, [malformed_violation(subject, exc)]
    return spec, []


def _not_lora(path: str | os.PathLike[str]) -> bool:
    """Whether the folder's config names another PEFT method (read again only for a config
    that did not read as a LoRA adapter's: a valid one is read once)."""
    try:
        config, _ = read_config(path)
    except Malformed:
        return False
    return other_method(config.get("peft_type"))


def loaded_adapter(
    folder: str | os.PathLike[str],
    config: Mapping[str, Any],
    tensors: Mapping[str, Any],
    subject: str,
    *,
    key: tuple[Any, ...] | None = None,
) -> tuple[AdapterSpec | None, list[Violation]]:
    """`local_adapter` of an adapter the library has read already: its config as the library
    parsed it and its tensors (their names, shapes and dtypes), so the checks run on what the
    library will serve and nothing is read twice. Only ``added_tokens.json``, which no engine
    reads, is read from the folder (when it has one), and the files the engine read are
    opened once each to hold them to the reader's file rules (no symlink out of the folder,
    no FIFO, no other user's hard link: LG108), unread. The config is checked as the checker
    checks a read one (`checked_config`: LoRA's fields, a finite ``lora_alpha``); what only
    the file's bytes tell (a duplicate key) is the library's reader's to refuse. ``key``, the
    `read_key` of these config and tensors, spares reading each tensor's shape and dtype again.

    Example:
        >>> import torch
        >>> from lora_guard.integrations._base import loaded_adapter
        >>> config = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}
        >>> tensors = {"base_model.model.q_proj.lora_A.weight": torch.zeros(8, 64),
        ...            "base_model.model.q_proj.lora_B.weight": torch.zeros(64, 8)}
        >>> spec, found = loaded_adapter("/nonexistent/a", config, tensors, "adapter 'a'")
        >>> spec.rank, spec.dtypes, found
        (8, ('float32',), [])
    """
    try:
        checked = FrozenConfig(checked_config(dict(config)))
        layout = ValueKey(key[1] if key is not None else tuple(
            [(name, t.shape, t.dtype) for name, t in tensors.items()]))
        infos, nbytes = _tensor_infos(tensors, layout)
        path = pathlib.Path(folder)
        _files_stay_inside(folder)
        # the layout stands for the infos (each is made from its shape and dtype alone)
        spec = build_spec(path, checked, infos, {}, nbytes,
                          added_tokens=_read_added_tokens(path), entries_key=layout)
    except Malformed as exc:
        return None, [malformed_violation(subject, exc)]
    return spec, []


_INFOS = Bounded[tuple[Any, Any], TensorInfo](
    4096, "one TensorInfo per (shape, dtype) of the tensors an engine loaded: the adapters a "
    "server loads share a handful, and shared entries let the reader remember each header's "
    "parts (build_spec)")


def _tensor_infos(tensors: Mapping[str, Any],
                  layout: ValueKey) -> tuple[Mapping[str, TensorInfo], int]:
    """Each tensor's `TensorInfo`, from its (name, shape, dtype) as `read_key` took them, and
    their bytes: made once per layout (the adapters of a recipe share theirs; read-only,
    `build_spec` copies what it keeps). The tensor itself is asked only for a (shape, dtype)
    not seen before (its element size). An adapter's tensors come in a few shapes: each is
    looked up once."""
    known = _LAYOUT_INFOS.get(layout)
    if known is not None:
        return known
    infos: dict[str, TensorInfo] = {}
    these: dict[tuple[Any, Any], TensorInfo] = {}
    nbytes = 0
    for name, shape, dtype in layout.value:  # type: ignore[attr-defined]
        info = these.get((shape, dtype))
        if info is None:
            info = _INFOS.get((shape, dtype))
            if info is None:
                dims = tuple(int(n) for n in shape)
                info = _INFOS.put((shape, dtype), TensorInfo(
                    shape=dims, dtype=str(dtype).removeprefix("torch."),
                    nbytes=math.prod(dims) * tensors[name].element_size()))
            these[shape, dtype] = info
        infos[name] = info
        nbytes += info.nbytes
    return _LAYOUT_INFOS.put(layout, (infos, nbytes))


_LAYOUT_INFOS = Bounded[ValueKey, tuple[Mapping[str, TensorInfo], int]](
    64, "the TensorInfos and bytes of the tensors an engine loaded, by their names, shapes "
    "and dtypes: a recipe's adapters share them")


class CleanVerdicts:
    """Adapters an engine has read and lora_guard found clean, remembered by value, so that
    a recipe's adapters (or one loaded again) are not checked again on the engine's path.

    A verdict is kept for one key (what the engine read, by value: `read_key`), one value of
    the limits (`ServingLimits.value_key`: equal limits share verdicts, made anew or not)
    and one set of registered checks: the same adapter under other limits, or after
    `lora_guard.adapter_invariant` registered a check, is checked again. Bounded: the 256
    latest.

    >>> from lora_guard import ServingLimits
    >>> verdicts, key = CleanVerdicts("a doctest's loads"), read_key({"r": 8}, {})
    >>> limits = ServingLimits(max_rank=16)
    >>> verdicts.clean(key, limits), verdicts.remember(key, limits), verdicts.clean(key, limits)
    (False, None, True)
    >>> verdicts.clean(key, ServingLimits(max_rank=16)), verdicts.clean(key, ServingLimits())
    (True, False)
    """

    __slots__ = ("_folders", "_seen")

    def __init__(self, what: str) -> None:
        self._seen = Bounded[tuple[Any, ...], bool](256, what)
        self._folders = Bounded[str, tuple[int, ...]](
            256, f"{what}: the folders whose engine-read files obeyed the file rules, with no "
            "added_tokens.json, by their stamp then (device, inode, ctime, mtime)")

    def clean(self, key: tuple[Any, ...] | None, limits: ServingLimits,
              folder: str | os.PathLike[str] | None = None) -> bool:
        """Whether ``key`` was found clean under ``limits``. With ``folder`` (an engine that
        does not read it through the checker's reader), only while the files the engine read
        still obey the reader's file rules and it ships no ``added_tokens.json``, which no
        engine's LoRA loader reads and which is checked every time (`_folder_clean`)."""
        if key is None or self._seen.get((limits.value_key(), plugin_checks(), key)) is None:
            return False
        return folder is None or self._folder_clean(os.fspath(folder))

    def _folder_clean(self, folder: str) -> bool:
        """The files' rules and the ``added_tokens.json`` look, in one ``stat`` of the folder
        while it is as it was when they last passed: a file in it can become a symlink, a
        FIFO or a hard link to a file elsewhere, and an ``added_tokens.json`` can appear,
        only through a change of the folder's entries, which moves its ctime (no user can
        set it back). Kept only where nothing but such a change could alter the verdict:
        each file was a plain one of this user's with one name (a symlink's target, or
        another user's file getting a second name, changes no ctime of the folder: those
        folders are looked at in full every load), and the folder last changed
        `_SETTLED_NS` before (a change in the same tick of a coarse clock would leave the
        same ctime)."""
        try:
            info = os.stat(folder)
            stamp = (info.st_dev, info.st_ino, info.st_ctime_ns, info.st_mtime_ns)
        except (OSError, ValueError):
            stamp = None
        if stamp is not None and self._folders.get(folder) == stamp:
            return True
        try:
            owners = _files_stay_inside(folder)
        except Malformed:
            return False
        if lexists(join_name(folder, ADDED_TOKENS_NAME)):
            return False
        if (stamp is not None and owners is not None and hasattr(os, "geteuid")
                and owners <= {os.geteuid()} and time.time_ns() - stamp[2] > _SETTLED_NS):
            self._folders.put(folder, stamp)
        return True

    def remember(self, key: tuple[Any, ...] | None, limits: ServingLimits) -> None:
        if key is not None:
            self._seen.put((limits.value_key(), plugin_checks(), key), True)

    def clear(self) -> None:
        self._seen.clear()
        self._folders.clear()


_SETTLED_NS = 2_000_000_000
"""How long a folder must have been unchanged for its stamp to be kept: longer than the
coarsest timestamp a file system gives (FAT's 2 s), so that any later change of its entries
gives another ctime."""


def read_key(config: Mapping[str, Any], tensors: Mapping[str, Any],
             *more: Any) -> tuple[Any, ...] | None:
    """What an engine read, as a `CleanVerdicts` key: the config's ``marshal`` bytes (exact
    in type and value: ``8`` is not ``8.0`` nor ``True``), each tensor's name, shape and
    dtype, and ``more``; None when a value has no such key (that load is checked, never
    remembered). A plain tuple: a remembered load hashes and compares it in C alone."""
    try:
        return (marshal.dumps(config if type(config) is dict else dict(config)),
                tuple([(name, t.shape, t.dtype) for name, t in tensors.items()]), *more)
    except (TypeError, ValueError, AttributeError):
        return None


def engine_files_clean(folder: str | os.PathLike[str]) -> bool:
    """Whether the files an engine read from ``folder`` still obey the reader's file rules
    (`loaded_adapter` names the problem when they do not)."""
    try:
        _files_stay_inside(folder)
    except Malformed:
        return False
    return True


_ENGINE_READS = (("adapter_config.json",), ("adapter_model.safetensors", "adapter_model.bin"))
"""The files an engine's loader reads from an adapter folder: the config, and the first
weights file of these formats that is there."""


def _files_stay_inside(folder: str | os.PathLike[str]) -> set[int] | None:
    """The reader's file rules on the files the engine has read (a symlink leading outside
    the folder, a FIFO, another user's hard link: `Malformed`), without reading them again:
    the config and the first weights file there is. A plain file with one name passes on its
    ``lstat``; anything else is opened by the reader's `open_regular`, which decides.
    Returns the owners of the files when every one was plain, else None."""
    base = os.fspath(folder)
    owners: set[int] | None = set()
    for names in _ENGINE_READS:
        for name in names:
            try:
                info = os.lstat(join_name(base, name))
            except FileNotFoundError:
                continue  # the next weights format
            except OSError:
                info = None
            if info is None or not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
                owners = None
                opened = open_regular(pathlib.Path(base), name)
                if opened is not None:
                    os.close(opened[0])
            elif owners is not None:
                owners.add(info.st_uid)
            break
    return owners


def takes_exactly(original: Callable[..., Any], count: int, *,
                  names: tuple[str, ...] | None = None,
                  defaults: tuple[Any, ...] | None = None) -> bool:
    """Whether ``original`` is a plain function of exactly ``count`` positional parameters
    (named ``names``, with the defaults ``defaults``, where given) and nothing else: a fast
    path of that signature in its place makes the cheapest calls both ways, into it and on to
    the engine's; an engine release with another signature gets the guarded path."""
    code = getattr(original, "__code__", None)
    if code is None or code.co_argcount != count or code.co_kwonlyargcount or \
            code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS):
        return False
    return (names is None or code.co_varnames[:count] == names) and (
        defaults is None or (getattr(original, "__defaults__", None) or ()) == defaults)


def note(owner: Any, name: str, value: Any) -> bool:
    """Set an attribute of one of the engine's objects (a worker, a helper, a manager, a pool)
    as the engine sets its own: through ``setattr``, never ``vars(owner)``, whose dict, once
    asked for, stays and makes every later read of the object's attributes slower (CPython
    3.11 keeps an object's attributes beside it until its ``__dict__`` is asked for), the
    engine's own reads on every step included. Read it back with ``getattr``. False where
    the object takes no such attribute."""
    try:
        setattr(owner, name, value)
    except (AttributeError, TypeError):
        return False
    return True


class HeardList(list[Any]):
    """An engine's slot table (a list), put in its place once a guard has found it consistent:
    the same items, in a list that also hears every write to it, so a step that writes
    nothing leaves nothing to check (reads are the list's own, at C speed). ``verified`` is
    what the guard found at that check (each integration says what), None after any write
    (the engine activating, evicting, loading; anything writing it behind the engine's
    back). ``own`` is the engine's own list object, which `give_back` returns holding the
    current items. A copy or a pickle of it is a plain list."""

    __slots__ = ("own", "verified")

    def __init__(self, own: list[Any], verified: Any) -> None:
        super().__init__(own)
        self.own: list[Any] = own
        self.verified: Any = verified

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return list, (list(self),)

    def give_back(self) -> list[Any]:
        """The engine's own list, holding the items this one holds now."""
        self.own[:] = self
        return self.own


def _hearing(name: str) -> Callable[..., Any]:
    write = getattr(list, name)

    def heard(self: HeardList, /, *args: Any, **kwargs: Any) -> Any:
        self.verified = None
        return write(self, *args, **kwargs)
    heard.__name__ = heard.__qualname__ = name
    return heard


for _name in ("__setitem__", "__delitem__", "__iadd__", "__imul__", "append", "extend",
              "insert", "pop", "remove", "clear", "sort", "reverse"):
    setattr(HeardList, _name, _hearing(_name))
del _name
