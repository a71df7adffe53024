"""Page-cache control shared by the benchmarks that measure cold reads."""

from __future__ import annotations

import os
import pathlib


def evict(files: list[pathlib.Path]) -> None:
    """Drop the files from the page cache (POSIX_FADV_DONTNEED): the next read is cold."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
