"""Operation-count budgets of the checker: counts, not timings, so they hold on a loaded machine.
Prints each count beside its budget; exits 1 when one is over.

    python bench/bench_operations.py

These were tests that pinned the reader's and the checker's caches (patched private functions
counting calls, object identity); as budgets they say what the design promises (work per
adapter, work per recipe) without fixing how a cache is built, so the caches can be redesigned.

1. file-system calls per adapter of a searched folder of 40 adapters (open, fstat, stat,
   lstat, access, scandir, readlink): the folder opened once, its two files opened and
   fstat-ed through it, one lookup that finds no added_tokens.json, the search's share;
2. module comparisons (LG102, A against B and the config) of a fleet of 60 adapters copied
   from 3 recipes (byte-identical config and header): once per recipe's module, not once
   per adapter;
3. tensor records of a fleet of one recipe: the second adapter's records are the first's;
4. validations per entry of a first read of a valid 280-tensor header: one (one validator
   decides and names the problem; no second pass).
"""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def _patched(owner: Any, name: str, wrapper: Callable[[Any], Any]) -> Iterator[None]:
    real = getattr(owner, name)
    setattr(owner, name, wrapper(real))
    try:
        yield
    finally:
        setattr(owner, name, real)


def _counting(calls: dict[str, int], name: str) -> Callable[[Any], Any]:
    def wrap(real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] = calls.get(name, 0) + 1
            return real(*args, **kwargs)
        return call
    return wrap


def file_system_calls(root: pathlib.Path) -> float:
    import lora_guard as lg
    from lora_guard.testing import write_adapter

    for i in range(40):
        write_adapter(root / "set" / f"a{i:02d}")
    calls: dict[str, int] = {}
    names = ("stat", "lstat", "access", "open", "fstat", "scandir", "readlink")
    with _all_patched(os, names, calls):
        report = lg.check_adapters(root / "set")
    assert report.ok
    assert len(report.ids) == 40
    return sum(calls.values()) / 40


@contextmanager
def _all_patched(owner: Any, names: tuple[str, ...], calls: dict[str, int]) -> Iterator[None]:
    reals = {n: getattr(owner, n) for n in names}
    for n in names:
        setattr(owner, n, _counting(calls, n)(reals[n]))
    try:
        yield
    finally:
        for n, real in reals.items():
            setattr(owner, n, real)


def module_comparisons(root: pathlib.Path) -> int:
    import lora_guard as lg
    from lora_guard._checking import registry
    from lora_guard._checking.rules import context
    from lora_guard.testing import write_adapter

    recipes: dict[str, dict[str, Any]] = {
        "plain": {}, "config-rank": {"defects": ("config-rank",)}, "wide": {"rank": 64}}
    for i in range(20):  # (a config that differs by a byte, a run's name, is its own recipe)
        for recipe, options in recipes.items():
            write_adapter(root / "fleet" / f"{recipe}-{i:02d}", **options)
    calls: dict[str, int] = {}
    real, sees_empty = registry._MODULE_RULES["LG102"]  # LG102's look at one module
    registry._MODULE_RULES["LG102"] = (_counting(calls, "compared")(real), sees_empty)
    context._RULES.clear()  # the module pass reads the rules again
    try:
        report = lg.check_adapters(root / "fleet", lg.ServingLimits(max_rank=16))
    finally:
        registry._MODULE_RULES["LG102"] = (real, sees_empty)
        context._RULES.clear()
    for adapter_id in report.ids:  # and every adapter still has its own verdict
        codes = [v.code for v in report.by_adapter.get(adapter_id, ())]
        recipe = pathlib.Path(adapter_id).name.rsplit("-", 1)[0]
        assert codes == {"plain": [], "config-rank": ["LG102"], "wide": ["LG101"]}[recipe]
    return calls.get("compared", 0)


def unshared_records(root: pathlib.Path) -> int:
    import lora_guard as lg
    from lora_guard.testing import write_adapter

    first = lg.inspect_adapter(write_adapter(root / "a", rank=8))
    second = lg.inspect_adapter(write_adapter(root / "b", rank=8))
    assert first.tensors == second.tensors
    return sum(1 for k in first.tensors if first.tensors[k] is not second.tensors[k])


def validations_per_entry(root: pathlib.Path) -> float:
    import lora_guard as lg
    from lora_guard._reading import safetensors
    from lora_guard.testing import write_adapter

    folder = write_adapter(root / "wide", rank=16, dtype="bfloat16", targets=(
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        layers=20)
    calls: dict[str, int] = {}
    with _patched(safetensors, "tensor_info", _counting(calls, "validated")):
        spec = lg.inspect_adapter(folder)
    assert len(spec.tensors) == 280, len(spec.tensors)
    return calls.get("validated", 0) / len(spec.tensors)


BUDGETS: list[tuple[str, Callable[[pathlib.Path], float], float]] = [
    ("file-system calls per adapter (searched folder)", file_system_calls, 7.5),
    ("module comparisons, 60 adapters of 3 recipes", module_comparisons, 3 * 4),
    ("tensor records not shared, two adapters of one recipe", unshared_records, 0),
    ("validations per entry, first read of 280", validations_per_entry, 1),
]


def main() -> int:
    over = 0
    for name, measure, budget in BUDGETS:
        with tempfile.TemporaryDirectory() as tmp:
            count = measure(pathlib.Path(tmp))
        status = "ok" if count <= budget else "OVER"
        over += status == "OVER"
        print(f"{name:56s} {count:8.2f}  budget {budget:6.2f}  {status}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
