"""Finding the adapters a check names: folders, files of an adapter, folders searched for
adapter folders (bounded in depth and entries, never following a symlink), remote ids."""

from __future__ import annotations

import operator
import os
import pathlib
import stat
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any, Union

from lora_guard._reading.adapters import AdapterSpec, Malformed, is_adapter_dir, join_name
from lora_guard._reading.bounded import Bounded

__all__ = [
    "MAX_SEARCH_DEPTH",
    "MAX_SEARCH_ENTRIES",
    "PathOrSpec",
    "Target",
    "as_list",
    "discover_all",
    "folder_path",
]

PathOrSpec = Union[str, "os.PathLike[str]", AdapterSpec]
"""What `check_adapters` takes: a path (local or remote) or a spec already read."""

MAX_SEARCH_DEPTH = 64
"""Deepest folder a search descends to below the path given (an upload nests 3 or 4)."""
MAX_SEARCH_ENTRIES = 200_000
"""Most folder entries a search looks at, in all; past it the search stops and says so."""

Target = Union[AdapterSpec, pathlib.Path, str, Malformed, "Future[Any]"]
"""What one discovered adapter is read from: a spec given, a folder, a problem already
known, or a remote read under way."""
_Found = tuple[str, Target, str]
"""(adapter id, what to read, its real path: two ids of one real folder are checked once)."""



def discover_all(items: list[PathOrSpec]) -> list[tuple[str, Target]]:
    """Every adapter the items name, each real folder once, in the order given."""
    discovered: list[tuple[str, Target]] = []
    seen: set[str] = set()
    remote = _fetch_remote(items)  # hf://, s3://, https:// (read in parallel), else {}
    for index, item in enumerate(items):
        fetched = remote.get(index)
        found: Iterable[_Found] = (
            [(i, t, os.path.realpath(i)) for i, t in fetched] if fetched else _discover(item))
        for adapter_id, target, real in found:
            if real not in seen:
                seen.add(real)
                discovered.append((adapter_id, target))
    return discovered


def _fetch_remote(items: list[PathOrSpec]) -> dict[int, list[tuple[str, Future[Any]]]]:
    if not any(isinstance(i, str) and ("://" in i or i.count("/") == 1) for i in items):
        return {}  # no URL, no Hub id: the remote module is not even imported
    from lora_guard._reading.remote import fetch_remote

    return fetch_remote(items)



def _discover(item: PathOrSpec) -> list[_Found]:
    """The adapters a path names: itself, its parent (a file of an adapter), or the adapter
    folders found below it; a problem is itself an entry (`Malformed`)."""
    if isinstance(item, AdapterSpec):
        return [(str(item.path), item, os.path.realpath(item.path))]
    path = pathlib.Path(item)
    shown = os.fspath(item)
    info = _stat(path, shown)
    if isinstance(info, Malformed):
        return [(shown, info, shown)]
    if stat.S_ISREG(info.st_mode) and path.name in (
            "adapter_config.json", "adapter_model.safetensors"):
        return [(str(path.parent), path.parent, os.path.realpath(path.parent))]
    if not stat.S_ISDIR(info.st_mode):
        return [(shown, Malformed(shown, "not an adapter folder", kind="not-found"), shown)]
    if is_adapter_dir(path):
        return [(shown, path, os.path.realpath(path))]
    found = _search(str(path), os.path.realpath(path), shown)
    if not found:
        return [(shown, Malformed(
            shown, "no adapter found (no folder holding adapter_config.json or "
            "adapter_model.safetensors)", kind="not-found"), shown)]
    return found


def _stat(path: pathlib.Path, shown: str) -> os.stat_result | Malformed:
    try:
        return os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            return Malformed(shown, "a symlink that leads nowhere", kind="not-found")
        return Malformed(shown, "no such file or folder", kind="not-found")
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return Malformed(shown, f"cannot be read ({reason})", kind="not-found")


def _search(root: str, real_root: str, shown: str) -> list[_Found]:
    """The adapter folders below ``root``, depth first in name order, without following a
    symlink; each one's real path is its parent's and its name (no ``realpath`` per
    adapter: the search never leaves a real folder)."""
    found: list[_Found] = []
    stack: list[tuple[str, str, int]] = [(root, real_root, 0)]  # iterative: no recursion limit
    seen = 0
    while stack:
        here, real, depth = stack.pop()
        children = _children(here, found)
        seen += len(children)
        if seen > MAX_SEARCH_ENTRIES:
            found.append((shown, Malformed(
                shown, f"search stopped after {MAX_SEARCH_ENTRIES:,} folder entries; name the "
                "adapter folders instead", kind="not-found"), shown))
            break
        below = [(_child(here, entry), join_name(real, entry.name), depth + 1)
                 for entry in children if _visit(entry, here, real, depth, shown, found)]
        stack.extend(reversed(below))
    return found


def _children(here: str, found: list[_Found]) -> list[os.DirEntry[str]]:
    """The entries of a folder in name order; a folder that cannot be read is reported."""
    try:
        with os.scandir(here) as entries:
            return sorted(entries, key=_BY_NAME)
    except OSError as exc:
        found.append((here, Malformed(
            here, f"folder cannot be read ({exc.strerror or type(exc).__name__}); "
            "adapters in it were not checked", kind="not-found"), here))
        return []


_BY_NAME = operator.attrgetter("name")


def _child(here: str, entry: os.DirEntry[str]) -> str:
    """The entry's path as ``str(pathlib.Path(here) / name)`` spells it."""
    return entry.name if here == "." else entry.path


def _visit(entry: os.DirEntry[str], here: str, real: str, depth: int, shown: str,
           found: list[_Found]) -> bool:
    """Record ``entry`` if it is an adapter folder (or a problem); True to search below it."""
    child = _child(here, entry)
    try:
        if entry.is_symlink():
            if is_adapter_dir(child):  # said, not read: it may lead anywhere
                found.append((child, Malformed(
                    child, f"a symlinked folder (to {os.readlink(child)}) is not followed "
                    "when a folder is searched; pass it explicitly to check it",
                    kind="link"), child))
            return False
        if not entry.is_dir(follow_symlinks=False):
            return False
    except OSError:
        return False
    if is_adapter_dir(child):
        found.append((child, child, join_name(real, entry.name)))
        return False
    if depth + 1 >= MAX_SEARCH_DEPTH:
        found.append((child, Malformed(
            child, f"folders nest deeper than {MAX_SEARCH_DEPTH} levels below "
            f"{shown}; the search does not go further", kind="not-found"), child))
        return False
    return True



def as_list(paths_or_specs: PathOrSpec | Iterable[PathOrSpec]) -> list[PathOrSpec]:
    if isinstance(paths_or_specs, (str, os.PathLike, AdapterSpec)):
        return [paths_or_specs]
    if isinstance(paths_or_specs, Iterable):
        items = list(paths_or_specs)
        for item in items:
            if not isinstance(item, (str, os.PathLike, AdapterSpec)):
                raise TypeError(
                    "check_adapters takes paths (str or PathLike) or lg.AdapterSpec objects, "
                    f"got {type(item).__name__}"
                )
        return items
    raise TypeError(
        "check_adapters takes a path, an lg.AdapterSpec, or a list of them, got "
        f"{type(paths_or_specs).__name__}"
    )



_PARENTS: Bounded[str, pathlib.Path] = Bounded(
    64, "the last searched folders' paths, by their text (the folders of one search)")


def folder_path(found: str) -> pathlib.Path:
    """The path of a folder the search found, built on its parent's (the adapters of one
    folder share the parts of its path: 100,000 paths hold their own names only)."""
    head, _, name = found.rpartition(os.sep)
    if not head or not name:
        return pathlib.Path(found)
    return _PARENTS.get_or_make(head, lambda: pathlib.Path(head)) / name
