"""What a shape is: `shape_of` reads the shape of a tensor, of tensor metadata or of a tuple,
and refuses what is no shape with a clear error. Every layer reads shapes through it."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from typing import Any

__all__ = ["MAX_DIMS", "shape_of"]


MAX_DIMS = 64
"""Most dims `shape_of` accepts (a real tensor has at most a handful)."""


def shape_of(obj: Any, *, name: str = "value") -> tuple[int, ...] | None:
    """The shape of a tensor, of tensor metadata (anything with ``.shape``) or of a shape.

    None for an object without a shape. A shape must be at most `MAX_DIMS` integers
    (``operator.index``: ``16.9`` is not a dim) that are not negative; anything else, an
    endless iterator as ``.shape``, or a jagged nested tensor, raises `TypeError` or
    `ValueError` naming ``name``.

    Example:
        >>> from lora_guard._core.shapes import shape_of
        >>> shape_of((8, 64)), shape_of("text")
        ((8, 64), None)
        >>> class Meta:
        ...     shape = (8.5, 64)
        >>> shape_of(Meta(), name="lora_A")
        Traceback (most recent call last):
        ...
        TypeError: lora_A: dim 0 of the shape is 8.5 (float), not an integer
    """
    try:
        shape = getattr(obj, "shape", None)
    except Exception as exc:  # a nested tensor raises RuntimeError for .shape
        raise TypeError(f"{name}: its .shape cannot be read ({type(exc).__name__}: "
                        f"{str(exc)[:120]})") from None
    if shape is None:
        if not isinstance(obj, (tuple, list)) or not all(
                isinstance(d, int) and not isinstance(d, bool) for d in obj):
            return None
        shape = obj
    if isinstance(shape, tuple) and len(shape) <= MAX_DIMS:
        dims: Sequence[Any] = shape  # a torch.Size: bounded, nothing to copy
    else:
        if isinstance(shape, (str, bytes)):
            raise TypeError(f"{name}: its shape is the text {shape[:40]!r}, not a sequence "
                            "of dims")
        try:
            dims = list(itertools.islice(iter(shape), MAX_DIMS + 1))
        except Exception:
            raise TypeError(f"{name}: its shape ({type(shape).__name__}) is not a sequence of "
                            "dims") from None
        if len(dims) > MAX_DIMS:
            raise ValueError(f"{name}: its shape has more than {MAX_DIMS} dims")
    for dim in dims:
        if type(dim) is not int or dim < 0:  # not a size as it is: `_size` says what it is
            return tuple(_size(d, i, name) for i, d in enumerate(dims))
    return tuple(dims)


def _size(dim: Any, i: int, name: str) -> int:
    """Dim ``i`` of a shape as a size: an integer (``operator.index``) that is not negative."""
    try:
        value = operator.index(dim)
    except TypeError:
        raise TypeError(f"{name}: dim {i} of the shape is {str(dim)[:40]} "
                        f"({type(dim).__name__}), not an integer") from None
    except Exception:  # a jagged tensor's nested int
        raise TypeError(f"{name}: dim {i} of the shape is ragged ({type(dim).__name__}); "
                        "pass a regular tensor") from None
    if value < 0:
        raise ValueError(f"{name}: dim {i} of the shape is {value}, a negative size")
    return value
