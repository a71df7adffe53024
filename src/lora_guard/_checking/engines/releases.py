"""Which release a check is for: the installed one, a pinned one, or the nearest supported."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import warnings

from lora_guard._checking.engines.registry import ENGINES, SPECS
from lora_guard._checking.engines.spec import (
    EngineOptionError,
    EngineProfile,
    ReleaseWarning,
    version_key,
)

__all__ = ["installed_version", "nearest_release", "profile"]


def installed_version(engine: str) -> str | None:
    """The installed release of ``engine`` when it can be imported (its distribution's
    metadata, without importing it), else None."""
    if engine not in SPECS:
        return None
    try:
        if importlib.util.find_spec(engine) is None:
            return None
        return importlib.metadata.version(engine)
    except (ImportError, ValueError, importlib.metadata.PackageNotFoundError):
        return None


def nearest_release(engine: str, version: str) -> str:
    """The supported release closest to ``version``: the newest for a later one, the oldest
    for an earlier one, else the newest at or below it."""
    releases = SPECS[engine].releases
    key = version_key(version)
    if key >= version_key(releases[0]):
        return releases[0]
    return next((r for r in releases if version_key(r) <= key), releases[-1])


def profile(name: str, version: str | None = None, *, installed: bool = True) -> EngineProfile:
    """The profile of ``name`` (``"vllm"``, ``"vllm==0.31.0"``) at ``version``.

    Without a version: the installed release when the engine can be imported (``installed``
    true) and is supported, the nearest supported release (with a `ReleaseWarning`) when it is
    not, else the newest supported release. A version given that is not a supported release
    (or a prefix of one, ``0.31``) is an `EngineOptionError` listing the range.

    Example:
        >>> from lora_guard._checking.engines import profile
        >>> profile("vllm==0.31.0").label, profile("vllm", "0.33").label
        ('vllm==0.31.0', 'vllm==0.33.0')
        >>> try:
        ...     profile("vllm==0.1")
        ... except ValueError as err:  # EngineOptionError
        ...     print(err)  # doctest: +ELLIPSIS
        vllm 0.1 is not a supported release; supported: 0.29.0 to 0.34.0 (...)
    """
    if not isinstance(name, str):
        raise EngineOptionError(f"engine name must be a string such as 'vllm', got {name!r}")
    engine, _, pinned = name.strip().partition("==")
    engine = engine.strip().lower()
    pinned = pinned.strip()
    if pinned and version is not None and pinned != version:
        raise EngineOptionError(f"engine {name!r} and version={version!r} disagree")
    version = version or pinned or None
    spec = SPECS.get(engine)
    if spec is None:
        raise EngineOptionError(
            f"unknown engine {engine!r}; supported: {', '.join(sorted(SPECS))}")
    releases = ENGINES[engine]
    if version is None:
        found = installed_version(engine) if installed and engine != "peft" else None
        if found is None:
            return releases[0]
        near = nearest_release(engine, found)
        if not any(version_key(found) == version_key(r) for r in spec.releases):
            warnings.warn(
                f"{engine} {found} is installed, outside the releases lora_guard supports "
                f"({spec.supported_range}): checking with {engine}=={near}, the nearest; "
                f"pin one with --engine {engine}==VERSION", ReleaseWarning, stacklevel=2)
        return spec.at(near)
    for release in releases:
        if version in (release.version, *_prefixes(release.version)):
            return release
    raise EngineOptionError(
        f"{engine} {version} is not a supported release; supported: {spec.supported_range} "
        f"({', '.join(reversed(spec.releases))})")


def _prefixes(version: str) -> list[str]:
    parts = version.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]
