"""The fast path of `@lora_guard.shapes`, built as an `ast` tree (never pasted from strings).

`build_fast_path` turns a function's signature and its parsed dim specs into one function
definition: the function's own parameters, then straight-line checks that unpack each
``.shape`` into locals and compare ints, handing anything unusual to the slow path. The names
it reads are all ``_lg_*`` globals that the caller supplies (see `GLOBALS`).

Example:
    >>> import ast, inspect
    >>> from lora_guard._checking.dims import parse_spec
    >>> def load(a, b): ...
    >>> plan = FastPathPlan("load", inspect.signature(load),
    ...                     {"a": parse_spec("n r"), "b": parse_spec("r n")})
    >>> source = ast.unparse(build_fast_path(plan))
    >>> print(next(line for line in source.splitlines() if "!=" in line))
        if _lg_1_0 != _lg_d_r or _lg_1_1 != _lg_d_n:
"""

from __future__ import annotations

import ast
import copy
import inspect
import itertools
import linecache
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import CodeType
from typing import Any, cast

from lora_guard._checking.dims import Dim, DimSpec

__all__ = ["GLOBALS", "FastPathPlan", "build_fast_path", "compile_fast_path", "default_name",
           "inline_where"]

# The globals the generated function reads, each supplied by the caller's namespace.
GLOBALS = (
    "_lg_fn", "_lg_state", "_lg_slow", "_lg_compiling", "_lg_where", "_lg_dtypes",
    "_lg_calls", "_lg_key", "_lg_Slow",
)
_P = inspect.Parameter
_POSITIONAL = (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)


@dataclass(frozen=True)
class FastPathPlan:
    """What the fast path checks: one decorated function's signature, specs and options.

    ``where`` is the predicate's body already rewritten over the dim locals (`inline_where`),
    or None to call ``_lg_where`` with a dict of the bound dims (when ``has_where``).
    """

    name: str
    signature: inspect.Signature
    specs: Mapping[str, DimSpec]
    check_dtypes: bool = False
    same_dtype: bool = False
    has_where: bool = False
    where: ast.expr | None = None
    frozen: tuple[str, ...] = ()
    owner_param: str | None = None


@dataclass(frozen=True)
class _Ref:
    """Where one token's size is after unpacking: a local, or an item of a kept shape."""

    local: str
    axis: int | None = None  # None: ``local`` is the size itself

    def expr(self) -> ast.expr:
        if self.axis is None:
            return _load(self.local)
        return ast.Subscript(value=_load(self.local), slice=ast.Constant(self.axis),
                             ctx=ast.Load())


def default_name(parameter: str) -> str:
    """The global holding a parameter's default value."""
    return f"_lg_default_{parameter}"


def _load(name: str) -> ast.Name:
    return ast.Name(id=name, ctx=ast.Load())


def _store(name: str) -> ast.Name:
    return ast.Name(id=name, ctx=ast.Store())


def _any(conditions: Sequence[ast.expr]) -> ast.expr:
    if len(conditions) == 1:
        return conditions[0]
    return ast.BoolOp(op=ast.Or(), values=list(conditions))


def _compare(left: ast.expr, op: ast.cmpop, right: ast.expr) -> ast.Compare:
    return ast.Compare(left=left, ops=[op], comparators=[right])


def _if(test: ast.expr, *body: ast.stmt) -> ast.If:
    return ast.If(test=test, body=list(body), orelse=[])


def _attr(name: str, attribute: str) -> ast.Attribute:
    return ast.Attribute(value=_load(name), attr=attribute, ctx=ast.Load())


def _assign(target: ast.expr, value: ast.expr) -> ast.Assign:
    return ast.Assign(targets=[target], value=value)


# -- the signature, the call to the function, the call to the slow path --------------------


def _arguments(signature: inspect.Signature) -> ast.arguments:
    """The wrapper's parameters: the function's own, each default read from a global."""
    params = list(signature.parameters.values())
    positional = [p for p in params if p.kind in _POSITIONAL]
    keyword_only = [p for p in params if p.kind == _P.KEYWORD_ONLY]
    star = next((p for p in params if p.kind == _P.VAR_POSITIONAL), None)
    double_star = next((p for p in params if p.kind == _P.VAR_KEYWORD), None)
    return ast.arguments(
        posonlyargs=[ast.arg(p.name) for p in positional if p.kind == _P.POSITIONAL_ONLY],
        args=[ast.arg(p.name) for p in positional if p.kind == _P.POSITIONAL_OR_KEYWORD],
        vararg=ast.arg(star.name) if star else None,
        kwonlyargs=[ast.arg(p.name) for p in keyword_only],
        kw_defaults=[None if p.default is p.empty else _load(default_name(p.name))
                     for p in keyword_only],
        kwarg=ast.arg(double_star.name) if double_star else None,
        defaults=[_load(default_name(p.name)) for p in positional if p.default is not p.empty],
    )


def _forward_call(signature: inspect.Signature) -> ast.Call:
    """``_lg_fn(...)`` passing every parameter on as the function declares it."""
    args: list[ast.expr] = []
    keywords: list[ast.keyword] = []
    for p in signature.parameters.values():
        if p.kind in _POSITIONAL:
            args.append(_load(p.name))
        elif p.kind == _P.VAR_POSITIONAL:
            args.append(ast.Starred(value=_load(p.name), ctx=ast.Load()))
        else:
            keywords.append(ast.keyword(arg=p.name if p.kind == _P.KEYWORD_ONLY else None,
                                        value=_load(p.name)))
    return ast.Call(func=_load("_lg_fn"), args=args, keywords=keywords)


def _slow_call(signature: inspect.Signature) -> ast.Call:
    """``_lg_slow((positional...) + star, {keyword: value, **kwargs})``."""
    params = list(signature.parameters.values())
    packed: ast.expr = ast.Tuple(elts=[_load(p.name) for p in params if p.kind in _POSITIONAL],
                                 ctx=ast.Load())
    star = next((p.name for p in params if p.kind == _P.VAR_POSITIONAL), None)
    if star:
        packed = ast.BinOp(left=packed, op=ast.Add(), right=_load(star))
    named = [p for p in params if p.kind in (_P.KEYWORD_ONLY, _P.VAR_KEYWORD)]
    mapping = ast.Dict(
        keys=[ast.Constant(p.name) if p.kind == _P.KEYWORD_ONLY else None for p in named],
        values=[_load(p.name) for p in named],
    )
    return ast.Call(func=_load("_lg_slow"), args=[packed, mapping], keywords=[])


# -- the checks -------------------------------------------------------------------------------


class _Checks:
    """The body under construction: statements, where each token's size is, bound dims."""

    def __init__(self, plan: FastPathPlan) -> None:
        self.plan = plan
        self.refs: dict[tuple[str, int], _Ref] = {}
        self.bound: set[str] = set()
        self.pending: list[ast.expr] = []
        self.body: list[ast.stmt] = []

    def to_slow(self) -> ast.Return:
        return ast.Return(value=_slow_call(self.plan.signature))

    def slow_if(self, conditions: Sequence[ast.expr]) -> None:
        if conditions:
            self.body.append(_if(_any(conditions), self.to_slow()))

    def flush(self) -> None:
        """Emit the conditions gathered so far as one ``if ... or ...: return slow``."""
        self.slow_if(self.pending)
        self.pending = []

    def bind(self, name: str, value: ast.expr) -> None:
        self.flush()
        self.body.append(_assign(_store(f"_lg_d_{name}"), value))
        self.bound.add(name)


def _unpack(k: int, arg: str, spec: DimSpec, refs: dict[tuple[str, int], _Ref]) -> tuple[
        ast.stmt, ast.expr | None]:
    """Unpack argument ``arg``'s shape into locals; the rank check still due after the try."""
    n = len(spec.dims)
    shape = _attr(arg, "shape")
    if spec.ellipsis or n == 0:
        for i in range(n):
            refs[(arg, i)] = _Ref(f"_lg_s{k}", spec.axis(i))
        length = ast.Call(func=_load("len"), args=[_load(f"_lg_s{k}")], keywords=[])
        op: ast.cmpop = ast.Lt() if spec.ellipsis else ast.NotEq()
        return _assign(_store(f"_lg_s{k}"), shape), _compare(length, op, ast.Constant(n))
    targets = [f"_lg_{k}_{i}" for i in range(n)]
    for i, target in enumerate(targets):
        refs[(arg, i)] = _Ref(target)
    unpacked = ast.Tuple(elts=[_store(t) for t in targets], ctx=ast.Store())
    return _assign(unpacked, shape), None


def _leave_if(test: ast.expr) -> ast.If:
    # Inside the try, leave it (raise _lg_Slow) rather than call the slow path there: the
    # slow path's ShapeContractError is a ValueError, and the except would run it again.
    return _if(test, ast.Raise(exc=_load("_lg_Slow"), cause=None))


def _dtype_checks(plan: FastPathPlan, arg: str) -> list[ast.stmt]:
    if not plan.check_dtypes:
        return []
    return [_leave_if(_compare(_attr(arg, "dtype"), ast.NotIn(), _load("_lg_dtypes")))]


def _same_dtype_check(plan: FastPathPlan) -> list[ast.stmt]:
    if not plan.same_dtype or len(plan.specs) < 2:
        return []
    first, *rest = plan.specs
    return [_leave_if(_any([_compare(_attr(a, "dtype"), ast.NotEq(), _attr(first, "dtype"))
                            for a in rest]))]


def _read_shapes(checks: _Checks) -> None:
    """``try:`` unpack every shape (and check dtypes) ``except ...: return slow``."""
    plan = checks.plan
    guarded: list[ast.stmt] = []
    rank_checks: list[ast.expr] = []
    for k, (arg, spec) in enumerate(plan.specs.items()):
        unpack, rank_check = _unpack(k, arg, spec, checks.refs)
        guarded += [unpack, *_dtype_checks(plan, arg)]
        rank_checks += [rank_check] if rank_check is not None else []
    guarded += _same_dtype_check(plan)
    # Any error reading a shape (a nested tensor's RuntimeError included) is the slow
    # path's to name: it reports LG004.
    handler = ast.ExceptHandler(type=_load("Exception"), name=None, body=[checks.to_slow()])
    checks.body.append(ast.Try(body=guarded, handlers=[handler], orelse=[], finalbody=[]))
    checks.slow_if(rank_checks)


def _check_sizes(checks: _Checks) -> None:
    """``(_lg_d_a | _lg_d_b | ...) < 0``: every bound dim an int that is not negative, in one
    expression (a float or a string raises TypeError, a negative int makes it negative).
    Every other dim was compared equal to a bound dim or to a literal, so it is one of those
    ints, or (a float such as 16.0) equal to one: metadata only a hand-made object can hold,
    never a tensor."""
    bound = sorted(checks.bound)
    if not bound:
        return
    combined: ast.expr = _load(f"_lg_d_{bound[0]}")
    for name in bound[1:]:
        combined = ast.BinOp(left=combined, op=ast.BitOr(), right=_load(f"_lg_d_{name}"))
    test = _if(_compare(combined, ast.Lt(), ast.Constant(0)), checks.to_slow())
    # TypeError for a float or a string; a jagged tensor's nested int raises AttributeError
    handler = ast.ExceptHandler(type=_load("Exception"), name=None, body=[checks.to_slow()])
    checks.body.append(ast.Try(body=[test], handlers=[handler], orelse=[], finalbody=[]))


def _dim_order(specs: Mapping[str, DimSpec]) -> list[tuple[str, int]]:
    """Every token, plain names first so a multiple is checked against its bound name."""
    items = [(arg, i) for arg, spec in specs.items() for i in range(len(spec.dims))]
    return sorted(items, key=lambda item: specs[item[0]].dims[item[1]].kind == "multiple")


def _check_token(checks: _Checks, dim: Dim, ref: _Ref) -> None:
    bound = dim.name in checks.bound
    size = ref.expr()
    if dim.kind == "literal":
        checks.pending.append(_compare(size, ast.NotEq(), ast.Constant(dim.value)))
    elif dim.kind == "name" and bound:
        checks.pending.append(_compare(size, ast.NotEq(), _load(f"_lg_d_{dim.name}")))
    elif dim.kind == "name":
        checks.bind(dim.name, size)
    elif dim.kind == "multiple" and bound:
        multiple = ast.BinOp(left=ast.Constant(dim.value), op=ast.Mult(),
                             right=_load(f"_lg_d_{dim.name}"))
        checks.pending.append(_compare(size, ast.NotEq(), multiple))
    elif dim.kind == "multiple":
        checks.pending.append(ast.BinOp(left=size, op=ast.Mod(), right=ast.Constant(dim.value)))
        checks.bind(dim.name, ast.BinOp(left=ref.expr(), op=ast.FloorDiv(),
                                        right=ast.Constant(dim.value)))


def _check_dims(checks: _Checks) -> None:
    for arg, i in _dim_order(checks.plan.specs):
        _check_token(checks, checks.plan.specs[arg].dims[i], checks.refs[(arg, i)])
    checks.flush()


def _check_where(checks: _Checks) -> None:
    plan = checks.plan
    if not plan.has_where:
        return
    test = plan.where
    if test is None:  # not a plain expression over its dims: call it with a dict
        names = sorted(checks.bound)
        mapping = ast.Dict(keys=[ast.Constant(n) for n in names],
                           values=[_load(f"_lg_d_{n}") for n in names])
        test = ast.Call(func=_load("_lg_where"), args=[mapping], keywords=[])
    checks.slow_if([ast.UnaryOp(op=ast.Not(), operand=test)])


def _check_frozen(checks: _Checks) -> None:
    """The frozen dims must equal the tuple a successful call stored under ``_lg_key``."""
    plan = checks.plan
    if not plan.frozen:
        return
    lookup: ast.expr
    if plan.owner_param:
        lookup = ast.Call(func=ast.Attribute(value=_attr(plan.owner_param, "__dict__"),
                                             attr="get", ctx=ast.Load()),
                          args=[_load("_lg_key")], keywords=[])
        handler = ast.ExceptHandler(type=_load("AttributeError"), name=None,
                                    body=[checks.to_slow()])
        checks.body.append(ast.Try(body=[_assign(_store("_lg_fz"), lookup)],
                                   handlers=[handler], orelse=[], finalbody=[]))
    else:
        lookup = ast.Call(func=_attr("_lg_calls", "get"), args=[_load("_lg_key")], keywords=[])
        checks.body.append(_assign(_store("_lg_fz"), lookup))
    frozen = ast.Tuple(elts=[_load(f"_lg_d_{d}") for d in plan.frozen], ctx=ast.Load())
    checks.slow_if([_compare(_load("_lg_fz"), ast.NotEq(), frozen)])


def build_fast_path(plan: FastPathPlan) -> ast.Module:
    """A module defining ``plan.name``: the function's signature, then straight-line checks."""
    checks = _Checks(plan)
    forward = ast.Return(value=_forward_call(plan.signature))
    off = ast.BoolOp(op=ast.Or(), values=[
        _attr("_lg_state", "off"), ast.Call(func=_load("_lg_compiling"), args=[], keywords=[])])
    checks.body.append(_if(off, forward))
    for step in (_read_shapes, _check_dims, _check_sizes, _check_where, _check_frozen):
        step(checks)
    checks.body.append(copy.deepcopy(forward))
    # Python 3.12+ also wants the (empty) type parameters spelled out.
    extra: dict[str, Any] = {"type_params": []} if sys.version_info >= (3, 12) else {}
    definition = ast.FunctionDef(name=plan.name, args=_arguments(plan.signature),
                                 body=checks.body, decorator_list=[], returns=None, **extra)
    return ast.fix_missing_locations(ast.Module(body=[definition], type_ignores=[]))


_SERIAL = itertools.count(1)


def compile_fast_path(module: ast.Module, filename: str) -> tuple[CodeType, str]:
    """The module's code and source, the source registered with `linecache` under
    ``filename`` (made unique), as attrs does: a traceback through the guard shows the
    generated lines, and `inspect.getsource` finds them."""
    source = ast.unparse(module) + "\n"
    lines = source.splitlines(True)
    held = linecache.cache.get(filename)
    if held is not None and (len(held) < 3 or held[2] != lines):
        filename = f"{filename[:-1]}-{next(_SERIAL)}>"  # another function of the same name
    # mtime None: linecache.checkcache never drops it (there is no file to compare with).
    linecache.cache[filename] = (len(source), None, lines, filename)
    return compile(source, filename, "exec"), source


# -- inlining ``where=lambda d: ...`` -------------------------------------------------------

# What an inlined ``where`` may contain: arithmetic, comparisons and boolean logic over
# constants and its argument subscripted with constant dim names, nothing that calls or looks
# up a name (so the inlined expression means exactly what the lambda computes).
_INLINE_NODES = (
    ast.Expression, ast.Compare, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.IfExp, ast.Constant,
    ast.Tuple, ast.List, ast.Set, ast.Subscript, ast.Name, ast.Load,
    ast.boolop, ast.operator, ast.unaryop, ast.cmpop,
)


def _is_plain_lambda(where: Callable[..., Any]) -> bool:
    """A one-argument lambda with no defaults and no closure."""
    code = getattr(where, "__code__", None)
    return not (code is None or getattr(where, "__name__", "") != "<lambda>"
                or code.co_argcount != 1 or code.co_kwonlyargcount or code.co_posonlyargcount
                or getattr(where, "__defaults__", None) or getattr(where, "__closure__", None))


def _lambda_node(where: Callable[..., Any]) -> ast.Lambda | None:
    """The lambda's own syntax tree, found in its source file, or None."""
    if not _is_plain_lambda(where):
        return None
    code = where.__code__
    try:
        lines = linecache.getlines(code.co_filename)
        tree = ast.parse("".join(lines)) if lines else None
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if tree is None:
        return None
    found = [node for node in ast.walk(tree) if isinstance(node, ast.Lambda)
             and node.lineno == code.co_firstlineno and _same_lambda(node, code)]
    return found[0] if len(found) == 1 else None


def _same_lambda(node: ast.Lambda, code: Any) -> bool:
    """Whether ``node`` compiles to ``code`` (the lambda found is the one passed)."""
    try:
        compiled = compile(ast.Expression(body=node), code.co_filename, "eval")
    except (SyntaxError, ValueError, TypeError):
        return False
    inner = [c for c in compiled.co_consts if hasattr(c, "co_code")]
    return len(inner) == 1 and inner[0].co_code == code.co_code and \
        inner[0].co_consts == code.co_consts and inner[0].co_names == code.co_names


def _dim_read(node: ast.AST, arg: str, bound: set[str]) -> bool:
    """Whether ``node`` is ``arg["dim"]`` for a bound dim."""
    return (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
            and node.value.id == arg and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str) and node.slice.value in bound)


def _inlinable(body: ast.AST, arg: str, bound: set[str]) -> bool:
    """Only allowed nodes, no other name, and every use of ``arg`` reads a bound dim."""
    nodes: Iterator[ast.AST] = ast.walk(body)
    names = subscripts = 0
    for sub in nodes:
        if not isinstance(sub, _INLINE_NODES):
            return False
        if isinstance(sub, ast.Name) and sub.id != arg:
            return False  # a global or a builtin: keep the lambda's own lookup
        if isinstance(sub, ast.Subscript) and not _dim_read(sub, arg, bound):
            return False
        names += isinstance(sub, ast.Name)
        subscripts += isinstance(sub, ast.Subscript)
    return names == subscripts  # else the argument is used otherwise than subscripted


class _ToLocals(ast.NodeTransformer):
    """``d["dim"]`` -> the wrapper's local ``_lg_d_dim``."""

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        name = str(cast(ast.Constant, node.slice).value)
        return ast.copy_location(_load(f"_lg_d_{name}"), node)


def inline_where(where: Callable[..., Any], bound: set[str]) -> ast.expr | None:
    """The body of a ``lambda d: ...`` over ``d["dim"]`` as an expression over the wrapper's
    dim locals (``_lg_d_dim``), or None when it is anything else (then it is called)."""
    node = _lambda_node(where)
    if node is None:
        return None
    body = ast.Expression(body=copy.deepcopy(node.body))
    if not _inlinable(body, node.args.args[0].arg, bound):
        return None
    return cast(ast.Expression, _ToLocals().visit(body)).body
