"""Opening an adapter folder's files safely: one descriptor per file (no symlink out of the
folder, no FIFO or device, no hard link someone else owns), the folder itself opened first
and its files relative to it, reads bounded by the file's size."""

from __future__ import annotations

import errno
import os
import pathlib
import stat

from lora_guard._reading.malformed import (
    CONFIG_NAME,
    MAX_CONFIG_BYTES,
    PICKLE_NAMES,
    WEIGHTS_NAME,
    Malformed,
)
from lora_guard._reading.safetensors import (
    OPEN_FLAGS,
    HeaderError,
    header_bytes_from_fd,
)


def is_adapter_dir(path: str | os.PathLike[str]) -> bool:
    """A folder that holds an adapter config or adapter weights (looked up by name, the
    config first, stopping at the first found: no listing, so a folder of 100,000 files
    costs one lookup, a folder that is not an adapter six)."""
    try:
        base = os.fspath(path)
        for name in _ADAPTER_ORDER:  # a loop: any() of a generator costs 0.7 us a folder
            if lexists(join_name(base, name)):
                return True
    except (OSError, ValueError, TypeError):  # bytes, a NUL: no adapter folder
        pass
    return False


def lexists(path: str, dir_fd: int | None = None) -> bool:
    """``os.path.lexists`` without a stat result: one ``faccessat`` that does not follow a
    link where the platform has it (the search asks it of every folder, the reader of every
    adapter's ``added_tokens.json``)."""
    if not _ACCESS_NOFOLLOW:
        return os.path.lexists(path)
    try:
        return os.access(path, os.F_OK, follow_symlinks=False, dir_fd=dir_fd)
    except (OSError, ValueError):  # a NUL in the name, a name too long
        return False


_ADAPTER_ORDER = (CONFIG_NAME, WEIGHTS_NAME, *PICKLE_NAMES)


_SEPARATORS = "/\\:" if os.name == "nt" else "/"


def join_name(base: str, name: str) -> str:
    """``os.path.join(base, name)`` for a plain file or folder name (no separator, not
    absolute), without the generality that makes it cost a microsecond per call.

    Example:
        >>> from lora_guard._reading.adapters import join_name
        >>> join_name("adapters/math", "adapter_config.json")
        'adapters/math/adapter_config.json'
    """
    return base + name if not base or base[-1] in _SEPARATORS else base + os.sep + name


def _link_root(folder: pathlib.Path) -> str:
    """Where the files of ``folder`` may link to: the folder itself, or for a Hugging Face
    cache snapshot (``models--org--name/snapshots/<revision>/``, whose files link to
    ``../../blobs/``) the cached repository that holds it."""
    real = os.path.realpath(folder)
    parent = os.path.dirname(real)
    if os.path.basename(parent) == "snapshots" and os.path.isdir(
            os.path.join(os.path.dirname(parent), "blobs")):
        return os.path.dirname(parent)
    return real


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


_ACCESS_NOFOLLOW = os.access in os.supports_follow_symlinks


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


_BY_DIR_FD = (os.open in os.supports_dir_fd and os.access in os.supports_dir_fd
              and hasattr(os, "O_DIRECTORY") and bool(_NOFOLLOW) and _ACCESS_NOFOLLOW)
"""Files are opened relative to their folder's descriptor (POSIX): the folder read is the
folder found, even if its path is swapped for a symlink in between."""


def _open_folder(folder: pathlib.Path, follow: bool) -> int | None:
    """A descriptor of ``folder`` (None where the platform has no ``dir_fd``); a symlink is
    followed only when ``follow`` (a path the user named), never for a folder the search
    found: one swapped for a symlink since is refused, not read where it leads."""
    if not _BY_DIR_FD:
        return None
    try:
        return os.open(folder, _DIR_FLAGS | (0 if follow else _NOFOLLOW))
    except OSError as exc:
        if not follow and os.path.islink(folder):
            raise Malformed(str(folder), "was replaced by a symlink after it was found; a "
                            "link is not followed when a folder is searched (pass its target "
                            "to check it)", kind="link") from None
        raise Malformed(str(folder), f"cannot be opened ({_reason(exc)})",
                        kind="not-found") from None


def _folder_path(folder: pathlib.Path, dir_fd: int | None) -> str:
    """Where the folder opened as ``dir_fd`` really is (its descriptor's path, where the
    platform tells it), else its path as given."""
    if dir_fd is not None:
        opened = _opened_path(dir_fd)
        if opened is not None:
            return opened
    return os.fspath(folder)


def open_regular(folder: pathlib.Path, name: str,
                  dir_fd: int | None = None) -> tuple[int, os.stat_result] | None:
    """``folder/name`` opened once (``O_NOFOLLOW | O_NONBLOCK``) and its ``fstat``, or None
    when it does not exist. Everything after this reads through the descriptor, so nothing
    can be swapped in between. A symlink is followed only when it stays inside the folder
    (or the Hugging Face cache repository holding a snapshot folder); a FIFO, a device or a
    folder is refused without blocking; a hard link to a file someone else owns is refused
    (a hard link cannot tell where its other names are; one owned by another user is how a
    file outside the folder gets in, while one of your own is a dedup or a copy)."""
    try:
        if dir_fd is None:
            fd = os.open(join_name(os.fspath(folder), name), OPEN_FLAGS | _NOFOLLOW)
        else:
            fd = os.open(name, OPEN_FLAGS | _NOFOLLOW, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        path = join_name(_folder_path(folder, dir_fd), name)
        if exc.errno not in (errno.ELOOP, errno.EMLINK) or not os.path.islink(path):
            raise Malformed(name, f"cannot be opened ({_reason(exc)})") from None
        fd = _open_link(pathlib.Path(_folder_path(folder, dir_fd)), name, path)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Malformed(name, "not a regular file")
        if (info.st_nlink > 1 and hasattr(os, "geteuid")
                and info.st_uid != os.geteuid()):
            raise Malformed(name, f"a hard link ({info.st_nlink} names) to a file owned by "
                            "another user; refused as possibly outside the folder", kind="link")
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def _open_link(folder: pathlib.Path, name: str, path: str) -> int:
    """Open the target of the symlink ``path`` if it resolves inside the link root."""
    try:
        target = os.readlink(path)
        root = _link_root(folder)
        real = os.path.realpath(path)
    except (OSError, ValueError) as exc:
        reason = _reason(exc) if isinstance(exc, OSError) else str(exc)
        raise Malformed(name, f"symlink cannot be resolved ({reason})") from None
    if not _within(real, root):
        raise Malformed(name, f"path leads outside the adapter folder (symlink to "
                        f"{target}); refused", kind="link")
    try:
        fd = os.open(real, OPEN_FLAGS | _NOFOLLOW)
    except OSError as exc:
        raise Malformed(name, f"symlink to {target} leads nowhere ({_reason(exc)})") from None
    opened = _opened_path(fd)  # a folder on the way swapped for a link since realpath
    if opened is not None and not _within(opened, root):
        os.close(fd)
        raise Malformed(name, f"path leads outside the adapter folder (symlink to "
                        f"{target}, changed while opened); refused", kind="link")
    return fd


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _opened_path(fd: int) -> str | None:
    """Where an open descriptor really is (Linux /proc), or None where that cannot be told."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def _read_fd(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        want = min(left, 1 << 22)
        chunk = os.read(fd, want)
        chunks.append(chunk)
        left -= len(chunk)
        if len(chunk) < want:  # a regular file reads short only at its end
            break
    return b"".join(chunks) if len(chunks) != 1 else chunks[0]


def _config_bytes(folder: pathlib.Path, dir_fd: int | None = None) -> bytes:
    opened = open_regular(folder, CONFIG_NAME, dir_fd)
    if opened is None:
        raise Malformed(CONFIG_NAME, "missing; an adapter folder needs adapter_config.json")
    fd, info = opened
    try:
        if info.st_size > MAX_CONFIG_BYTES:
            raise Malformed(CONFIG_NAME, f"larger than {MAX_CONFIG_BYTES} bytes")
        raw = _read_fd(fd, info.st_size + 1)  # a buffer of the file's size, not of the cap
        if len(raw) > info.st_size:  # it grew since fstat: read on, up to the cap
            raw += _read_fd(fd, MAX_CONFIG_BYTES + 1 - len(raw))
    except OSError as exc:
        raise Malformed(CONFIG_NAME, f"cannot be read ({_reason(exc)})") from None
    finally:
        os.close(fd)
    return raw


def _read_weights(
    folder: pathlib.Path, required: bool = True, dir_fd: int | None = None
) -> tuple[bytes, int, int] | None:
    """The weights file's header bytes, the size of its data section and the file's size;
    None for a folder without one when not ``required``."""
    opened = open_regular(folder, WEIGHTS_NAME, dir_fd)
    if opened is None and not required:
        return None
    if opened is None:
        for name in PICKLE_NAMES:
            if os.path.lexists(os.path.join(folder, name)):
                raise Malformed(name, "pickle weights refused (never unpickled); convert to "
                                "safetensors", kind="pickle")
        raise Malformed(WEIGHTS_NAME, "missing; no adapter weights in the folder")
    fd, info = opened
    try:
        raw, data_size = header_bytes_from_fd(fd, info.st_size)
    except HeaderError as exc:
        raise Malformed(WEIGHTS_NAME, exc.problem) from None
    except OSError as exc:
        raise Malformed(WEIGHTS_NAME, f"cannot be read ({_reason(exc)})") from None
    finally:
        os.close(fd)
    return raw, data_size, info.st_size


def _close_all(fds: list[int | None]) -> None:
    for fd in fds:
        if fd is not None:
            os.close(fd)
