"""Finding a wrapped function's argument by name or by a callable over its bound arguments."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Union

__all__ = ["ArgSelector", "selector"]

ArgSelector = Union[str, Callable[[Mapping[str, Any]], Any]]  # noqa: UP007 - a runtime alias
"""An argument name, or a callable over the bound arguments (name -> value, defaults applied)."""


def selector(
    fn: Callable[..., Any], option: str, spec: ArgSelector, *, decorator: str
) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    """Compile ``spec`` into a getter over a call's ``(args, kwargs)``, validated eagerly."""
    signature = inspect.signature(fn)
    if callable(spec):
        def from_callable(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return spec(bound.arguments)

        return from_callable
    if not isinstance(spec, str):
        raise TypeError(
            f"{decorator}({option}=...) takes an argument name or a callable over the bound "
            f"arguments, got {type(spec).__name__}"
        )
    params = list(signature.parameters.values())
    names = [p.name for p in params]
    if spec not in names:
        raise TypeError(
            f"{decorator}({option}={spec!r}) on {getattr(fn, '__qualname__', fn)}: no such "
            f"parameter (parameters: {names}); pass the parameter's name or a callable "
            "such as lambda args: args['self'].store."
        )
    param = signature.parameters[spec]
    index = names.index(spec) if param.kind in (
        param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD) else None
    default = None if param.default is param.empty else param.default

    def from_name(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if index is not None and index < len(args):
            return args[index]
        return kwargs.get(spec, default)

    return from_name
