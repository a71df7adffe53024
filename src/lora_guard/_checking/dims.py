"""The dim grammar of `lora_guard.shapes`, and the reference interpreter of it.

A spec is space-separated tokens: a name binds a size (the same name must agree across every
argument of the call), an integer is literal, ``_`` is any size, ``k*name`` / ``name*k`` is a
multiple of a bound size, ``...`` (first only) any number of leading dims.

The guard compiles each spec to straight-line Python for the hot path (see ``fast_path``); this
module is the slow, readable version used to explain a failure and by the predicates. Tests
check that the two agree.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lora_guard._checking.checks import dtype_name, shape_of
from lora_guard._core.errors import Violation, make_violation

__all__ = ["Dim", "DimSpec", "bind_dims", "parse_spec"]

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class Dim:
    """One token: ``kind`` is ``"name"``, ``"literal"``, ``"any"`` or ``"multiple"``."""

    kind: str
    name: str = ""
    value: int = 0  # the literal, or the factor of a multiple


@dataclass(frozen=True)
class DimSpec:
    """A parsed spec: its text, its tokens, and whether it starts with ``...``."""

    text: str
    dims: tuple[Dim, ...]
    ellipsis: bool

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dims if d.name)

    def axis(self, i: int) -> int:
        """The axis index of token ``i`` in the tensor (negative after ``...``)."""
        return i - len(self.dims) if self.ellipsis else i


def _bad(text: str, why: str, argument: str) -> ValueError:
    return ValueError(
        f"lora_guard.shapes: the spec {text!r} for argument {argument!r} is invalid: {why}. "
        "A spec is space-separated names, integers, '_', 'k*name' or 'name*k', "
        "optionally starting with '...', e.g. 'slots 2*rank hidden'."
    )


def parse_spec(text: str, *, argument: str = "?") -> DimSpec:
    """Parse a spec such as ``"slots outer 2*rank hidden"``; raises ValueError if invalid."""
    if not isinstance(text, str):
        raise TypeError(
            f"lora_guard.shapes: the spec for argument {argument!r} must be a string such as "
            f"'slots rank hidden', got {type(text).__name__}"
        )
    tokens = text.split()
    ellipsis = bool(tokens) and tokens[0] == "..."
    if ellipsis:
        tokens = tokens[1:]
    dims: list[Dim] = []
    for token in tokens:
        if token == "...":
            raise _bad(text, "'...' may only come first", argument)
        if token == "_":
            dims.append(Dim("any"))
        elif token.isdigit():
            dims.append(Dim("literal", value=int(token)))
        elif "*" in token:
            left, _, right = token.partition("*")
            factor, name = (left, right) if left.isdigit() else (right, left)
            if not factor.isdigit() or not _NAME.match(name) or int(factor) < 1:
                raise _bad(text, f"{token!r} is not 'k*name' or 'name*k' with k >= 1", argument)
            dims.append(Dim("multiple", name=name, value=int(factor)))
        elif _NAME.match(token) and not keyword.iskeyword(token):
            dims.append(Dim("name", name=token))
        else:
            raise _bad(text, f"{token!r} is not a name, an integer, '_' or a multiple", argument)
    return DimSpec(text, tuple(dims), ellipsis)


@dataclass
class _Bound:
    value: int
    argument: str
    axis: int


def _shape(subject: str, arg: str, spec: DimSpec, value: Any
           ) -> tuple[tuple[int, ...] | None, Violation | None]:
    """The shape of one argument, or the LG004 saying why it has none that fits ``spec``."""
    shape = (shape_of(value, name=f"{subject}: argument {arg!r}")
             if hasattr(value, "shape") else None)
    if shape is None:
        return None, make_violation("LG004", "no-shape", subject, argument=arg,
                                    type=type(value).__name__, spec=spec.text)
    want = len(spec.dims)
    if len(shape) < want if spec.ellipsis else len(shape) != want:
        return None, make_violation(
            "LG004", "ndim", subject, argument=arg, ndim=len(shape), shape=shape,
            spec=spec.text, expected_ndim=f"at least {want}" if spec.ellipsis else want)
    return shape, None


def _read_shapes(subject: str, specs: Mapping[str, DimSpec], values: Mapping[str, Any],
                 dtypes: frozenset[str] | None, same_dtype: bool,
                 ) -> tuple[dict[str, tuple[int, ...]], dict[str, str], list[Violation]]:
    """The shapes (and dtype names) of the arguments given, with their LG004s."""
    shapes: dict[str, tuple[int, ...]] = {}
    seen_dtypes: dict[str, str] = {}
    found: list[Violation] = []
    for arg, spec in specs.items():
        value = values.get(arg)
        if value is None:
            continue
        shape, violation = _shape(subject, arg, spec, value)
        if violation is not None or shape is None:
            found.extend([violation] if violation is not None else [])
            continue
        shapes[arg] = shape
        if dtypes is not None or same_dtype:
            name = dtype_name(value) or "?"
            seen_dtypes[arg] = name
            if dtypes is not None and name not in dtypes:
                found.append(make_violation("LG004", "dtype", subject, argument=arg, got=name,
                                            expected=sorted(dtypes)))
    return shapes, seen_dtypes, found


def bind_dims(
    subject: str,
    specs: Mapping[str, DimSpec],
    values: Mapping[str, Any],
    *,
    where: Callable[[dict[str, int]], bool] | None = None,
    dtypes: frozenset[str] | None = None,
    same_dtype: bool = False,
) -> tuple[dict[str, int], dict[str, tuple[str, int]], list[Violation]]:
    """Bind every named dim of ``specs`` from ``values``; report LG004 for each disagreement.

    Returns the bound dims, where each was bound (argument, axis), and the violations. An
    argument whose value is None is skipped (optional tensors); a shape that is not one
    (a float or negative dim, an endless ``.shape``) raises naming the argument.
    """
    call = _Call(subject, specs)
    seen_dtypes: dict[str, str] = {}
    for arg, spec in specs.items():
        value = values.get(arg)
        if value is None or not call.read_shape(arg, spec, value):
            continue
        if dtypes is not None or same_dtype:
            seen_dtypes[arg] = call.check_dtype(arg, value, dtypes)
    # Plain names bind first so that a multiple can be checked against them wherever it stands.
    order = sorted(
        ((arg, i) for arg, spec in specs.items() for i in range(len(spec.dims))),
        key=lambda item: specs[item[0]].dims[item[1]].kind == "multiple",
    )
    for arg, i in order:
        if arg in call.shapes:
            call.bind(arg, i)
    found = call.found
    if same_dtype and len(set(seen_dtypes.values())) > 1:
        found.append(make_violation("LG004", "same-dtype", subject, dtypes=seen_dtypes))
    dims = {name: b.value for name, b in call.bound.items()}
    if where is not None and not found and not where(dict(dims)):
        found.append(make_violation("LG004", "where", subject, dims=dims))
    return dims, {name: (b.argument, b.axis) for name, b in call.bound.items()}, found


class _Call:
    """One call being checked: the shapes read, the dims bound, the violations found."""

    def __init__(self, subject: str, specs: Mapping[str, DimSpec]) -> None:
        self.subject = subject
        self.specs = specs
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.bound: dict[str, _Bound] = {}
        self.found: list[Violation] = []

    def read_shape(self, arg: str, spec: DimSpec, value: Any) -> bool:
        """Record the argument's shape if it has one of the spec's rank; else report."""
        shape = (shape_of(value, name=f"{self.subject}: argument {arg!r}")
                 if hasattr(value, "shape") else None)
        if shape is None:
            self.found.append(make_violation("LG004", "no-shape", self.subject, argument=arg,
                                             type=type(value).__name__, spec=spec.text))
            return False
        want = len(spec.dims)
        if len(shape) < want if spec.ellipsis else len(shape) != want:
            self.found.append(
                make_violation("LG004", "ndim", self.subject, argument=arg, ndim=len(shape),
                               shape=shape, spec=spec.text,
                               expected_ndim=f"at least {want}" if spec.ellipsis else want)
            )
            return False
        self.shapes[arg] = shape
        return True

    def check_dtype(self, arg: str, value: Any, dtypes: frozenset[str] | None) -> str:
        """The argument's dtype name, reported if not among ``dtypes``."""
        name = dtype_name(value) or "?"
        if dtypes is not None and name not in dtypes:
            self.found.append(make_violation("LG004", "dtype", self.subject, argument=arg,
                                             got=name, expected=sorted(dtypes)))
        return name

    def bind(self, arg: str, i: int) -> None:
        """Check token ``i`` of ``arg``'s spec against its size, binding a new name."""
        spec, shape = self.specs[arg], self.shapes[arg]
        dim, axis = spec.dims[i], spec.axis(i)
        got = shape[axis]
        where: dict[str, Any] = {"argument": arg, "axis": axis, "got": got, "shape": shape,
                                 "spec": spec.text}
        if dim.kind == "any":
            return
        if dim.kind == "literal":
            if got != dim.value:
                self.found.append(make_violation("LG004", "literal", self.subject, **where,
                                                 expected=dim.value))
            return
        factor = dim.value if dim.kind == "multiple" else 1
        if got % factor:
            self.found.append(make_violation("LG004", "multiple", self.subject, **where,
                                             factor=factor))
            return
        prior = self.bound.get(dim.name)
        if prior is None:
            self.bound[dim.name] = _Bound(got // factor, arg, axis)
        elif prior.value * factor != got:
            self.found.append(make_violation(
                "LG004", "bound", self.subject, argument=arg, axis=axis,
                dim=dim.name if factor == 1 else f"{factor}*{dim.name}",
                expected=prior.value * factor, bound_by=prior.argument,
                got=got, shape=shape, spec=spec.text))
