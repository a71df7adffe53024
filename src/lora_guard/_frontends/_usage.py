"""The one error of the ``lora-guard`` command line: a usage error (exit 2, no traceback)."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(Exception):
    """A problem with how ``lora-guard`` was called or configured: exit 2, no traceback."""
