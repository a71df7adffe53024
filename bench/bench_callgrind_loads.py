"""What lora_guard costs on a load or a swap, counted in instructions (callgrind), not time.

    python bench/bench_callgrind_loads.py peft|sglang-r8|sglang-r16|sglang-hit|sglang-swap-in
                                          [--calls N]

Runs in the engine environment (as ``bench/bench_engine_paths.py``), under valgrind's
callgrind, e.g. ``PYTHONPATH=src $LORA_GUARD_ENGINES_VENV/bin/python
bench/bench_callgrind_loads.py peft``. The row is one engine call: PEFT's
``hotswap_adapter`` of a 4-layer Llama (r8, two adapters in turn), or sglang's
``load_lora_adapter`` of an r8 / r16 adapter (its unload outside the count), 1,000 hits
of sglang's pinned-weight store, or sglang's ``fetch_new_loras`` swapping one adapter in.
Four arms in one process, plain (``uninstrument()``), instrumented, plain, instrumented,
each after warm-up calls; callgrind counts the instructions of the timed calls only
(instrumentation starts after the set-up; the unload is not collected). Printed:
instructions per call of each arm, the ratio instrumented / plain of each pair, and the A/A
floor (second plain / first plain).
Instruction counts do not depend on the machine's load, so the ratio of a 2 ms path can be
read to the percent on a shared machine; the clock (``bench_engine_paths.py``) gives the
time. Needs valgrind and a C compiler with ``valgrind/callgrind.h`` (the client requests that
start, zero, dump and toggle the counts are compiled into a small library in a temporary
folder); takes two to four minutes a row.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ROWS = ("peft", "sglang-r8", "sglang-r16", "sglang-hit", "sglang-swap-in")
ARMS = ("plain", "guarded", "plain", "guarded")
_CLIENT = """#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void cg_zero(void) { CALLGRIND_ZERO_STATS; }
void cg_dump(const char *arm) { CALLGRIND_DUMP_STATS_AT(arm); }
void cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
"""


def _row(row: str, tmp: Path) -> tuple[Callable[[], Any], Callable[[], Any] | None, Any]:
    """(the call, its undo or None, the integration's module) of ``row``."""
    sys.path.insert(0, str(ROOT / "tests" / "engines"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import _harness as h
    import torch

    if row == "peft":
        from peft import PeftModel
        from peft.utils import hotswap
        from transformers import AutoModelForCausalLM

        from lora_guard.integrations import peft as peft_guard

        torch.manual_seed(0)
        config = h.llama_config(num_hidden_layers=4)
        paths = [str(h.peft_adapter(tmp / f"p-{i}", base=config, r=8, seed=i)) for i in (1, 2)]
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_config(config), paths[0])
        flip = [0]

        def swap() -> None:
            flip[0] ^= 1
            hotswap.hotswap_adapter(model, paths[flip[0]], adapter_name="default",
                                    torch_device="cpu")
        return swap, None, peft_guard

    from lora_guard.integrations import sglang as sglang_guard

    manager = h.sglang_server(max_loras_per_batch=4, max_lora_rank=16)
    if row in ("sglang-hit", "sglang-swap-in"):
        return _sglang_pool_row(row, manager, tmp), None, sglang_guard
    rank = int(row.rsplit("r", 1)[1])
    path = h.peft_adapter(tmp / f"load-r{rank}", r=rank, seed=rank)

    def load() -> None:
        assert manager.load_lora_adapter(h.sglang_ref("x", path)).success

    def unload() -> None:
        manager.unload_lora_adapter(h.sglang_ref("x", path))
    return load, unload, sglang_guard


def _sglang_pool_row(row: str, manager: Any, tmp: Path) -> Callable[[], Any]:
    """sglang's pool: 1,000 pinned-store hits (pinning and overlap loading on, the entry
    there: no pin is made), or one ``fetch_new_loras`` swapping an adapter in (4 slots, 4
    resident, a fifth in and out in turn)."""
    import _harness as h

    names = [f"s{i}" for i in range(5)]
    for i, name in enumerate(names):
        path = h.peft_adapter(tmp / name, r=8, seed=i)
        assert manager.load_lora_adapter(h.sglang_ref(name, path)).success
    pool = manager.memory_pool
    if row == "sglang-hit":
        key, weight = next(iter(manager.loras["s0"].layers[0].weights.items()))
        store = {key: weight.clone()}
        pool.pin_memory_available = pool.enable_lora_overlap_loading = True

        def hits() -> None:  # looked up each time: instrument() replaces the class's
            for _ in range(1000):
                pool._get_maybe_cached_weight_for_transfer(store, key, weight)
        return hits
    batches = [set(names[:4]), {names[4], *names[1:4]}]
    flip = [0]

    def swap_in() -> None:
        flip[0] ^= 1
        manager.fetch_new_loras(batches[flip[0]])
    return swap_in


def measure(row: str, calls: int, client: str) -> None:
    """Under callgrind: the four arms, each dumped under its name."""
    cg = ctypes.CDLL(client)
    with tempfile.TemporaryDirectory(prefix="lora-guard-callgrind-") as folder:
        call, undo, guard = _row(row, Path(folder))

        def one() -> None:
            call()
            if undo is not None:
                cg.cg_toggle()  # the unload is not counted
                undo()
                cg.cg_toggle()

        cg.cg_start()
        for arm in ARMS:
            guard.instrument() if arm == "guarded" else guard.uninstrument()
            for _ in range(3):
                one()
            cg.cg_zero()
            for _ in range(calls):
                one()
            cg.cg_dump(arm.encode())
        guard.uninstrument()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("row", choices=ROWS)
    parser.add_argument("--calls", type=int, default=20, help="calls per arm (default 20)")
    parser.add_argument("--client", help=argparse.SUPPRESS)  # set when run under valgrind
    args = parser.parse_args()
    if args.client:
        measure(args.row, args.calls, args.client)
        return 0
    if not shutil.which("valgrind") or not shutil.which("cc"):
        print("needs valgrind and a C compiler (cc) with valgrind/callgrind.h", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="lora-guard-callgrind-") as folder:
        tmp = Path(folder)
        (tmp / "client.c").write_text(_CLIENT)
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tmp / "client.so"),
                        str(tmp / "client.c")], check=True)
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no",
             f"--callgrind-out-file={tmp}/out.%p", sys.executable, __file__, args.row,
             "--calls", str(args.calls), "--client", str(tmp / "client.so")],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode:
            print(done.stderr[-3000:], file=sys.stderr)
            return done.returncode
        counts: list[tuple[str, float]] = []
        for dump in sorted(tmp.glob("out.*.*"), key=lambda p: int(p.name.rsplit(".", 1)[1])):
            text = dump.read_text()
            name = re.search(r"^desc: Trigger: Client Request: (\S+)", text, re.M)
            total = re.search(r"^totals: (\d+)", text, re.M)
            if name and total:
                counts.append((name.group(1), int(total.group(1)) / args.calls))
    print(f"## {args.row}: instructions per call ({args.calls} calls an arm, callgrind)")
    for arm, count in counts:
        print(f"{arm:<8} {count:14,.0f}")
    plain = [c for a, c in counts if a == "plain"]
    guarded = [c for a, c in counts if a == "guarded"]
    ratios = " ".join(f"{g / p:.3f}" for p, g in zip(plain, guarded, strict=True))
    print(f"ratio instrumented / plain, per pair: {ratios}; "
          f"A/A floor (plain again / plain): {plain[1] / plain[0]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
