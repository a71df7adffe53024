"""What lora_guard costs on a load or a swap, counted in instructions (callgrind), not time.

    python bench/bench_callgrind_loads.py ROW [--calls N] [--cache-sim]
    (ROW: peft, sglang-r8, sglang-r16, sglang-hit, sglang-swap-in, vllm-r8, vllm-r16,
    vllm-add, vllm-r8-first)

Runs in the engine environment (as ``bench/bench_engine_paths.py``), under valgrind's
callgrind, e.g. ``PYTHONPATH=src $LORA_GUARD_ENGINES_VENV/bin/python
bench/bench_callgrind_loads.py peft``. The row is one engine call: PEFT's
``hotswap_adapter`` of a 4-layer Llama (r8, two adapters in turn), or sglang's
``load_lora_adapter`` of an r8 / r16 adapter (its unload outside the count), 1,000 hits
of sglang's pinned-weight store (``sglang-hit``), or sglang's ``fetch_new_loras`` swapping
one adapter in (``sglang-swap-in``), or vLLM's
``LoRAModel.from_local_checkpoint`` of an r8 / r16 adapter (with its ``PEFTHelper``, as the
worker calls it), its worker's ``add_adapter`` (load + add + activate; the removal outside
the count), or ``vllm-r8-first``: the r8 load with lora_guard's remembered verdicts emptied
before each call (outside the count), a first load of an adapter it has not seen. Four arms
in one process, plain (``uninstrument()``), instrumented, plain, instrumented, each after
warm-up calls; callgrind counts the instructions of the timed calls only (instrumentation
starts after the set-up; the unload is not collected). Printed: instructions per call of
each arm, the ratio instrumented / plain of each pair, and the A/A floor (second plain /
first plain).
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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ROWS = ("peft", "sglang-r8", "sglang-r16", "sglang-hit", "sglang-swap-in", "sglang-prepare",
        "sglang-prepare-bare", "vllm-r8", "vllm-r16", "vllm-add", "vllm-r8-first")
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

    if row.startswith("vllm"):
        return _vllm_row(row, tmp)

    from lora_guard.integrations import sglang as sglang_guard

    manager = h.sglang_server(max_loras_per_batch=4, max_lora_rank=16)
    if row in ("sglang-hit", "sglang-swap-in", "sglang-prepare", "sglang-prepare-bare"):
        call = _sglang_pool_row(row, manager, tmp)
        return call, None, _BareWrapper() if row == "sglang-prepare-bare" else sglang_guard
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
    if row.startswith("sglang-prepare"):
        manager.fetch_new_loras(batches[0])
        resident = batches[0]

        def prepare() -> None:  # as fetch_new_loras calls it: by keyword
            for _ in range(100):
                pool.prepare_lora_batch(
                    cur_uids=resident, lora_adapters=manager.loras,
                    lora_modules=manager.lora_modules, lora_refs=manager.lora_refs,
                    lora_embed_tokens_module=None, lora_lm_head_module=None)
        return prepare
    flip = [0]

    def swap_in() -> None:
        flip[0] ^= 1
        manager.fetch_new_loras(batches[flip[0]])
    return swap_in


class _BareWrapper:
    """The ``sglang-prepare-bare`` row's "instrumented" arm: the cheapest Python wrapper
    around sglang's ``LoRAMemoryPool.prepare_lora_batch`` (its own parameters, by name,
    passed on by position; nothing checked): the least any check made before sglang's
    code runs costs on that call."""

    def instrument(self) -> None:
        from sglang.srt.lora.mem_pool import LoRAMemoryPool

        self.uninstrument()
        original = LoRAMemoryPool.prepare_lora_batch

        def prepare_lora_batch(self: Any, cur_uids: Any, lora_adapters: Any,
                               lora_modules: Any, lora_refs: Any,
                               lora_embed_tokens_module: Any,
                               lora_lm_head_module: Any) -> Any:
            return original(self, cur_uids, lora_adapters, lora_modules, lora_refs,
                            lora_embed_tokens_module, lora_lm_head_module)
        prepare_lora_batch.__wrapped__ = original  # type: ignore[attr-defined]
        LoRAMemoryPool.prepare_lora_batch = prepare_lora_batch

    def uninstrument(self) -> None:
        from sglang.srt.lora.mem_pool import LoRAMemoryPool

        installed = LoRAMemoryPool.prepare_lora_batch
        LoRAMemoryPool.prepare_lora_batch = getattr(installed, "__wrapped__", installed)


def _vllm_row(row: str, tmp: Path) -> tuple[Callable[[], Any], Callable[[], Any] | None, Any]:
    import _harness as h

    from lora_guard._checking.rules.context import _GUARDED
    from lora_guard.integrations import vllm as vllm_guard

    worker = h.vllm_server(h.vllm_base_dir(tmp), max_lora_rank=16, max_loras=4, max_cpu_loras=8)
    rank = 16 if row == "vllm-r16" else 8
    path = str(h.peft_adapter(tmp / f"v-r{rank}", r=rank, seed=rank))
    time.sleep(2.1)  # an adapter deployed earlier: lora_guard keeps no stamp of a folder
    if row == "vllm-add":
        request = h.vllm_request("extra", 50, path)
        return (lambda: worker.add_adapter(request)), (lambda: worker.remove_adapter(50)), \
            vllm_guard

    load = h.vllm_checkpoint_load(worker, path)

    def forget() -> None:  # a first load: its verdict and its module pass not remembered
        vllm_guard._CLEAN.clear()
        _GUARDED.clear()
    return load, forget if row == "vllm-r8-first" else None, vllm_guard


_WARM = {"sglang-swap-in": 200}
"""Warm-up calls after each switch, where 3 are too few: instrument() and uninstrument()
replace class attributes, which drops the interpreter's specializations of the engine's code
that reads them; a path that runs each of its lines once a call (a swap) takes some hundred
calls to be re-specialized (the plain arm right after a switch: 2-3 % more instructions)."""


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
            for _ in range(_WARM.get(row, 3)):
                one()
            cg.cg_zero()
            for _ in range(calls):
                one()
            cg.cg_dump(arm.encode())
        guard.uninstrument()


def callgrind_counts(script: str, argv: list[str], calls: int, *,
                     cache_sim: bool = False) -> list[tuple[str, float]] | int:
    """Run ``script argv --calls N --client SO`` under callgrind (instrumentation off until
    the script's client requests toggle it) and read each dump it asks for: (the dump's
    name, instructions per call), in dump order; or an exit code when it cannot run. With
    ``cache_sim``, each dump's name is followed by its simulated cache misses per call:
    (name + " I1 miss", n), (name + " D1 miss", n), (name + " LL miss", n)."""
    if not shutil.which("valgrind") or not shutil.which("cc"):
        print("needs valgrind and a C compiler (cc) with valgrind/callgrind.h", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="lora-guard-callgrind-") as folder:
        tmp = Path(folder)
        (tmp / "client.c").write_text(_CLIENT)
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tmp / "client.so"),
                        str(tmp / "client.c")], check=True)
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no",
             *(["--cache-sim=yes"] if cache_sim else []),
             f"--callgrind-out-file={tmp}/out.%p", sys.executable, script, *argv,
             "--calls", str(calls), "--client", str(tmp / "client.so")],
            env={**os.environ, "PYTHONHASHSEED": "0"}, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True)
        if done.returncode:
            print(done.stderr[-3000:], file=sys.stderr)
            return done.returncode
        counts: list[tuple[str, float]] = []
        for dump in sorted(tmp.glob("out.*.*"), key=lambda p: int(p.name.rsplit(".", 1)[1])):
            text = dump.read_text()
            name = re.search(r"^desc: Trigger: Client Request: (\S+)", text, re.M)
            # the part's own cost (callgrind_annotate's PROGRAM TOTALS); the "totals:" line
            # at the end also holds cost from before the zeroing (25 % more after 300
            # warm-up calls of sglang-swap-in, none of it the arm's)
            total = re.search(r"^summary: ([\d ]+)", text, re.M)
            events = re.search(r"^events: (.+)$", text, re.M)
            if name and total and events:
                found = dict(zip(events.group(1).split(), map(int, total.group(1).split()),
                                 strict=False))
                counts.append((name.group(1), found["Ir"] / calls))
                if cache_sim:
                    counts += [
                        (f"{name.group(1)} I1 miss", found["I1mr"] / calls),
                        (f"{name.group(1)} D1 miss", (found["D1mr"] + found["D1mw"]) / calls),
                        (f"{name.group(1)} LL miss", (found["ILmr"] + found["DLmr"]
                                                      + found["DLmw"]) / calls)]
        return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("row", choices=ROWS)
    parser.add_argument("--calls", type=int, default=20, help="calls per arm (default 20)")
    parser.add_argument("--cache-sim", action="store_true",
                        help="also simulate the caches: each arm's misses per call and an "
                             "estimate of its cycles (Ir + 10 x L1 misses + 100 x LL misses)")
    parser.add_argument("--client", help=argparse.SUPPRESS)  # set when run under valgrind
    args = parser.parse_args()
    if args.client:
        measure(args.row, args.calls, args.client)
        return 0
    counts = callgrind_counts(__file__, [args.row], args.calls, cache_sim=args.cache_sim)
    if isinstance(counts, int):
        return counts
    print(f"## {args.row}: instructions per call ({args.calls} calls an arm, callgrind)")
    for arm, count in counts:
        print(f"{arm:<16} {count:14,.0f}")
    found = dict(enumerate(counts))
    arms = [(i, arm, count) for i, (arm, count) in found.items() if arm in ARMS]
    plain = [c for _, a, c in arms if a == "plain"]
    guarded = [c for _, a, c in arms if a == "guarded"]
    ratios = " ".join(f"{g / p:.3f}" for p, g in zip(plain, guarded, strict=True))
    print(f"ratio instrumented / plain, per pair: {ratios}; "
          f"A/A floor (plain again / plain): {plain[1] / plain[0]:.3f}")
    if args.cache_sim:  # each arm's dump is followed by its I1, D1 and LL misses
        cycles = {i: c + 10 * (found[i + 1][1] + found[i + 2][1]) + 100 * found[i + 3][1]
                  for i, _, c in arms}
        plain_c = [cycles[i] for i, a, _ in arms if a == "plain"]
        guarded_c = [cycles[i] for i, a, _ in arms if a == "guarded"]
        ratios = " ".join(f"{g / p:.3f}" for p, g in zip(plain_c, guarded_c, strict=True))
        print(f"estimated cycles per call: {' '.join(f'{c:,.0f}' for c in cycles.values())}; "
              f"ratio per pair: {ratios}; A/A floor: {plain_c[1] / plain_c[0]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
