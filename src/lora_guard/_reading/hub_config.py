"""The config.json of a Hub model named in a pasted serve command (``vllm serve org/model``).

Read through huggingface_hub (the ``remote`` extra), the local cache first: with
``HF_HUB_OFFLINE`` set only the cache is read; otherwise a config.json not in the cache is
fetched (that file alone, never weights). Where it cannot be had, `hub_base_config` says why, and
the checker reports the base-model check as skipped with that reason, never a silent pass.
``HF_HUB_CACHE``, ``HF_HOME``, ``HF_HUB_OFFLINE`` and ``HF_ENDPOINT`` are read when it is called.
"""

from __future__ import annotations

import os
import pathlib
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["HubConfig", "hub_base_config", "looks_like_hub_id"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?$")
_TRUE = {"1", "on", "yes", "true"}


@dataclass(frozen=True)
class HubConfig:
    """Where a Hub model's config.json is on disk, or why it could not be had."""

    path: str | None
    """The cached config.json, None when it could not be had."""
    skipped: str | None = None
    """Why not (a sentence for the report), None when `path` is set."""


def looks_like_hub_id(model: str) -> bool:
    """True for ``org/name`` or ``name`` that names no local path: a Hub model id."""
    return (bool(_HUB_ID.match(model)) and ".." not in model and not model.endswith(".")
            and not pathlib.Path(model).exists())


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def _cache_dir() -> str | None:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return None  # huggingface_hub's default


def hub_base_config(model: str, *, revision: str | None = None) -> HubConfig:
    """The config.json of the Hub model ``model``: from the local cache, else (unless
    ``HF_HUB_OFFLINE``) fetched alone; or why it cannot be had.

    Example:
        >>> import os, tempfile
        >>> from lora_guard._reading.hub_config import hub_base_config
        >>> os.environ["HF_HUB_OFFLINE"], os.environ["HF_HUB_CACHE"] = "1", tempfile.mkdtemp()
        >>> print(hub_base_config("meta-llama/Llama-3.1-8B").skipped)  # doctest: +ELLIPSIS
        the base-model check was skipped: config.json of Hub model 'meta-llama/Llama-3.1-8B' is
        not in the local cache ... and HF_HUB_OFFLINE is set; ...
        >>> del os.environ["HF_HUB_OFFLINE"], os.environ["HF_HUB_CACHE"]
    """
    why = "the base-model check was skipped: "
    fix = "; pass --base-config with the base model's config.json"
    try:
        import huggingface_hub
    except ImportError:
        return HubConfig(None, f"{why}reading Hub model {model!r}'s config.json needs "
                         f"huggingface_hub (pip install 'lora-guard[remote]'){fix}")
    cache = _cache_dir()
    found: Any = huggingface_hub.try_to_load_from_cache(model, "config.json", cache_dir=cache,
                                                         revision=revision)
    if isinstance(found, str):
        return HubConfig(found)
    where = cache or str(huggingface_hub.constants.HF_HUB_CACHE)
    if _offline():
        return HubConfig(None, f"{why}config.json of Hub model {model!r} is not in the local "
                         f"cache ({where}) and HF_HUB_OFFLINE is set{fix}, or download it "
                         f"once: hf download {model} config.json")
    try:
        path = huggingface_hub.hf_hub_download(
            model, "config.json", revision=revision, cache_dir=cache,
            endpoint=os.environ.get("HF_ENDPOINT") or None)
    except Exception as exc:  # the Hub's errors (HTTP, gated, missing) vary by release
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return HubConfig(None, f"{why}config.json of Hub model {model!r} could not be read "
                         f"({type(exc).__name__}: {reason}){fix}")
    return HubConfig(str(path))
