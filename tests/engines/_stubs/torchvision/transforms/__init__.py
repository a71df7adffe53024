"""The one name sglang imports from here."""

from .functional import InterpolationMode

__all__ = ["InterpolationMode"]
