"""A server loads, unloads and hits its caches from many threads at once: the guards must lose
no update, never deadlock, and hold their invariant at every step.

Each test runs 8 threads released together by a barrier; a worker's failure is collected and
re-raised in the test, and every join has a deadline, so a deadlock fails instead of hanging.
Stores that yield the GIL inside ``get`` widen the windows a real server hits by chance.
"""

from __future__ import annotations

import random
import threading
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import pytest
import torch

import lora_guard as lg

# These tests provoke violations on purpose: under `pytest --lora-guard` they are expected.
pytestmark = pytest.mark.lora_guard(allow=tuple(lg.INVARIANTS))

THREADS = 8
OPS = 1_000  # per thread


def run_threads(work: Callable[[int], None], n: int = THREADS) -> None:
    """Run ``work(t)`` in ``n`` threads started together; re-raise the first failure."""
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def target(t: int) -> None:
        try:
            barrier.wait()
            work(t)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(t,), daemon=True) for t in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads), "deadlock: a worker never finished"
    if errors:
        raise errors[0]


def meta(*shape: int) -> torch.Tensor:
    return torch.empty(shape, device="meta", dtype=torch.bfloat16)


def moe_adapter(layout: lg.MoELayout | None) -> dict[str, tuple[int, ...]]:
    p = "base_model.model.model.layers.0.mlp.experts"
    if layout is None:
        return {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": (8, 64)}
    outer = 1 if layout is lg.MoELayout.SHARED_OUTER else 4
    return {f"{p}.gate_up_proj.lora_A": (outer, 16, 64), f"{p}.gate_up_proj.lora_B": (4, 256, 8),
            f"{p}.down_proj.lora_A": (4, 8, 128), f"{p}.down_proj.lora_B": (outer, 64, 8)}


LAYOUTS = (lg.MoELayout.SHARED_OUTER, lg.MoELayout.PER_EXPERT, None)


# --- LayoutRegistry behind @guard_adapter_load ---------------------------------------------


class _LayoutMonitor:
    """A thread that reads the registry's pool over and over while the workers change it, and
    records any moment at which the pool holds two MoE layouts."""

    def __init__(self, registry: lg.LayoutRegistry) -> None:
        self.registry = registry
        self.snapshots = 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        try:
            while not self._stop.is_set():
                layouts = {lay for lay in self.registry.adapters.values() if lay is not None}
                assert len(layouts) <= 1, f"the pool holds {layouts}"
                self.snapshots += 1
        except BaseException as exc:
            self.errors.append(exc)

    def __enter__(self) -> _LayoutMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _try_load(load: Callable[..., None], registry: lg.LayoutRegistry, name: str,
              layout: lg.MoELayout | None, *, fail: bool) -> str:
    """Load one adapter; return what happened to it: "loaded", "failed" or "refused"."""
    try:
        load(name, moe_adapter(layout), fail=fail)
    except OSError:
        assert name not in registry  # a failed load leaves no admission behind
        return "failed"
    except lg.MixedMoELayoutError as err:
        assert err.code == "LG002"
        assert err.details["layout"] == layout.value  # type: ignore[union-attr]
        assert err.details["pool_layout"] != err.details["layout"]
        assert name not in registry
        return "refused"
    return "loaded"


def test_eight_threads_loading_and_unloading_a_thousand_adapters_each() -> None:
    """8 x 1,000 loads of random layouts, some failing in the loader, with unloads in between:
    a monitor sees one MoE layout at every moment, and every count adds up at the end."""
    registry = lg.LayoutRegistry()
    loaded: dict[str, lg.MoELayout | None] = {}  # what the server's own bookkeeping holds
    book = threading.Lock()
    outcomes: Counter[str] = Counter()

    @lg.guard_adapter_load(registry, adapter_id="name", weights="weights")
    def load(name: str, weights: dict[str, tuple[int, ...]], *, fail: bool) -> None:
        if fail:
            raise OSError(f"{name}: upload truncated")  # the registry must forget it again
        with book:
            loaded[name] = lg.detect_moe_layout(weights)

    def unload(name: str) -> None:
        with book:
            del loaded[name]
        registry.release(name)

    def work(t: int) -> None:
        rnd = random.Random(t)
        mine: list[str] = []
        counts: Counter[str] = Counter()
        for i in range(OPS):
            layout = rnd.choice(LAYOUTS)
            name = f"t{t}-{i}"
            outcome = _try_load(load, registry, name, layout, fail=rnd.random() < 0.1)
            counts[outcome] += 1
            if outcome != "loaded":
                continue
            mine.append(name)
            if rnd.random() < 0.6:  # unload one of ours, so the pool's layout can change
                unload(mine.pop(rnd.randrange(len(mine))))
                counts["unloaded"] += 1
        with book:
            outcomes.update(counts)

    with _LayoutMonitor(registry) as monitor, lg.recording() as rec:
        run_threads(work)
    assert not monitor.errors, monitor.errors[0]
    assert monitor.snapshots > 0
    assert sum(outcomes[k] for k in ("loaded", "failed", "refused")) == THREADS * OPS
    assert rec.codes == ["LG002"] * outcomes["refused"]  # one violation per refusal
    assert registry.adapters == loaded  # no lost update, no stale admission
    assert len(registry) == outcomes["loaded"] - outcomes["unloaded"]


def test_two_layouts_racing_into_an_empty_pool_one_wins_the_other_gets_lg002() -> None:
    rounds = 100
    winners: Counter[str] = Counter()
    for _ in range(rounds):
        registry = lg.LayoutRegistry()
        results: dict[int, Any] = {}

        def work(t: int, registry: lg.LayoutRegistry = registry,
                 results: dict[int, Any] = results) -> None:
            layout = LAYOUTS[t]
            try:
                results[t] = registry.admit(f"adapter-{t}", moe_adapter(layout))
            except lg.MixedMoELayoutError as err:
                results[t] = err

        run_threads(work, n=2)
        errors = [r for r in results.values() if isinstance(r, lg.MixedMoELayoutError)]
        assert len(errors) == 1  # exactly one loser, every round
        winner = next(t for t, r in results.items() if not isinstance(r, BaseException))
        assert errors[0].details["owner"] == f"adapter-{winner}"
        assert registry.adapters == {f"adapter-{winner}": LAYOUTS[winner]}
        winners[str(winner)] += 1
    assert sum(winners.values()) == rounds


# --- GuardedCache and guard_cache_lookup ----------------------------------------------------


class YieldingStore(dict):  # type: ignore[type-arg]
    """A dict whose reads give the GIL away, and which remembers every shape stored per key."""

    def __init__(self) -> None:
        super().__init__()
        self.history: defaultdict[Any, list[tuple[int, ...]]] = defaultdict(list)

    def get(self, key: Any, default: Any = None) -> Any:
        value = super().get(key, default)
        time.sleep(0)  # another thread runs between the read and whatever follows it
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        time.sleep(0)
        super().__setitem__(key, value)
        self.history[key].append(tuple(value.shape))


def test_a_guarded_cache_never_holds_two_shapes_under_one_key() -> None:
    """8 threads x 1,000 stores of rank-16 and rank-8 weights under 16 shared keys."""
    store = YieldingStore()
    cache = lg.GuardedCache(store)
    weights = {16: meta(48, 64), 8: meta(24, 64)}
    tally: Counter[str] = Counter()
    lock = threading.Lock()

    def work(t: int) -> None:
        rnd = random.Random(100 + t)
        counts: Counter[str] = Counter()
        for _ in range(OPS):
            key = f"layers.{rnd.randrange(16)}.qkv_proj.lora_A#tp0"
            weight = weights[rnd.choice((16, 8))]
            try:
                if rnd.random() < 0.5:
                    cache[key] = weight
                else:
                    assert cache.setdefault(key, weight).shape == weight.shape
                counts["stored"] += 1
            except lg.CacheKeyCollisionError as err:
                assert err.code == "LG003"
                assert cache[key].shape != weight.shape  # refused: the entry is untouched
                counts["refused"] += 1
        with lock:
            tally.update(counts)

    run_threads(work)
    assert tally["stored"] + tally["refused"] == THREADS * OPS
    for key, shapes in store.history.items():
        assert len(set(shapes)) == 1, f"{key} held {sorted(set(shapes))}"


def test_a_guarded_lookup_never_returns_a_tensor_of_another_shape() -> None:
    """sglang's get-or-pin lookup from 8 threads: each call gets a tensor of the shape it asked
    for, or LG003; never the other adapter's stale tensor."""

    class Pool:
        def __init__(self) -> None:
            self.pinned_weight_store = YieldingStore()

        @lg.guard_cache_lookup(store="pinned_weight_store", key="cache_key", weight="weight")
        def _get_maybe_cached_weight_for_transfer(
            self, pinned_weight_store: dict[str, torch.Tensor], cache_key: str,
            weight: torch.Tensor,
        ) -> torch.Tensor:
            cached = pinned_weight_store.get(cache_key)
            if cached is None:
                pinned_weight_store[cache_key] = cached = weight
            return cached

    pool = Pool()
    weights = {16: meta(48, 64), 8: meta(24, 64)}
    tally: Counter[str] = Counter()
    lock = threading.Lock()

    def work(t: int) -> None:
        rnd = random.Random(200 + t)
        counts: Counter[str] = Counter()
        for _ in range(OPS // 4):
            key = f"layers.{rnd.randrange(4)}.qkv_proj.lora_A#tp0"
            weight = weights[rnd.choice((16, 8))]
            try:
                got = pool._get_maybe_cached_weight_for_transfer(
                    pool.pinned_weight_store, key, weight)
            except lg.CacheKeyCollisionError:
                counts["refused"] += 1
                continue
            assert got.shape == weight.shape, "a stale tensor of another shape was served"
            counts["served"] += 1
        with lock:
            tally.update(counts)

    run_threads(work)
    assert tally["served"] + tally["refused"] == THREADS * OPS // 4
    assert tally["refused"] > 0


# --- @shapes frozen dims --------------------------------------------------------------------


def test_first_calls_racing_on_a_fresh_pool_freeze_one_rank_and_refuse_the_other() -> None:
    class Pool:
        def __init__(self) -> None:
            self.ranks_allocated: list[int] = []
            self.lock = threading.Lock()

        @lg.shapes(a="slots 3*rank hidden", b="slots out rank", frozen=("slots", "rank"))
        def set_lora_info(self, a: torch.Tensor, b: torch.Tensor) -> None:
            with self.lock:
                self.ranks_allocated.append(b.shape[-1])

    args = {r: (meta(4, 3 * r, 64), meta(4, 128, r)) for r in (16, 8)}
    for round_ in range(20):
        pool = Pool()
        refused: Counter[int] = Counter()
        lock = threading.Lock()

        def work(t: int, pool: Pool = pool, refused: Counter[int] = refused,
                 lock: threading.Lock = lock, round_: int = round_) -> None:
            rank = (16, 8)[(t + round_) % 2]
            for _ in range(OPS // 10):
                try:
                    pool.set_lora_info(*args[rank])
                except lg.PoolShapeDriftError as err:
                    assert (err.details["dim"], err.details["new"]) == ("rank", rank)
                    with lock:
                        refused[rank] += 1

        run_threads(work)
        frozen = lg.frozen_dims(pool)
        assert set(pool.ranks_allocated) == {frozen["rank"]}  # the body never saw the other
        other = 8 if frozen["rank"] == 16 else 16
        assert refused == Counter({other: THREADS // 2 * OPS // 10})
        assert len(pool.ranks_allocated) == THREADS // 2 * OPS // 10


# --- recording() ----------------------------------------------------------------------------


def test_recordings_opened_and_closed_in_threads_lose_nothing() -> None:
    """8 threads x 1,000 violations while each thread opens and closes its own recordings:
    the outer recording sees every one, each inner one at least its own thread's."""
    lg.configure(mode="record")
    inner_counts: list[tuple[int, int]] = []
    lock = threading.Lock()

    def work(t: int) -> None:
        for block in range(10):
            with lg.recording() as mine:
                for i in range(OPS // 10):
                    # one LG201 each
                    lg.assert_slot_maps_consistent({f"t{t}-{block}-{i}": 5}, [None])
            own = sum(1 for v in mine.violations if v.subject == "slot map"
                      and f"'t{t}-{block}-" in v.message)
            with lock:
                inner_counts.append((own, len(mine)))

    with lg.recording() as outer:
        run_threads(work)
    assert len(outer) == THREADS * OPS
    assert outer.codes == ["LG201"] * THREADS * OPS
    assert len({v.message for v in outer.violations}) == THREADS * OPS  # none twice
    assert all(own == OPS // 10 and total >= own for own, total in inner_counts)


@pytest.mark.parametrize("mode", ["raise", "warn"])
def test_a_recording_sees_violations_raised_in_other_threads(mode: str) -> None:
    """In raise mode the server swallows each LG003; in warn mode it proceeds, so the key
    flips between two shapes and every flip is one violation. The recording sees them all."""
    lg.configure(mode=mode)  # type: ignore[arg-type]
    cache = lg.GuardedCache({"k": meta(16, 64)})

    def work(t: int) -> None:
        for i in range(100):
            try:
                cache["k"] = meta(8 if (t + i) % 2 else 16, 64)
            except lg.CacheKeyCollisionError:
                pass  # swallowed by the server: the recording still saw it

    with warnings.catch_warnings(record=True) as caught, lg.recording() as rec:
        warnings.simplefilter("always")
        run_threads(work)
    assert rec.codes == ["LG003"] * len(rec)
    if mode == "raise":
        assert len(rec) == THREADS * 100 // 2  # every rank-8 store, none of the rank-16 ones
        assert cache["k"].shape == (16, 64)
    else:
        assert len(rec) > 0
        assert [str(w.message) for w in caught] == [str(v) for v in rec.violations]


def test_the_reliability_page_quotes_these_counts() -> None:
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "reliability.md").read_text("utf-8")
    assert f"{THREADS} x {OPS:,} loads" in page
    assert f"{THREADS} x {OPS:,} stores" in page
    assert f"{THREADS} x {OPS // 4} get-or-pin lookups" in page
    assert f"{THREADS} x {OPS:,} violations" in page
