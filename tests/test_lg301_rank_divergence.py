"""LG301 (rank-divergence): tensor-parallel ranks that must agree: fingerprints, and real gloo
runs of 2 and 4 processes. (A rank running another lora_guard release:
tests/test_distributed_releases.py.)

The multi-process tests spawn one small gloo job per world size (module-scoped, so the cost of
starting processes is paid once); each rank plays every scenario in turn and writes what it
saw, and the tests below read it as the user of each rank would see it.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

import lora_guard as lg
from lora_guard._guarding.distributed import _divergence

# These tests provoke violations on purpose: under `pytest --lora-guard` they are expected.
pytestmark = pytest.mark.lora_guard(allow=tuple(lg.INVARIANTS))

# --- the fingerprint: what counts, what does not -----------------------------------------


def test_fingerprint_ignores_insertion_order_tensor_data_and_device_index() -> None:
    a = {"uid_to_slot": {"math": 0, "code": 1}, "pool": torch.zeros(4, 16, 64),
         "adapters": {"math", "code"}}
    b = {"adapters": {"code", "math"}, "pool": torch.ones(4, 16, 64),
         "uid_to_slot": {"code": 1, "math": 0}}
    assert lg.rank_fingerprint(a) == lg.rank_fingerprint(b)
    assert list(lg.rank_fingerprint(a)) == list(lg.rank_fingerprint(b))  # same order too
    assert lg.rank_fingerprint(torch.device("cuda", 0)) == lg.rank_fingerprint(
        torch.device("cuda", 3))


def test_fingerprint_sees_shape_dtype_slot_order_and_adapter_set() -> None:
    base = {"slots": ["math", "code", None], "a": torch.empty(4, 16, 64, dtype=torch.bfloat16)}
    for changed in (
        {**base, "slots": ["code", "math", None]},                    # slot order
        {**base, "a": torch.empty(4, 8, 64, dtype=torch.bfloat16)},   # max rank
        {**base, "a": torch.empty(4, 16, 64, dtype=torch.float16)},   # dtype
        {**base, "slots": ["math", None, None]},                      # adapter set
    ):
        assert lg.rank_fingerprint(changed) != lg.rank_fingerprint(base)


def test_fingerprint_reads_metadata_dataclasses_enums_and_sets() -> None:
    from dataclasses import dataclass

    @dataclass
    class Slot:
        uid: str
        layout: lg.MoELayout

    fp = lg.rank_fingerprint(
        {"slot": Slot("math", lg.MoELayout.SHARED_OUTER), "meta": torch.empty(2, 3, device="meta"),
         "ids": frozenset({3, 1}), "size": torch.Size([2, 3]), (0, "tp"): torch.float16},
        root="pool",
    )
    assert fp["pool['slot'].layout"] == "MoELayout.SHARED_OUTER"
    assert fp["pool['meta']"] == "tensor (2, 3) float32 meta"
    assert list(fp)[list(fp).index("pool['ids']") + 1] == "pool['ids']{1}"
    assert fp["pool[(0, 'tp')]"] == "dtype float16"
    assert fp["pool['size'][1]"] == "3"


def test_fingerprint_refuses_what_has_no_rank_independent_form() -> None:
    with pytest.raises(TypeError, match=r"state\['pool'\]\['lock'\] is a _thread.lock"):
        lg.rank_fingerprint({"pool": {"lock": __import__("threading").Lock()}})
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match=r"state\[0\] contains itself"):
        lg.rank_fingerprint(loop)
    with pytest.raises(TypeError, match="keys"):
        lg.rank_fingerprint({object(): 1})


def test_single_process_and_bad_options() -> None:
    assert not torch.distributed.is_initialized()
    lg.assert_rank_consistent({"uid_to_slot": {"math": 0}})  # nothing to compare: returns
    for bad in (0, -1, float("inf"), "10", True):
        with pytest.raises(ValueError, match="timeout"):
            lg.assert_rank_consistent({}, timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="state=lambda self"):
        lg.guard_rank_consistency(state={"slots": 1})  # type: ignore[arg-type]


def test_the_old_names_still_work_and_say_what_replaces_them() -> None:
    """`rank_consistent` read like a predicate but is a decorator; a positional group read
    unlike every other option. Both keep working, with a warning naming the new spelling."""
    with pytest.warns(DeprecationWarning, match="guard_rank_consistency"):
        decorate = lg.rank_consistent(state=lambda self: {"slots": self.slots})

    class Pool:
        slots: ClassVar[dict[str, int]] = {"math": 0}

        @decorate
        def load(self) -> str:
            return "loaded"

    assert Pool().load() == "loaded"  # one process: the call runs as before
    with pytest.warns(DeprecationWarning, match="group="):
        lg.assert_rank_consistent({"slots": {}}, None)


def test_divergence_names_the_minority_against_the_most_common_state() -> None:
    same = lg.rank_fingerprint({"uid_to_slot": {"math": 0}})
    odd = lg.rank_fingerprint({"uid_to_slot": {"math": 1}})
    found = _divergence("pool", [0, 1, 2, 3], [odd, same, same, same])
    assert len(found) == 1
    assert found[0].details["ranks"] == [0]
    assert found[0].details["reference"] == 1
    assert found[0].message == (
        "pool: ranks [0] differ from rank 1 at state['uid_to_slot']['math']: "
        "rank 0 has 1, rank 1 has 0."
    )
    missing = lg.rank_fingerprint({"uid_to_slot": {}})
    found = _divergence("pool", [0, 1, 2, 3, 4, 5],
                        [same, missing, "TypeError: boom", missing, same, same])
    assert [v.details["ranks"] for v in found] == [[1, 3], [2]]
    assert "ranks [1, 3] have missing, rank 0 has 0" in found[0].message
    assert "rank 2 could not fingerprint its state (TypeError: boom)" in found[1].message


# --- real gloo jobs ------------------------------------------------------------------------

TIMEOUT = 30.0  # a safety net: the ranks below answer in milliseconds
SILENT_TIMEOUT = 2.0  # seconds the others wait for the rank that falls silent


class _Pool:
    """A pool whose load can fail on one rank, guarded by the decorator form."""

    def __init__(self) -> None:
        self.uid_to_slot: dict[str, int] = {}

    @lg.guard_rank_consistency(state=lambda self: {"uid_to_slot": self.uid_to_slot},
                               timeout=TIMEOUT)
    def load(self, uid: str, *, fail: bool = False) -> int:
        if fail:
            raise OSError(f"could not read {uid}")
        self.uid_to_slot[uid] = len(self.uid_to_slot)
        return self.uid_to_slot[uid]


_ADAPTERS = ["math", "code", "chat"]


def _lora_rank(rank: int, world: int) -> int:
    """The LoRA rank each tensor-parallel rank loaded: the last one got a smaller adapter."""
    return 8 if rank == world - 1 else 16


def _equal(rank: int, world: int) -> None:
    order = _ADAPTERS if rank % 2 else list(reversed(_ADAPTERS))  # insertion order differs
    state = {
        "uid_to_slot": {uid: sorted(_ADAPTERS).index(uid) for uid in order},
        "adapters": set(order),
        "qkv_a": torch.full((4, 48, 64), float(rank)),  # data differs: never compared
    }
    lg.assert_rank_consistent(state, timeout=TIMEOUT)


def _slot_map(rank: int, world: int) -> None:
    order = list(reversed(_ADAPTERS)) if rank == 1 else _ADAPTERS  # like a hash-seeded set
    lg.assert_rank_consistent({"uid_to_slot": {u: i for i, u in enumerate(order)}},
                              timeout=TIMEOUT, subject="slot map")


def _max_rank(rank: int, world: int) -> None:
    a_rank = _lora_rank(rank, world)
    lg.assert_rank_consistent({"qkv_a": torch.empty(4, 3 * a_rank, 64, device="meta")},
                              timeout=TIMEOUT)


def _adapter_set(rank: int, world: int) -> None:
    loaded = _ADAPTERS[:2] if rank == world - 1 else _ADAPTERS
    lg.assert_rank_consistent({"adapters": set(loaded)}, timeout=TIMEOUT)


def _load_failed_on_one_rank(rank: int, world: int) -> None:
    pool = _Pool()
    pool.load("math")
    pool.load("code", fail=rank == world - 1)


def _warn_mode(rank: int, world: int) -> list[str]:
    lg.configure(mode="warn")
    try:
        with warnings.catch_warnings(record=True) as caught, lg.recording() as rec:
            warnings.simplefilter("always")
            lg.assert_rank_consistent({"rank": _lora_rank(rank, world)}, timeout=TIMEOUT)
        return [*rec.codes, *(type(w.message).__name__ for w in caught)]
    finally:
        lg.configure(mode="raise")


def _unfingerprintable(rank: int, world: int) -> None:
    state = {"lock": __import__("threading").Lock()} if rank == 1 else {"lock": None}
    lg.assert_rank_consistent(state, timeout=TIMEOUT)


def _subgroup(rank: int, world: int) -> None:
    import torch.distributed as dist

    group = dist.new_group(ranks=[0, 1], use_local_synchronization=True)
    if rank in (0, 1):
        lg.assert_rank_consistent({"uid_to_slot": {"math": rank}}, group, timeout=TIMEOUT)


def _silent_rank(rank: int, world: int) -> None:
    last = world - 1
    state = {"uid_to_slot": {"math": 0}}
    if world == 2:  # the check's group exists already; then one rank dies mid-check
        lg.assert_rank_consistent(state, timeout=SILENT_TIMEOUT)
        if rank == last:
            os._exit(0)
    elif rank == last:  # the first check with this timeout; the rank hangs, then dies
        time.sleep(SILENT_TIMEOUT + 1)
        os._exit(0)
    lg.assert_rank_consistent(state, timeout=SILENT_TIMEOUT)


_SCENARIOS: list[tuple[str, Callable[[int, int], Any]]] = [
    ("equal", _equal), ("slot_map", _slot_map), ("max_rank", _max_rank),
    ("adapter_set", _adapter_set), ("load_failed_on_one_rank", _load_failed_on_one_rank),
    ("warn_mode", _warn_mode), ("unfingerprintable", _unfingerprintable),
    ("subgroup", _subgroup), ("silent_rank", _silent_rank),
]


def _scenarios(rank: int, world: int) -> list[tuple[str, Callable[[], Any]]]:
    """Every scenario, in order, bound to this rank of a job of ``world`` ranks."""
    return [(name, functools.partial(play, rank, world)) for name, play in _SCENARIOS]


def _worker(rank: int, world: int, store: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    results: dict[str, Any] = {}
    path = Path(out) / f"rank{rank}.json"
    for name, scenario in _scenarios(rank, world):
        started = time.perf_counter()
        seen: dict[str, Any] = {"raised": None}
        try:
            seen["returned"] = scenario()
        except Exception as exc:
            seen = {"raised": type(exc).__name__, "message": str(exc),
                    "code": getattr(exc, "code", None),
                    "cause": type(exc.__cause__).__name__ if exc.__cause__ else None,
                    "builtin": isinstance(exc, RuntimeError)}
        seen["seconds"] = round(time.perf_counter() - started, 3)
        results[name] = seen
        path.write_text(json.dumps(results))  # after each step: a rank may die in the next
    os._exit(0)  # the job is broken after the silent rank: skip the teardown collectives


def _run_job(world: int) -> dict[int, dict[str, Any]]:
    import torch.multiprocessing as mp

    # A fresh interpreter per rank, as spawn gives, but torch is imported once, by the fork
    # server, rather than once per rank: 4 imports of torch on 2 cores take seconds.
    mp.get_context("forkserver").set_forkserver_preload(["torch", "torch.distributed",
                                                          "lora_guard"])
    with tempfile.TemporaryDirectory() as tmp:
        context = mp.start_processes(  # type: ignore[attr-defined, no-untyped-call]
            _worker, args=(world, os.path.join(tmp, "store"), tmp), nprocs=world,
            join=False, start_method="forkserver",
        )
        deadline = time.monotonic() + 120  # a safety net only: the checks time out in seconds
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                for p in context.processes:
                    p.kill()
                pytest.fail(f"the {world}-rank job hung")
        return {r: json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(world)}


@pytest.fixture(scope="module", params=[2, 4], ids=["2-ranks", "4-ranks"])
def job(request: pytest.FixtureRequest) -> tuple[int, dict[int, dict[str, Any]]]:
    return request.param, _run_job(request.param)


def test_equal_states_pass_on_every_rank(job: tuple[int, dict[int, dict[str, Any]]]) -> None:
    world, seen = job
    assert [seen[r]["equal"]["raised"] for r in range(world)] == [None] * world


def test_divergent_slot_map_is_reported_on_every_rank(
        job: tuple[int, dict[int, dict[str, Any]]]) -> None:
    world, seen = job
    for r in range(world):
        got = seen[r]["slot_map"]
        assert (got["raised"], got["code"], got["builtin"]) == ("RankDivergenceError", "LG301",
                                                                True)
        assert got["message"].startswith(
            "LG301 rank-divergence: slot map: ranks [1] differ from rank 0 at "
            "state['uid_to_slot']['chat']: rank 1 has 0, rank 0 has 2.")
        assert "Fix: Derive slot order" in got["message"]


def test_divergent_max_rank_is_reported_on_every_rank(
        job: tuple[int, dict[int, dict[str, Any]]]) -> None:
    world, seen = job
    last = world - 1
    for r in range(world):
        got = seen[r]["max_rank"]
        assert got["code"] == "LG301"
        assert (f"ranks [{last}] differ from rank 0 at state['qkv_a']: rank {last} has tensor "
                "(4, 24, 64) float32 meta, rank 0 has tensor (4, 48, 64) float32 meta"
                ) in got["message"]


def test_divergent_adapter_set_is_reported_on_every_rank(
        job: tuple[int, dict[int, dict[str, Any]]]) -> None:
    world, seen = job
    last = world - 1
    for r in range(world):
        got = seen[r]["adapter_set"]
        assert got["code"] == "LG301"
        assert (f"at state['adapters']{{'chat'}}: rank {last} has missing, rank 0 has present"
                in got["message"])


def test_a_load_that_failed_on_one_rank_is_a_divergence_everywhere(
        job: tuple[int, dict[int, dict[str, Any]]]) -> None:
    world, seen = job
    last = world - 1
    for r in range(world):
        got = seen[r]["load_failed_on_one_rank"]
        assert got["raised"] == "RankDivergenceError"
        assert (f"_Pool.load: ranks [{last}] differ from rank 0 at outcome: rank {last} has "
                "raised OSError, rank 0 has returned") in got["message"]
        assert got["cause"] == ("OSError" if r == last else None)  # the root cause is kept


def test_warn_mode_reports_and_proceeds(job: tuple[int, dict[int, dict[str, Any]]]) -> None:
    world, seen = job
    for r in range(world):
        assert seen[r]["warn_mode"] == {
            "raised": None, "returned": ["LG301", "LoRAGuardWarning"],
            "seconds": seen[r]["warn_mode"]["seconds"]}


def test_a_rank_whose_state_cannot_be_fingerprinted_is_named(
        job: tuple[int, dict[int, dict[str, Any]]]) -> None:
    world, seen = job
    assert seen[1]["unfingerprintable"]["raised"] == "TypeError"
    for r in set(range(world)) - {1}:
        got = seen[r]["unfingerprintable"]
        assert got["code"] == "LG301"
        assert "rank 1 could not fingerprint its state (TypeError: " in got["message"]


def test_a_subgroup_checks_its_own_ranks_only(
        job: tuple[int, dict[int, dict[str, Any]]]) -> None:
    world, seen = job
    for r in (0, 1):
        assert "ranks [1] differ from rank 0 at state['uid_to_slot']['math']" in (
            seen[r]["subgroup"]["message"])
    for r in range(2, world):
        assert seen[r]["subgroup"]["raised"] is None


def test_a_silent_rank_gives_a_timeout_error_not_a_hang(
        job: tuple[int, dict[int, dict[str, Any]]]) -> None:
    world, seen = job
    last = world - 1
    assert "silent_rank" not in seen[last]  # it died before answering
    for r in range(last):
        got = seen[r]["silent_rank"]
        assert (got["raised"], got["code"]) == ("RankDivergenceError", "LG301")
        assert (f"rank state: no answer from ranks within {SILENT_TIMEOUT:g} s (expected ranks "
                f"{list(range(world))}; ") in got["message"]
        assert "Fix: When a rank does not answer" in got["message"]
        stage = "exchanging fingerprints" if world == 2 else "creating the check's gloo group"
        assert got["message"].count(stage) == 1
