"""Properties of the dim grammar: any consistent assignment passes, any single changed dim that
the specs constrain is caught with the right code, and the generated fast path agrees with the
reference interpreter on arbitrary shapes."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lora_guard as lg
from lora_guard._checking.dims import bind_dims, parse_spec

NAMES = ("slots", "rank", "hidden", "n")


@dataclass(frozen=True)
class Token:
    kind: str  # name | literal | any | multiple
    name: str = ""
    value: int = 0

    def text(self, flip: bool) -> str:
        if self.kind == "name":
            return self.name
        if self.kind == "literal":
            return str(self.value)
        if self.kind == "any":
            return "_"
        return f"{self.name}*{self.value}" if flip else f"{self.value}*{self.name}"


tokens = st.one_of(
    st.builds(Token, st.just("name"), st.sampled_from(NAMES)),
    st.builds(Token, st.just("literal"), st.just(""), st.integers(1, 4)),
    st.just(Token("any")),
    st.builds(Token, st.just("multiple"), st.sampled_from(NAMES), st.integers(2, 3)),
)


@dataclass
class Case:
    specs: list[tuple[bool, list[Token]]]  # (leading '...', tokens) per argument
    flips: list[bool]
    assignment: dict[str, int]
    leading: list[list[int]]
    free: list[list[int]]

    def spec_texts(self) -> dict[str, str]:
        out = {}
        for k, (ellipsis, toks) in enumerate(self.specs):
            body = " ".join(t.text(self.flips[k]) for t in toks)
            out[f"x{k}"] = ("... " + body if ellipsis else body).strip()
        return out

    def shape(self, k: int, assignment: dict[str, int] | None = None) -> list[int]:
        values = assignment or self.assignment
        ellipsis, toks = self.specs[k]
        dims = []
        for i, t in enumerate(toks):
            if t.kind == "name":
                dims.append(values[t.name])
            elif t.kind == "literal":
                dims.append(t.value)
            elif t.kind == "any":
                dims.append(self.free[k][i])
            else:
                dims.append(t.value * values[t.name])
        return (self.leading[k] if ellipsis else []) + dims

    def occurrences(self) -> Counter[str]:
        return Counter(t.name for _, toks in self.specs for t in toks if t.name)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    n_args = draw(st.integers(1, 3))
    specs = [(draw(st.booleans()), draw(st.lists(tokens, min_size=0, max_size=4)))
             for _ in range(n_args)]
    return Case(
        specs=specs,
        flips=[draw(st.booleans()) for _ in range(n_args)],
        assignment={n: draw(st.integers(1, 6)) for n in NAMES},
        leading=[draw(st.lists(st.integers(1, 3), max_size=2)) for _ in range(n_args)],
        free=[[draw(st.integers(1, 5)) for _ in range(4)] for _ in range(n_args)],
    )


def guarded(case: Case, **options: Any) -> Any:
    specs = case.spec_texts()
    params = ", ".join(specs)
    namespace: dict[str, Any] = {}
    exec(f"def target({params}):\n    return 'ran'\n", namespace)
    return lg.shapes(specs, **options)(namespace["target"])


def meta(shape: list[int]) -> torch.Tensor:
    return torch.empty(shape, device="meta")


@settings(max_examples=300, deadline=None)
@given(cases())
def test_any_consistent_assignment_passes(case: Case) -> None:
    fn = guarded(case)
    args = [meta(case.shape(k)) for k in range(len(case.specs))]
    assert fn(*args) == "ran"
    parsed = {a: parse_spec(t) for a, t in case.spec_texts().items()}
    _, _, violations = bind_dims("t", parsed, dict(zip(parsed, args, strict=True)))
    assert violations == []


@settings(max_examples=300, deadline=None)
@given(cases(), st.data())
def test_a_single_changed_dim_is_caught_when_the_specs_constrain_it(
    case: Case, data: st.DataObject
) -> None:
    candidates = [(k, i) for k, (_, toks) in enumerate(case.specs) for i in range(len(toks))]
    if not candidates:
        return
    k, i = data.draw(st.sampled_from(candidates))
    ellipsis, toks = case.specs[k]
    token = toks[i]
    shape = case.shape(k)
    axis = len(case.leading[k]) + i if ellipsis else i
    delta = data.draw(st.integers(1, 3))
    shape[axis] += delta

    counts = case.occurrences()
    if token.kind == "literal":
        caught = True
    elif token.kind == "any":
        caught = False
    elif token.kind == "name":
        caught = counts[token.name] > 1
    else:  # a multiple: the new size must still divide, and agree with other occurrences
        caught = counts[token.name] > 1 or shape[axis] % token.value != 0

    fn = guarded(case)
    args = [meta(case.shape(j)) if j != k else meta(shape) for j in range(len(case.specs))]
    if caught:
        with pytest.raises(lg.ShapeContractError) as info:
            fn(*args)
        assert info.value.code == "LG004"
        # The message names an argument: the changed one, or the one it disagrees with.
        assert "argument 'x" in str(info.value)
    else:
        assert fn(*args) == "ran"


@settings(max_examples=200, deadline=None)
@given(cases(), st.sampled_from(NAMES), st.integers(1, 3))
def test_a_changed_frozen_dim_is_caught_on_a_later_call(
    case: Case, name: str, delta: int
) -> None:
    bound = set(case.occurrences())
    if not bound:
        return
    fn = guarded(case, frozen=tuple(sorted(bound)))
    fn(*[meta(case.shape(k)) for k in range(len(case.specs))])
    changed = {**case.assignment, name: case.assignment[name] + delta}
    args = [meta(case.shape(k, changed)) for k in range(len(case.specs))]
    if name in bound:
        with pytest.raises(lg.PoolShapeDriftError) as info:
            fn(*args)
        assert info.value.details["dim"] == name
        assert info.value.details["old"] == case.assignment[name]
        assert info.value.details["new"] == changed[name]
    else:
        assert fn(*args) == "ran"


@settings(max_examples=400, deadline=None)
@given(cases(), st.data())
def test_the_generated_fast_path_agrees_with_the_interpreter(
    case: Case, data: st.DataObject
) -> None:
    shapes = [
        data.draw(st.lists(st.integers(0, 4), min_size=max(0, len(toks) - 1),
                           max_size=len(toks) + 2))
        for _, toks in case.specs
    ]
    args = [meta(s) for s in shapes]
    parsed = {a: parse_spec(t) for a, t in case.spec_texts().items()}
    _, _, violations = bind_dims("t", parsed, dict(zip(parsed, args, strict=True)))
    fn = guarded(case)
    if violations:
        with pytest.raises(lg.ShapeContractError):
            fn(*args)
    else:
        assert fn(*args) == "ran"
