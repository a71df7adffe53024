"""Building frozen records fast, for values a reader has already checked."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["builder"]

T = TypeVar("T")


def builder(cls: type[T]) -> Callable[..., T]:
    """A positional constructor for the frozen slots dataclass ``cls`` taking every field in
    order (no defaults), that sets each slot directly.

    A frozen dataclass's ``__init__`` stores each field through ``object.__setattr__``; the
    readers build one record per tensor and per module (a 400-tensor header, 400 of them), and
    the slot setters cost a third of that. Nothing is checked here: only code that has checked
    the values calls it. The code is generated once per class, as dataclasses does.

    Example:
        >>> from lora_guard._core.frozen import builder
        >>> from lora_guard import TensorInfo
        >>> builder(TensorInfo)((8, 64), "float16", 1024, (0, 1024)) == TensorInfo(
        ...     shape=(8, 64), dtype="float16", nbytes=1024, offsets=(0, 1024))
        True
    """
    params = dataclasses.fields(cls)  # type: ignore[arg-type]
    if not (getattr(cls, "__dataclass_params__").frozen  # noqa: B009 (not in type[T])
            and hasattr(cls, "__slots__")):
        raise TypeError(f"builder() builds frozen slots dataclasses, not {cls.__name__}")
    names = [f.name for f in params]
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    namespace.update({f"_set_{n}": getattr(cls, n).__set__ for n in names})
    body = "".join(f"    _set_{n}(record, {n})\n" for n in names)
    source = f"def build({', '.join(names)}):\n    record = _new(_cls)\n{body}    return record\n"
    exec(compile(source, f"<builder of {cls.__qualname__}>", "exec"), namespace)
    built: Callable[..., T] = namespace["build"]
    built.__qualname__ = f"builder({cls.__qualname__})"
    return built
