"""Tensor-parallel faults of hostile round 3 (issue 27 item 7): a rank running another
lora_guard release, and a timeout too short for gloo.

A real 2-rank gloo job (forkserver, as tests/test_lg301_rank_divergence.py): rank 1 plays a release
whose check header has another length, then release 0.1.0 itself (its exchange as it was,
with no preamble); rank 0 runs this release. Before, rank 0 died inside gloo (SIGABRT, the
all-gather sizes differ); now every rank of this release raises LG301 naming both releases,
and the job's group stays usable. The job has a 120 s deadline; each check 5 s.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

import lora_guard as lg

pytestmark = pytest.mark.lora_guard(allow=("LG301",))

TIMEOUT = 5.0


def _release_0_1_0_exchange(local: Any, group: Any) -> Any:
    """Release 0.1.0's exchange, as it shipped: a 25-byte header first, no preamble."""
    import json as _json

    from lora_guard._guarding import distributed as d

    status, digest = d._OK, d._digest(local)
    payload = _json.dumps(list(local.items())).encode()
    headers = d._all_gather_bytes(bytes([status]) + digest + len(payload).to_bytes(8, "little"),
                                  group, 25)
    if all(h[0] == d._OK for h in headers) and len({h[1:17] for h in headers}) == 1:
        return None
    longest = max(int.from_bytes(h[17:], "little") for h in headers)
    d._all_gather_bytes(payload, group, longest)  # the peer never joins: a timeout
    return None


def _play(rank: int) -> dict[str, Any]:
    from lora_guard._guarding import distributed as d

    seen: dict[str, Any] = {}
    state = {"uid_to_slot": {"math": 0}}

    def attempt(name: str) -> None:
        started = time.perf_counter()
        try:
            lg.assert_rank_consistent(state, timeout=TIMEOUT)
            seen[name] = {"raised": None}
        except Exception as exc:
            seen[name] = {"raised": type(exc).__name__, "code": getattr(exc, "code", None),
                          "message": str(exc)}
        seen[name]["seconds"] = round(time.perf_counter() - started, 3)

    attempt("same-release")
    if rank == 1:  # a later release: protocol 3, a 41-byte header (a 32-byte digest)
        d._PROTOCOL, d._DIGEST_SIZE = 3, 32
    attempt("header-of-another-length")
    d._PROTOCOL, d._DIGEST_SIZE = 2, 16
    attempt("same-release-again")  # the group is still in step
    if rank == 1:
        d._exchange = _release_0_1_0_exchange
    attempt("release-0.1.0")
    return seen


def _worker(rank: int, world: int, store: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    seen = _play(rank)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(seen))
    os._exit(0)  # release 0.1.0's rank left a collective open: skip the teardown


@pytest.fixture(scope="module")
def job() -> dict[int, dict[str, Any]]:
    import torch.multiprocessing as mp

    mp.get_context("forkserver").set_forkserver_preload(["torch", "torch.distributed",
                                                          "lora_guard"])
    with tempfile.TemporaryDirectory() as tmp:
        context = mp.start_processes(  # type: ignore[attr-defined, no-untyped-call]
            _worker, args=(2, os.path.join(tmp, "store"), tmp), nprocs=2, join=False,
            start_method="forkserver",
        )
        deadline = time.monotonic() + 120
        try:
            while not context.join(timeout=1):
                if time.monotonic() > deadline:
                    pytest.fail("the 2-rank job hung")
        except Exception as exc:  # a rank killed by a signal (SIGABRT inside gloo)
            pytest.fail(f"a rank died: {exc}")
        finally:
            for p in context.processes:
                if p.is_alive():
                    p.kill()
        return {r: json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(2)}


def test_a_rank_of_a_release_with_another_header_gets_lg301_naming_both(
        job: dict[int, dict[str, Any]]) -> None:
    assert [job[r]["same-release"]["raised"] for r in (0, 1)] == [None, None]
    for r in (0, 1):
        seen = job[r]["header-of-another-length"]
        assert (seen["raised"], seen["code"]) == ("RankDivergenceError", "LG301")
        assert "run another lora_guard release" in seen["message"]
        assert "check protocol 3, a 41-byte header" in seen["message"]
        assert "check protocol 2, a 25-byte header" in seen["message"]
        assert seen["seconds"] < TIMEOUT  # refused at once, not after a timeout
    assert [job[r]["same-release-again"]["raised"] for r in (0, 1)] == [None, None]


def test_a_rank_of_release_0_1_0_is_named_and_nobody_aborts(
        job: dict[int, dict[str, Any]]) -> None:
    ours = job[0]["release-0.1.0"]
    assert (ours["raised"], ours["code"]) == ("RankDivergenceError", "LG301")
    assert "rank 1 runs an earlier lora_guard release (check protocol 1" in ours["message"]
    assert ours["seconds"] < TIMEOUT
    theirs = job[1]["release-0.1.0"]  # the old release waits for a message that never comes
    assert (theirs["raised"], theirs["code"]) == ("RankDivergenceError", "LG301")


@pytest.mark.parametrize("timeout", [0.0004, timedelta(microseconds=999), 1e-9])
def test_a_sub_millisecond_timeout_is_refused_eagerly(timeout: Any) -> None:
    for call in (lambda: lg.assert_rank_consistent({}, timeout=timeout),
                 lambda: lg.guard_rank_consistency(state=lambda self: {}, timeout=timeout)):
        with pytest.raises(ValueError, match="under a millisecond.*wait forever"):
            call()
    lg.assert_rank_consistent({}, timeout=0.001)  # the shortest gloo can honour
    assert not torch.distributed.is_initialized()
