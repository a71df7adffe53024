"""Hostile round 3 (issue 27), the guards: races forced with barriers, odd shapes, memory
held for the life of the process, keys that collide by construction.

Each attack is built as the field would hit it: the seed's own lookup, pool or loader, two or
more threads released together, an interleaving forced with events where a race window is
narrow. Every wait has a deadline (a deadlock fails, never hangs), the loops are bounded, and
the objects made are small (meta tensors or metadata). `docs/reliability.md` (Hostile round 3:
the guards) quotes the counts; `test_the_reliability_page_quotes_these_attacks` keeps it so.
"""

from __future__ import annotations

import copy
import gc
import linecache
import pickle
import threading
import traceback
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch

import lora_guard as lg

DEADLINE = 60  # seconds any wait may last before the attack counts as a deadlock
LOOKUPS = 5_000  # per thread, as in the issue


def in_threads(*works: Callable[[], Any]) -> list[Any]:
    """Run each work in its own thread, released together; re-raise the first failure."""
    barrier = threading.Barrier(len(works), timeout=DEADLINE)
    results: list[Any] = [None] * len(works)
    errors: list[BaseException] = []

    def target(i: int) -> None:
        try:
            barrier.wait()
            results[i] = works[i]()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(i,), daemon=True)
               for i in range(len(works))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=DEADLINE)
    assert not any(th.is_alive() for th in threads), "deadlock: a thread never finished"
    if errors:
        raise errors[0]
    return results


def meta(*shape: int) -> torch.Tensor:
    return torch.empty(shape, device="meta", dtype=torch.bfloat16)


class Meta:
    """Tensor metadata as a server may hand it to a guard: anything with .shape and .dtype."""

    def __init__(self, shape: Any, dtype: str = "bfloat16") -> None:
        self.shape, self.dtype = shape, dtype


# --- item 3: the seed-002 cache under threads ----------------------------------------------


class YieldingDict(dict[str, Any]):
    """A store whose reads give up the GIL: the window between a check and a return, which a
    real server hits by chance, is hit on most lookups."""

    def get(self, key: str, default: Any = None) -> Any:
        threading.Event().wait(0)  # a switch point, as a lock or an I/O would be
        return super().get(key, default)


@pytest.mark.lora_guard(allow=("LG003",))
def test_two_threads_evicting_one_key_get_only_the_tensor_they_asked_for() -> None:
    """The seed-002 lookup, evicting, from two threads that want one key at two ranks, 5,000
    lookups each: every lookup returns a tensor of the shape it asked for."""
    store = YieldingDict()

    @lg.guard_cache_lookup(store="pinned_weight_store", key="cache_key", weight="weight",
                           on_collision="evict")
    def get_maybe_cached(pinned_weight_store: dict[str, Any], cache_key: str,
                         weight: torch.Tensor) -> torch.Tensor:
        if cache_key not in pinned_weight_store:  # the inline get-or-create of the seed
            pinned_weight_store[cache_key] = weight
        threading.Event().wait(0)
        got: torch.Tensor = pinned_weight_store[cache_key]
        return got

    weights = {16: meta(48, 64), 8: meta(24, 64)}

    def work(rank: int) -> Counter[str]:
        seen: Counter[str] = Counter()
        for _ in range(LOOKUPS):
            got = get_maybe_cached(store, "layers.0.qkv_proj.lora_A#tp0", weights[rank])
            seen["right" if got.shape == weights[rank].shape else "wrong"] += 1
        return seen

    first, second = in_threads(lambda: work(16), lambda: work(8))
    assert first == Counter(right=LOOKUPS) and second == Counter(right=LOOKUPS)


@pytest.mark.lora_guard(allow=("LG003",))
def test_an_evicting_lookup_whose_body_keeps_returning_another_shape_is_refused() -> None:
    """A body that returns a tensor of another shape whatever the cache holds (code that
    stores behind the guard's back): evicted and retried a bounded number of times, then
    LG003; never returned unchecked."""
    calls = Counter[str]()

    @lg.guard_cache_lookup(store="store", key="key", weight="weight", on_collision="evict")
    def lookup(store: dict[str, Any], key: str, weight: torch.Tensor) -> torch.Tensor:
        calls["body"] += 1
        store[key] = made = meta(8, 64)  # whatever was asked
        return made

    with pytest.raises(lg.CacheKeyCollisionError, match="LG003"):
        lookup({}, "k", meta(16, 64))
    assert 1 < calls["body"] <= 8


def test_the_inline_get_or_create_has_a_checked_form_on_the_cache() -> None:
    """issue 26 item 4: ``if k not in cache: cache[k] = w; return cache[k]`` hands back the
    rank-8 tensor to a rank-16 request; ``get_or_create`` refuses it, makes a free key's entry
    once, and checks what ``create`` made."""
    cache = lg.GuardedCache({})
    made = Counter[str]()

    def pinned(weight: torch.Tensor) -> Callable[[], torch.Tensor]:
        def create() -> torch.Tensor:
            made["pinned"] += 1
            return weight.clone()
        return create

    w8, w16 = meta(8, 64), meta(16, 64)
    first = cache.get_or_create("q_proj.lora_A", w8, create=pinned(w8))
    assert cache.get_or_create("q_proj.lora_A", w8, create=pinned(w8)) is first
    assert made["pinned"] == 1
    with pytest.raises(lg.CacheKeyCollisionError, match="LG003"):
        cache.get_or_create("q_proj.lora_A", w16, create=pinned(w16))
    assert cache["q_proj.lora_A"] is first and made["pinned"] == 1
    with pytest.raises(lg.CacheKeyCollisionError, match="LG003"):
        cache.get_or_create("k_proj.lora_A", w16, create=lambda: meta(8, 64))
    assert "k_proj.lora_A" not in cache  # what create made of another shape is never stored
    evicting = lg.GuardedCache({"q": w8}, on_collision="evict")
    assert evicting.get_or_create("q", w16) is w16 and evicting["q"] is w16
    with pytest.raises(TypeError, match="create"):
        cache.get_or_create("x", w8, create=w8)  # type: ignore[arg-type]


def test_two_different_part_lists_never_give_one_key() -> None:
    w = meta(16, 64)
    pairs = [(("a#b",), ("a", "b")), (("a", "b#c"), ("a#b", "c")), (("a%23b",), ("a#b",)),
             (("1", 2), ("1#2",)), (("x%",), ("x%25",))]
    for one, other in pairs:
        assert lg.weight_cache_key(*one, weight=w) != lg.weight_cache_key(*other, weight=w)
    assert lg.weight_cache_key("layers.0.q_proj.lora_A", "tp0", weight=w) == \
        "layers.0.q_proj.lora_A#tp0[16x64:bfloat16]"  # keys without '#' or '%' unchanged


# --- odd shapes: LG004, never a bare TypeError/ValueError ---------------------------------


class EndlessShape:
    dtype = "bfloat16"

    @property
    def shape(self) -> Any:
        def forever() -> Any:
            n = 0
            while True:
                n += 1
                yield n
        return forever()


def _odd_shapes() -> dict[str, Any]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: nested tensors are a prototype
        jagged = torch.nested.nested_tensor([torch.empty(2, 64), torch.empty(3, 64)],
                                            layout=torch.jagged)
        strided = torch.nested.nested_tensor([torch.empty(2, 64), torch.empty(3, 64)])
    return {"float": Meta((4, 16.0)), "negative": Meta((4, -16)), "string": Meta((4, "16")),
            "endless": EndlessShape(), "jagged": jagged, "nested": strided}


@pytest.mark.parametrize("odd", list(_odd_shapes()))
def test_an_odd_shape_given_to_shapes_is_lg004(odd: str) -> None:
    class Pool:
        @lg.shapes(a="slots rank")
        def plain(self, a: Any) -> str:
            return "ran"

        @lg.shapes(a="slots rank", frozen=("rank",))
        def frozen(self, a: Any) -> str:
            return "ran"

    pool = Pool()
    assert pool.plain(meta(4, 16)) == "ran" and pool.frozen(meta(4, 16)) == "ran"  # fast path
    value = _odd_shapes()[odd]
    for method in (pool.plain, pool.frozen):
        with pytest.raises(lg.ShapeContractError, match="LG004") as caught:
            method(value)
        assert "argument 'a'" in str(caught.value)
        assert isinstance(caught.value, ValueError)  # as CONTRACT says
    assert lg.frozen_dims(pool) == {"rank": 16}


@pytest.mark.parametrize("odd", ["float", "negative", "jagged", "nested"])
def test_an_odd_shape_stored_into_a_guarded_cache_is_lg004(odd: str) -> None:
    value = _odd_shapes()[odd]
    cache = lg.GuardedCache({"held": meta(4, 16)})
    for store in (lambda: cache.__setitem__("held", value),
                  lambda: cache.__setitem__("new", value),
                  lambda: cache.setdefault("new", value),
                  lambda: cache.update({"new": value})):
        with pytest.raises(lg.ShapeContractError, match="LG004"):
            store()
    assert dict(cache) == {"held": cache["held"]} and cache["held"].shape == (4, 16)


# --- item 4: the seed-000 freeze under concurrent first calls and failures ---------------


class Gate:
    """A first allocation held open until the attack opens the gate (it says when the body
    has been entered)."""

    def __init__(self) -> None:
        self.entered, self.open = threading.Event(), threading.Event()

    def pass_through(self) -> None:
        self.entered.set()
        assert self.open.wait(DEADLINE), "the attack never opened the gate"

    def wait_inside(self) -> None:
        assert self.entered.wait(DEADLINE), "the body was never entered"


class SharedSink:
    """The seed-000 pool; its first allocation can be held open and made to fail."""

    def __init__(self) -> None:
        self.ranks_seen: list[int] = []

    @lg.shapes(a="slots 2*rank hidden", b="slots out rank", frozen=("slots", "rank"))
    def set_lora_info(self, a: torch.Tensor, b: torch.Tensor, *, gate: Gate | None = None,
                      fail: bool = False) -> None:
        self.ranks_seen.append(b.shape[-1])
        if gate is not None:
            gate.pass_through()
        if fail:
            raise MemoryError("allocation failed")  # the first allocation fails


def rank(r: int) -> tuple[torch.Tensor, torch.Tensor]:
    return meta(4, 2 * r, 64), meta(4, 128, r)


def run_in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.lora_guard(allow=("LG001",))
def test_a_failed_twin_first_call_does_not_unfreeze_a_first_call_still_in_its_body() -> None:
    """Twin first calls at rank 16: the one that froze the rank fails while the other is still
    in its body; a rank-8 call then is refused with LG001, and the rank stays 16."""
    for failing_first in (True, False):  # which of the twins bound the rank first
        pool = SharedSink()
        gates = {"ok": Gate(), "fails": Gate()}
        threads = {}

        def first_call(pool: SharedSink, gate: Gate, fails: bool) -> Callable[[], None]:
            return lambda: pool.set_lora_info(*rank(16), gate=gate, fail=fails)

        for name in (("fails", "ok") if failing_first else ("ok", "fails")):
            threads[name] = run_in_thread(first_call(pool, gates[name], name == "fails"))
            gates[name].wait_inside()  # each twin is in its body before the next starts
        gates["fails"].open.set()  # one twin fails while the other is still in its body
        threads["fails"][0].join(DEADLINE)
        assert isinstance(threads["fails"][1][0], MemoryError)
        with pytest.raises(lg.PoolShapeDriftError, match="LG001") as refused:
            pool.set_lora_info(*rank(8))
        assert refused.value.details["new"] == 8
        gates["ok"].open.set()
        threads["ok"][0].join(DEADLINE)
        assert threads["ok"][1] == [None]
        assert pool.ranks_seen == [16, 16]  # no body ever ran at rank 8
        assert lg.frozen_dims(pool) == {"slots": 4, "rank": 16}


@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
def test_a_copy_taken_during_a_first_call_that_fails_freezes_nothing(how: str) -> None:
    pool = SharedSink()
    gate = Gate()
    thread, outcome = run_in_thread(lambda: pool.set_lora_info(*rank(16), gate=gate, fail=True))
    gate.wait_inside()
    assert lg.frozen_dims(pool) == {"slots": 4, "rank": 16}  # held by the call in its body
    copies: dict[str, Callable[[SharedSink], SharedSink]] = {
        "copy": copy.copy, "deepcopy": copy.deepcopy,
        "pickle": lambda p: pickle.loads(pickle.dumps(p))}
    twin = copies[how](pool)
    gate.open.set()
    thread.join(DEADLINE)
    assert isinstance(outcome[0], MemoryError)
    assert lg.frozen_dims(pool) == {} and lg.frozen_dims(twin) == {}
    twin.set_lora_info(*rank(8))  # the copy was never allocated: a rebuild at rank 8 is fine
    pool.set_lora_info(*rank(8))
    assert lg.frozen_dims(twin) == {"slots": 4, "rank": 8} == lg.frozen_dims(pool)


# --- item 5: the seed-001 registry across concurrent load and unload -----------------------

SHARED_OUTER = {"layers.0.mlp.experts.gate_up_proj.lora_A": (1, 32, 64),
                "layers.0.mlp.experts.gate_up_proj.lora_B": (8, 256, 16)}
PER_EXPERT = {"layers.0.mlp.experts.0.gate_proj.lora_A.weight": (16, 64)}


class Server:
    """The seed-001 server: loads behind @guard_adapter_load, unloads with release."""

    def __init__(self) -> None:
        self.registry = lg.LayoutRegistry()
        self.loaded: dict[str, dict[str, Any]] = {}

        @lg.guard_adapter_load(self.registry, adapter_id="name", weights="weights")
        def load(name: str, weights: dict[str, Any], gate: Gate | None = None,
                 fail: bool = False) -> None:
            if gate is not None:
                gate.pass_through()
            if fail:
                raise OSError(f"reading {name}: connection reset")
            self.loaded[name] = weights

        self.load = load

    def unload(self, name: str) -> None:
        self.loaded.pop(name, None)
        self.registry.release(name)


@pytest.mark.lora_guard(allow=("LG002",))
def test_an_unload_during_a_failing_reload_leaves_no_phantom() -> None:
    server = Server()
    server.load("math", SHARED_OUTER)
    gate = Gate()
    thread, outcome = run_in_thread(
        lambda: server.load("math", SHARED_OUTER, gate=gate, fail=True))
    gate.wait_inside()  # the reload is admitted and in its body
    server.unload("math")  # the operator unloads it meanwhile
    gate.open.set()
    thread.join(DEADLINE)
    assert isinstance(outcome[0], OSError)
    assert "math" not in server.registry and server.registry.layout is None
    server.load("code", PER_EXPERT)  # no phantom owner: a per-expert adapter is admitted
    assert server.registry.adapters == {"code": lg.MoELayout.PER_EXPERT}


@pytest.mark.lora_guard(allow=("LG002",))
def test_a_failed_reload_never_undoes_a_later_load_of_the_same_id() -> None:
    """Reload A fails after the id was unloaded and loaded again (per-expert now): the new
    admission stays, and the pool's layout is the new one."""
    server = Server()
    server.load("math", SHARED_OUTER)
    gate = Gate()
    thread, outcome = run_in_thread(
        lambda: server.load("math", SHARED_OUTER, gate=gate, fail=True))
    gate.wait_inside()
    server.unload("math")
    server.load("math", PER_EXPERT)
    gate.open.set()
    thread.join(DEADLINE)
    assert isinstance(outcome[0], OSError)
    assert server.registry.adapters == {"math": lg.MoELayout.PER_EXPERT}


# --- memory: pools of a __slots__ class are freed ----------------------------------------

POOLS = 10_000


@pytest.mark.parametrize("weakrefs", [True, False], ids=["slots-weakref", "slots-only"])
def test_pools_of_a_slots_class_are_freed_after_the_guard_has_seen_them(weakrefs: bool) -> None:
    """A server that builds and drops 10,000 pools of a ``__slots__`` class (with and without
    ``__weakref__``): the guard keeps no pool alive beyond a bounded table."""
    from lora_guard._guarding import shapes as guard_shapes

    alive = Counter[str]()

    class Pool:
        __slots__ = ("rank", "__weakref__") if weakrefs else ("rank",)

        def __init__(self) -> None:
            alive["pools"] += 1

        def __del__(self) -> None:
            alive["pools"] -= 1

        @lg.shapes(a="slots rank", frozen=("rank",))
        def set_lora_info(self, a: torch.Tensor) -> None: ...

    kept = [Pool() for _ in range(10)]
    for p in kept:
        p.set_lora_info(meta(4, 16))
    for i in range(POOLS):
        pool = Pool()
        pool.set_lora_info(meta(4, 8 + i % 2))  # each pool freezes its own rank
        assert lg.frozen_dims(pool) == {"rank": 8 + i % 2}
        del pool
    gc.collect()
    assert alive["pools"] <= 10 + 2 * 64  # the ten kept, and at most one table's slack
    held = len(guard_shapes._FOREIGN_STORES) + len(guard_shapes._UNWEAKREFABLE_STORES)
    assert held <= 10 + 2 * 64
    assert all(lg.frozen_dims(p) == {"rank": 16} for p in kept)  # the live ones kept theirs
    with pytest.raises(lg.PoolShapeDriftError):
        kept[0].set_lora_info(meta(4, 8))


# --- the generated fast path in tracebacks (issue 28 item 6) -------------------------------


def test_a_traceback_through_a_guard_shows_the_generated_lines() -> None:
    def make(rank_spec: str) -> Callable[..., None]:
        @lg.shapes(a=f"slots {rank_spec}")
        def set_lora_info(a: torch.Tensor) -> None:
            raise RuntimeError("CUDA out of memory")
        return set_lora_info

    first, second = make("rank"), make("rank hidden")  # one qualname, two guards
    shown = []
    for fn, arg in ((first, meta(4, 16)), (second, meta(4, 16, 64))):
        with pytest.raises(RuntimeError, match="out of memory") as caught:
            fn(arg)
        frames = traceback.extract_tb(caught.value.__traceback__)
        guard = [f for f in frames if f.filename.startswith("<lora_guard.shapes ")]
        assert len(guard) == 1 and guard[0].line, "the guard's frame shows no line"
        assert "_lg_fn(a)" in guard[0].line  # the generated call, as the source has it
        source = linecache.getlines(guard[0].filename)
        assert source == fn.__lora_guard_source__.splitlines(True)  # type: ignore[attr-defined]
        shown.append(guard[0].filename)
    assert shown[0] != shown[1]  # each guard's own source


def test_a_jagged_tensor_whose_dims_match_the_spec_is_lg004_on_the_fast_path() -> None:
    """(2, j1, 64): as many dims as the spec, so the fast path unpacks it and reaches the
    nested int (which raises AttributeError, not TypeError, when combined)."""
    class Pool:
        @lg.shapes(a="slots tokens hidden", frozen=("hidden",))
        def set_lora_info(self, a: Any) -> str:
            return "ran"

    pool = Pool()
    assert pool.set_lora_info(meta(2, 5, 64)) == "ran"  # the fast path is open
    with pytest.raises(lg.ShapeContractError, match="LG004.*ragged"):
        pool.set_lora_info(_odd_shapes()["jagged"])


def test_the_reliability_page_quotes_these_attacks() -> None:
    """Every attack of round 3 (this file, the plugin's and the ranks') is in the table of
    docs/reliability.md, with the numbers it holds."""
    import ast as syntax
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    page = (tests.parent / "docs" / "reliability.md").read_text("utf-8")
    section = page.split("### Round 3 (issue 27): the guards, the plugin and the ranks")[1]
    section = section.split("\n### ")[0]
    for name in ("test_hostile_guards.py", "test_plugin_hostile.py",
                 "test_distributed_releases.py"):
        tree = syntax.parse((tests / name).read_text("utf-8"))
        attacks = [node.name for node in tree.body if isinstance(node, syntax.FunctionDef)
                   and node.name.startswith("test_") and "reliability_page" not in node.name]
        missing = [a for a in attacks if f"`{a}`" not in section]
        assert not missing, f"docs/reliability.md, round 3, does not list {missing}"
        assert f"tests/{name}" in section  # the command runs it
    assert f"{LOOKUPS:,} lookups each" in section and f"{POOLS:,} pools" in section
