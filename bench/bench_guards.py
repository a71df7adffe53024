"""Cost of the runtime guards on their hot paths, side by side in one run.

    python bench/bench_guards.py [--json FILE] [--number N]

Rows (ns per call, median of 7 repeats; most rows time a lambda that makes the call, so they
include the lambda's own call, about 15 ns here, the same for every such row):
- the same two-tensor pool update: plain call; the checks written by hand inline (isinstance,
  ndim, dtype, shape agreement, dims frozen at first call); `@lg.shapes` doing the same
  checks; jaxtyping + beartype doing what it can of them (dims within one call only);
- the README's four-tensor MoE update with where=: by hand vs @lg.shapes;
- a weight-cache lookup of a present key: dict.get, lg.GuardedCache.get, wrapt.ObjectProxy.get,
  each timed as a statement string (``store.get('k7')``, with globals, no lambda around the call,
  which would add the same 15 ns to both sides and hide half the gap), the three interleaved
  repeat by repeat; then the ratio GuardedCache.get / dict.get on its own line, beside its
  target (<= 1.5x);
- the pinned-weight get-or-create with @lg.guard_cache_lookup vs unguarded;
- LayoutRegistry.admit of one MoE adapter's weights (metadata only).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import timeit
from collections.abc import Callable
from typing import Any

import torch
import wrapt

import lora_guard as lg

REPEATS = 7


def measure(stmt: Callable[[], Any], number: int) -> float:
    times = timeit.repeat(stmt, number=number, repeat=REPEATS)
    return statistics.median(times) / number * 1e9


def measure_statements(stmts: dict[str, str], env: dict[str, Any], number: int) -> dict[str, float]:
    """ns per execution of each statement (a string, timed as is: no call around it), the
    statements interleaved repeat by repeat so that a busy spell of the machine hits them all."""
    timers = {name: timeit.Timer(stmt, globals=env) for name, stmt in stmts.items()}
    times: dict[str, list[float]] = {name: [] for name in stmts}
    for _ in range(REPEATS):
        for name, timer in timers.items():
            times[name].append(timer.timeit(number))
    return {name: statistics.median(t) / number * 1e9 for name, t in times.items()}


CACHE_TARGET = 1.5  # issue 18: GuardedCache.get of a present key at most 1.5x dict.get


class PlainPool:
    def set_lora_info(self, a: torch.Tensor, b: torch.Tensor) -> None:
        pass


class HandCheckedPool:
    """What engines write today, done thoroughly: one tuple of frozen dims per instance."""

    def __init__(self) -> None:
        self._frozen: tuple[int, int] | None = None

    def set_lora_info(self, a: torch.Tensor, b: torch.Tensor) -> None:
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            raise TypeError("a and b must be tensors")
        if a.ndim != 3 or b.ndim != 3:
            raise ValueError("a and b must be 3D")
        if a.dtype != b.dtype:
            raise ValueError("dtype mismatch")
        sa, sb = a.shape, b.shape
        if sa[0] != sb[0] or sa[1] != sb[2] or sa[2] != sb[1]:
            raise ValueError("shape mismatch")
        if self._frozen is None:
            self._frozen = (sa[0], sa[1])
        elif self._frozen != (sa[0], sa[1]):
            raise RuntimeError("pool shape changed")


class GuardedPool:
    @lg.shapes(a="slots rank hidden", b="slots hidden rank", frozen=("slots", "rank"),
               same_dtype=True)
    def set_lora_info(self, a: torch.Tensor, b: torch.Tensor) -> None:
        pass


class HandCheckedSink:
    """The README's four-tensor MoE pool update with its where= check, written by hand."""

    def __init__(self) -> None:
        self._frozen: tuple[int, int, int, int] | None = None

    def set_lora_info(self, gate_up_a: torch.Tensor, gate_up_b: torch.Tensor,
                      down_a: torch.Tensor, down_b: torch.Tensor) -> None:
        for t in (gate_up_a, gate_up_b, down_a, down_b):
            if not isinstance(t, torch.Tensor) or t.ndim != 4:
                raise ValueError("4D tensors expected")
        slots, outer, r2, hidden = gate_up_a.shape
        s1, n, f2, rank = gate_up_b.shape
        s2, n2, rank2, f = down_a.shape
        s3, outer2, hidden2, rank3 = down_b.shape
        if (s1 != slots or s2 != slots or s3 != slots or n2 != n or rank2 != rank
                or rank3 != rank or outer2 != outer or hidden2 != hidden or r2 != 2 * rank
                or f2 != 2 * f):
            raise ValueError("shape mismatch")
        if outer not in (1, n):
            raise ValueError("outer must be 1 or n")
        if self._frozen is None:
            self._frozen = (slots, n, f, rank)
        elif self._frozen != (slots, n, f, rank):
            raise RuntimeError("pool shape changed")


class GuardedSink:
    @lg.shapes(
        gate_up_a="slots outer 2*rank hidden",
        gate_up_b="slots n 2*f rank",
        down_a="slots n rank f",
        down_b="slots outer hidden rank",
        where=lambda d: d["outer"] in (1, d["n"]),
        frozen=("slots", "n", "f", "rank"),
    )
    def set_lora_info(self, gate_up_a: torch.Tensor, gate_up_b: torch.Tensor,
                      down_a: torch.Tensor, down_b: torch.Tensor) -> None:
        pass


def jaxtyping_pool() -> Any:
    try:
        from beartype import beartype
        from jaxtyping import Float, jaxtyped
    except ImportError:
        return None

    class JaxPool:
        @jaxtyped(typechecker=beartype)
        def set_lora_info(
            self, a: Float[torch.Tensor, "s r h"], b: Float[torch.Tensor, "s h r"]
        ) -> None:
            pass

    return JaxPool()


def moe_weights() -> dict[str, tuple[int, ...]]:
    weights = {}
    for layer in range(48):
        p = f"base_model.model.model.layers.{layer}.mlp.experts"
        weights[f"{p}.gate_up_proj.lora_A"] = (1, 32, 2048)
        weights[f"{p}.gate_up_proj.lora_B"] = (64, 1536, 16)
        weights[f"{p}.down_proj.lora_A"] = (64, 16, 768)
        weights[f"{p}.down_proj.lora_B"] = (1, 2048, 16)
    return weights


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--number", type=int, default=200_000, help="calls per repeat")
    args = parser.parse_args()
    n = args.number

    a, b = torch.empty(8, 16, 4096, device="meta"), torch.empty(8, 4096, 16, device="meta")
    rows: list[dict[str, Any]] = []

    def row(group: str, name: str, stmt: Callable[[], Any], number: int = n) -> None:
        ns = measure(stmt, number)
        rows.append({"group": group, "name": name, "ns_per_call": round(ns, 1)})
        print(f"{group:<22} {name:<44} {ns:>10.0f} ns", flush=True)

    plain, hand, guarded = PlainPool(), HandCheckedPool(), GuardedPool()
    guarded.set_lora_info(a, b)
    hand.set_lora_info(a, b)
    row("pool update (2 tensors)", "plain call, no check", lambda: plain.set_lora_info(a, b))
    row("pool update (2 tensors)", "hand-written checks inline",
        lambda: hand.set_lora_info(a, b))
    row("pool update (2 tensors)", "@lg.shapes (same checks + frozen dims)",
        lambda: guarded.set_lora_info(a, b))
    jax = jaxtyping_pool()
    if jax is not None:
        ca, cb = torch.empty(8, 16, 64), torch.empty(8, 64, 16)
        row("pool update (2 tensors)", "jaxtyping + beartype (one call only)",
            lambda: jax.set_lora_info(ca, cb), number=max(n // 20, 1000))
    lg.configure(mode="off")  # decorate while off: the decorator returns the plain function

    class OffPool:
        @lg.shapes(a="slots rank hidden", b="slots hidden rank", frozen=("slots", "rank"))
        def set_lora_info(self, a: torch.Tensor, b: torch.Tensor) -> None:
            pass

    lg.configure(mode="raise")
    off_guarded = OffPool()
    row("pool update (2 tensors)", "@lg.shapes applied in mode 'off'",
        lambda: off_guarded.set_lora_info(a, b))

    moe = (torch.empty(8, 1, 32, 2048, device="meta"), torch.empty(8, 64, 1536, 16, device="meta"),
           torch.empty(8, 64, 16, 768, device="meta"), torch.empty(8, 1, 2048, 16, device="meta"))
    hand_sink, guarded_sink = HandCheckedSink(), GuardedSink()
    hand_sink.set_lora_info(*moe)
    guarded_sink.set_lora_info(*moe)
    row("README MoE update (4)", "hand-written checks inline (+ where)",
        lambda: hand_sink.set_lora_info(*moe))
    row("README MoE update (4)", "@lg.shapes with where= (compiled inline)",
        lambda: guarded_sink.set_lora_info(*moe))

    store: dict[str, torch.Tensor] = {f"k{i}": a for i in range(64)}
    env = {"store": store, "guarded_store": lg.GuardedCache(dict(store)),
           "proxy": wrapt.ObjectProxy(dict(store))}
    lookups = measure_statements({
        "dict.get": "store.get('k7')",
        "lg.GuardedCache.get": "guarded_store.get('k7')",
        "wrapt.ObjectProxy.get": "proxy.get('k7')",
    }, env, n)
    for name, ns in lookups.items():
        rows.append({"group": "cache lookup", "name": name, "ns_per_call": round(ns, 1)})
        print(f"{'cache lookup':<22} {name:<44} {ns:>10.1f} ns", flush=True)
    cache_ratio = lookups["lg.GuardedCache.get"] / lookups["dict.get"]
    print(f"{'cache lookup':<22} {'ratio lg.GuardedCache.get / dict.get':<44} "
          f"{cache_ratio:>10.2f} x   target <= {CACHE_TARGET}x: "
          f"{'met' if cache_ratio <= CACHE_TARGET else 'NOT met'}", flush=True)

    def get_or_create(pinned_weight_store: dict[str, Any], cache_key: str,
                      weight: torch.Tensor) -> torch.Tensor:
        cached = pinned_weight_store.get(cache_key)
        if cached is None:
            cached = pinned_weight_store[cache_key] = weight
        return cached

    guarded_get = lg.guard_cache_lookup(store="pinned_weight_store", key="cache_key",
                                        weight="weight")(get_or_create)
    row("pinned-weight lookup", "unguarded get-or-create",
        lambda: get_or_create(store, "k7", a))
    row("pinned-weight lookup", "@lg.guard_cache_lookup",
        lambda: guarded_get(store, "k7", a))

    weights = moe_weights()
    registry = lg.LayoutRegistry()
    row("MoE admission", f"LayoutRegistry.admit ({len(weights)} weights)",
        lambda: registry.admit("math", weights), number=max(n // 1000, 50))

    meta = {"python": sys.version.split()[0], "torch": torch.__version__,
            "machine": platform.machine(), "number": n, "repeats": REPEATS}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"meta": meta, "rows": rows,
                       "ratios": {"GuardedCache.get / dict.get": round(cache_ratio, 3)}},
                      fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
