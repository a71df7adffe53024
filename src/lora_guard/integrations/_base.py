"""What every integration shares: post-import hooks, exact patching, version checks.

An `Integration` names the functions it guards (`Patch`: module, attribute path, the
parameters it expects, and the wrapper). `instrument()` registers a wrapt post-import hook
per module, so the library is patched when (and only when) it is imported, whichever comes
first; `uninstrument()` puts the very objects it replaced back and turns every hook that
fires later into a no-op. A release whose signatures differ from the ones the integration
knows, or that is older than it supports, is left alone with an `IntegrationWarning`.

This module imports neither torch nor any guarded library.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import os
import re
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import wrapt

from .._config import STATE
from .._errors import Violation, make_violation
from .._safetensors import HeaderError, TensorInfo, read_safetensors_header

__all__ = [
    "Integration",
    "IntegrationWarning",
    "Patch",
    "TensorInfo",
    "adapter_files",
    "adapter_violations",
    "config_rank",
    "lora_modules",
    "read_adapter",
]

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
    parameters its signature must have, and the wrapt wrapper that guards it."""

    module: str
    path: str
    params: tuple[str, ...]
    wrapper: Wrapper
    optional: bool = False
    """A target missing from this release is skipped silently instead of blocking the module."""


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
    """Guards for one library, applied by post-import hooks; see the module docstring.

    Example:
        >>> from lora_guard.integrations import get
        >>> peft = get("peft")
        >>> peft.name, peft.instrumented
        ('peft', False)
    """

    name: str
    distribution: str
    """The top-level package (and distribution) whose version is checked."""
    min_version: str
    patches: tuple[Patch, ...]
    on_uninstrument: Callable[[], None] | None = None
    _active: bool = field(default=False, init=False)
    _pending: set[str] = field(default_factory=set, init=False)
    _applied: dict[tuple[str, str], _Applied] = field(default_factory=dict, init=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, init=False)
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

    def instrument(self) -> None:
        """Guard the library now if it is imported, or as soon as it is; idempotent."""
        with self._lock:
            self._active = True
            for module in dict.fromkeys(p.module for p in self.patches):
                if module in sys.modules:
                    self._on_import(sys.modules[module])
                elif module not in self._pending:
                    # wrapt fires a hook once, on the module's next import, then drops it.
                    self._pending.add(module)
                    wrapt.register_post_import_hook(self._on_import_hook, module)

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

    def _guarded(self, wrapper: Wrapper) -> Wrapper:
        def guarded(
            wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
            kwargs: dict[str, Any],
        ) -> Any:
            if not self._active or STATE.off:
                return wrapped(*args, **kwargs)
            return wrapper(wrapped, instance, args, kwargs)

        return guarded

    def _on_import_hook(self, module: Any) -> None:
        with self._lock:
            self._pending.discard(getattr(module, "__name__", ""))
            self._on_import(module)

    def _on_import(self, module: Any) -> None:
        with self._lock:
            if not self._active:
                return  # a hook that fires after uninstrument does nothing
            name = module.__name__
            todo = [
                p for p in self.patches if p.module == name and (p.module, p.path) not in
                self._applied
            ]
            if not todo:
                return
            version = self.version() or "unknown"
            problems: list[str] = []
            if version != "unknown" and _version_tuple(version) < _version_tuple(
                    self.min_version):
                problems.append(f"version {version} is older than {self.min_version}")
            resolved: list[tuple[Patch, Any, str]] = []
            for patch in todo:
                found = self._resolve(module, patch)
                if isinstance(found, str):
                    if patch.optional and found.startswith("missing"):
                        self.skipped[f"{name}:{patch.path}"] = found
                        continue
                    problems.append(f"{patch.path}: {found}")
                else:
                    resolved.append((patch, *found))
            if problems:
                reason = "; ".join(problems)
                for patch in todo:
                    self.skipped[f"{name}:{patch.path}"] = reason
                warnings.warn(
                    f"lora_guard.integrations.{self.name}: {self.distribution} {version} is "
                    f"not patched in {name} (its guards would be wrong there): {reason}. "
                    f"The library runs unguarded; lora_guard knows {self.distribution} >= "
                    f"{self.min_version} with the signatures it documents.",
                    IntegrationWarning,
                    stacklevel=3,
                )
                return
            for patch, parent, attr in resolved:
                original = vars(parent).get(attr, _MISSING)
                wrapt.wrap_function_wrapper(parent, attr, self._guarded(patch.wrapper))
                self._applied[(name, patch.path)] = _Applied(
                    parent, attr, original, vars(parent)[attr])

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


# --- adapters on disk: config + safetensors header, never tensor data ----------------------

def adapter_files(path: str | os.PathLike[str]) -> tuple[str, str] | None:
    """``(config, weights)`` of a local adapter folder, or None when it is not one."""
    folder = os.fspath(path)
    if not os.path.isdir(folder):
        return None
    config = os.path.join(folder, "adapter_config.json")
    weights = os.path.join(folder, "adapter_model.safetensors")
    return config, weights


def _malformed(subject: str, file: str, problem: str) -> Violation:
    return make_violation("LG108", "malformed", subject, file=os.path.basename(file),
                          problem=problem)


def _read_header(subject: str, file: str) -> tuple[dict[str, TensorInfo], list[Violation]]:
    try:
        tensors, _ = read_safetensors_header(file)
    except HeaderError as exc:
        return {}, [_malformed(subject, file, exc.problem)]
    except OSError as exc:
        return {}, [_malformed(subject, file, f"unreadable ({exc.strerror or exc})")]
    return tensors, []


def read_adapter(
    path: str | os.PathLike[str], subject: str
) -> tuple[dict[str, Any] | None, dict[str, TensorInfo] | None, list[Violation]]:
    """Read a local adapter's config and safetensors header (never tensor data).

    Returns ``(config, tensors, violations)``; ``tensors`` is None when the folder holds
    no safetensors file (a pickle ``.bin`` is never opened), ``config`` None when unreadable.
    """
    files = adapter_files(path)
    if files is None:
        return None, None, []
    config_file, weights_file = files
    violations: list[Violation] = []
    config: dict[str, Any] | None = None
    try:
        with open(config_file, encoding="utf-8") as fh:
            loaded = json.load(fh)
        if isinstance(loaded, dict):
            config = loaded
        else:
            violations.append(_malformed(subject, config_file, "not a JSON object"))
    except FileNotFoundError:
        pass  # the library reports a missing config in its own words
    except (OSError, ValueError) as exc:
        violations.append(_malformed(subject, config_file, f"invalid JSON ({exc})"))
    tensors: dict[str, TensorInfo] | None = None
    if os.path.isfile(weights_file):
        tensors, found = _read_header(subject, weights_file)
        violations += found
    return config, tensors, violations


# --- the adapter checks integrations share -------------------------------------------------

_LORA_KEY = re.compile(
    r"^(?P<module>.+)\.(?P<kind>lora_A|lora_B|lora_embedding_A|lora_embedding_B)"
    r"(?:\.[^.]+)?(?:\.weight)?$"
)


def lora_modules(
    tensors: Mapping[str, TensorInfo], *, adapter_name: str | None = None
) -> dict[str, dict[str, TensorInfo]]:
    """Group LoRA tensors by module: ``{module: {"A": info, "B": info}}``.

    ``adapter_name`` strips PEFT's in-memory ``.lora_A.<name>.weight`` segment.
    """
    modules: dict[str, dict[str, TensorInfo]] = {}
    for key, info in tensors.items():
        if adapter_name is not None:
            key = key.replace(f".{adapter_name}.weight", ".weight")
        match = _LORA_KEY.match(key)
        if match is None:
            continue
        side = "A" if match.group("kind").endswith("A") else "B"
        modules.setdefault(match.group("module"), {})[side] = info
    return modules


def _pattern_value(pattern: Mapping[str, Any], module: str) -> Any:
    for key, value in pattern.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return None


def config_rank(config: Mapping[str, Any], module: str) -> int | None:
    """The rank the config gives ``module`` (``rank_pattern`` first, then ``r``)."""
    pattern = config.get("rank_pattern") or {}
    value = _pattern_value(pattern, module) if isinstance(pattern, Mapping) else None
    if value is None:
        value = config.get("r")
    return value if isinstance(value, int) else None


_FEATURES: tuple[tuple[str, Callable[[Any], bool]], ...] = (
    ("use_dora", lambda v: bool(v)),
    ("lora_bias", lambda v: bool(v)),
    ("bias", lambda v: v not in (None, "none")),
    ("modules_to_save", lambda v: bool(v)),
    ("trainable_token_indices", lambda v: bool(v)),
)


def adapter_violations(
    subject: str,
    config: Mapping[str, Any] | None,
    tensors: Mapping[str, TensorInfo] | None,
    *,
    max_rank: int | None = None,
    served_modules: Iterable[str] | None = None,
    vocab_size: int | None = None,
    features: bool = True,
    grammar: bool = True,
    config_ranks: bool = True,
) -> list[Violation]:
    """LG101-LG109 for one adapter read by `read_adapter`, against a server's limits.

    ``served_modules`` are module names matched on the last path component (as vLLM and
    sglang do); ``features`` reports config features most servers do not serve (LG105);
    ``grammar`` reports keys outside LoRA key grammar (LG104); ``config_ranks`` compares
    tensor ranks with ``r`` / ``rank_pattern`` (LG102).
    """
    found: list[Violation] = []
    config = config or {}
    if features:
        peft_type = config.get("peft_type")
        if peft_type not in (None, "LORA"):
            found.append(make_violation("LG105", "feature", subject, feature="peft_type",
                                        value=peft_type))
        for feature, used in _FEATURES:
            if used(config.get(feature)):
                found.append(make_violation("LG105", "feature", subject, feature=feature,
                                            value=config.get(feature)))
    if max_rank is not None:
        ranks = {"r": config.get("r")}
        pattern = config.get("rank_pattern") or {}
        if isinstance(pattern, Mapping):
            ranks.update({f"rank_pattern[{k!r}]": v for k, v in pattern.items()})
        for where, rank in ranks.items():
            if isinstance(rank, int) and rank > max_rank:
                found.append(make_violation("LG101", "max", subject, rank=rank, module=where,
                                            max_rank=max_rank))
    if tensors is None:
        return found
    served = None if served_modules is None else set(served_modules)
    for key, info in sorted(tensors.items()):
        if 0 in info.shape:
            found.append(make_violation("LG107", "empty", subject, key=key,
                                        shape=info.shape))
        if grammar and _LORA_KEY.match(key) is None and "lora_magnitude_vector" not in key:
            found.append(make_violation("LG104", "grammar", subject, key=key))
    for module, sides in sorted(lora_modules(tensors).items()):
        if len(sides) == 1:
            (present,) = sides
            missing = "B" if present == "A" else "A"
            found.append(make_violation("LG103", "orphan", subject, module=module,
                                        present=f"lora_{present}", missing=f"lora_{missing}"))
            continue
        a, b = sides["A"], sides["B"]
        if len(a.shape) == 2 and len(b.shape) == 2:
            if a.shape[0] != b.shape[1]:
                found.append(make_violation(
                    "LG102", "a-b", subject, module=module, rank_a=a.shape[0],
                    shape_a=a.shape, rank_b=b.shape[1], shape_b=b.shape))
            else:
                want = config_rank(config, module) if config_ranks else None
                if want is not None and a.shape[0] != want and "experts" not in module:
                    found.append(make_violation("LG102", "config", subject, module=module,
                                                rank=a.shape[0], config_rank=want))
        leaf = module.rsplit(".", 1)[-1]
        if served is not None and leaf not in served and "experts" not in module:
            found.append(make_violation(
                "LG104", "module", subject, module=module.rsplit(".", 1)[-1],
                target=module, served=", ".join(sorted(served))))
    if vocab_size is not None:
        for key, info in sorted(tensors.items()):
            if "lora_embedding_A" in key and len(info.shape) == 2 and (
                    info.shape[1] != vocab_size):
                found.append(make_violation("LG109", "vocab", subject, key=key,
                                            got=info.shape[1], expected=vocab_size))
    return found
