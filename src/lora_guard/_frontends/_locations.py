"""Where an annotation points (``--format github`` and ``sarif``), and the docs' URLs."""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING
from urllib.parse import quote

if TYPE_CHECKING:
    from lora_guard._core.errors import Violation

__all__ = ["DOCS_URL", "artifact_uri", "help_uri", "location"]

DOCS_URL = "https://lora-guard.readthedocs.io/en/latest/"
"""Where the documentation site is published (SARIF rules' ``helpUri`` point into it)."""


def location(adapter_id: str, v: Violation | None) -> str | None:
    """The file an annotation points at: the file named by the violation, else the adapter's
    ``adapter_config.json``, else the adapter itself; None for the set as a whole."""
    if adapter_id == "*" or "://" in adapter_id:
        return None if adapter_id == "*" else adapter_id
    folder = pathlib.Path(adapter_id)
    file = v.details.get("file") if v is not None else None
    if isinstance(file, str) and file and not pathlib.PurePath(file).is_absolute() \
            and ".." not in pathlib.PurePath(file).parts:
        return str(folder / file)
    config = folder / "adapter_config.json"
    if folder.is_dir() and config.exists():
        return str(config)
    return str(folder)


def help_uri(docs: str) -> str:
    """The published page of a catalogue entry's ``docs`` anchor."""
    page, _, anchor = docs.partition("#")
    page = page.removesuffix(".md") + "/"
    return DOCS_URL + page + (f"#{anchor}" if anchor else "")


def artifact_uri(path: str) -> str:
    """A SARIF ``artifactLocation.uri``: a URL as it is, a path quoted (absolute: file://)."""
    if "://" in path:
        return path
    p = pathlib.Path(path)
    if p.is_absolute():
        return p.as_uri()
    return quote(p.as_posix())
