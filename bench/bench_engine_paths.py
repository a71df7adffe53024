"""What lora_guard's integrations cost on the engines' own paths, side by side in one process.

    python bench/bench_engine_paths.py [--only GROUP] [--match TEXT]
                                       [--rounds N] [--quick]

Runs in the engine environment (real vLLM 0.34.0 and sglang 0.5.23 on a CPU, tiny Llama from
``tests/engines/_harness.py``), e.g.
``LORA_GUARD_ENGINES_VENV=/work/ci-base/.venv-engines-ci`` then
``PYTHONPATH=src $LORA_GUARD_ENGINES_VENV/bin/python bench/bench_engine_paths.py``.
Each engine runs in a process of its own (the two engines set process-wide state the other
misreads); the ``peft`` and ``guards`` groups run anywhere PEFT / torch are installed.

Method, for every row: three arms, the engine plain (``uninstrument()``), instrumented
(``instrument()``), and plain again; the arms alternate round by round (their order rotates),
each switch is followed by warm-up calls, and the garbage collector is paused while an arm is
timed. A row prints the time of the plain arm, the instrumented arm, and two ratios:
``ratio`` = instrumented / plain and ``floor`` = plain again / plain, the noise of the method
itself on this row (a ratio inside the floor's distance from 1.00 is nothing measurable).
Each arm's best round and median round are printed; the ratio (and the floor) of the best
rounds is the verdict's, the ratio of the median rounds is beside it in brackets; the load
average is printed after each group (the machine may be shared). Rows whose engine path is
short are timed in loops; loads are timed call by call, with the undo (unload, remove)
outside the timing. ``--quick`` is a smoke run.

Groups: guards, peft, sglang, vllm, vllm-field, sglang-field. The ``*-field`` groups time
the engine loading adapters of a field size (r16, on a base of Llama-3.2-1B's dimensions),
first of their kind, of a recipe seen, and remembered, then the check's own time inside the
loads (`_field_rows`): the other groups' toy adapters weigh a few kB, the worst case of a
load's ratio.

The ``guards`` row compares `lora_guard.shapes` with the same checks written by hand (the
arms are the two callables). ``GuardedCache.get`` against ``dict.get`` is
``bench/bench_guards.py``'s (timed as statement strings: a call around a 20 ns lookup would
hide half the gap).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "engines"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@dataclass
class Row:
    """One path: the call, timed per arm, and its target (ratio instrumented / plain)."""

    name: str
    target: float
    op: Callable[[], Any] | dict[str, Callable[[], Any]]
    undo: Callable[[], Any] | None = None
    """Run after each timed call, outside the timing (a load's unload)."""
    number: int = 1000
    around: tuple[Callable[[], Any], Callable[[], Any]] | None = None
    """Untimed set-up and tear-down around each timed run of the row."""
    times: dict[str, list[float]] = field(default_factory=dict)

    def call(self, arm: str) -> Callable[[], Any]:
        return self.op[arm] if isinstance(self.op, dict) else self.op


ARMS = ("plain", "guarded", "plain again")


def _timed(row: Row, arm: str, number: int) -> float:
    """Seconds per call of the row's arm, the collector paused."""
    call = row.call(arm)
    if row.around is not None:
        row.around[0]()
    gc.collect()
    gc.disable()
    try:
        if row.undo is None:
            clock = time.perf_counter
            start = clock()
            for _ in range(number):
                call()
            return (clock() - start) / number
        total = 0.0
        for _ in range(number):
            start = time.perf_counter()
            call()
            total += time.perf_counter() - start
            row.undo()
        return total / number
    finally:
        gc.enable()
        if row.around is not None:
            row.around[1]()


def run_rows(rows: list[Row], switch: Callable[[str], None] | None, rounds: int,
             warm: int, scale: float) -> None:
    """Time every row's three arms, alternating round by round (see the module docstring)."""
    for r in range(rounds):
        order = ARMS[r % 3:] + ARMS[:r % 3]
        for arm in order:
            if switch is not None:
                switch(arm)
            for row in rows:
                number = max(1, int(row.number * scale))
                _timed(row, arm, max(1, min(warm, number)))  # warm-up after the switch
                row.times.setdefault(arm, []).append(_timed(row, arm, number))
    if switch is not None:
        switch("plain")


def _fmt(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us:,.2f} us" if us < 100 else f"{us:,.0f} us"


def report_rows(group: str, rows: list[Row], labels: tuple[str, str] = ("plain",
                                                                       "instrumented")) -> None:
    print(f"\n## {group}  ({labels[0]} -> {labels[1]}: each arm's best round [its median "
          f"round]; ratio and A/A floor of the best rounds [of the medians])")
    print(f"{'path':<58} {labels[0]:>21} {labels[1]:>21} {'ratio':>12} {'A/A floor':>12} "
          f"{'target':>7}")
    for row in rows:
        plain, guarded, again = (row.times[a] for a in ARMS)
        med = {a: statistics.median(row.times[a]) for a in ARMS}
        best, best_floor = min(guarded) / min(plain), min(again) / min(plain)
        ratio, floor = med["guarded"] / med["plain"], med["plain again"] / med["plain"]
        verdict = "met" if best <= row.target else "NOT met"
        print(f"{row.name:<58} {_fmt(min(plain)):>10} [{_fmt(med['plain']):>9}] "
              f"{_fmt(min(guarded)):>10} [{_fmt(med['guarded']):>9}] "
              f"{best:5.2f} [{ratio:4.2f}] {best_floor:5.2f} [{floor:4.2f}] "
              f"<={row.target:.2f} {verdict}", flush=True)
    print(f"load average after the group: {_load()}", flush=True)


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


# --- the engines ---------------------------------------------------------------------------

def vllm_rows(tmp: Path) -> tuple[list[Row], Callable[[str], None]]:
    import _harness as h
    import torch

    from lora_guard.integrations import vllm as guard

    env = h.vllm_env()
    base = h.vllm_base_dir(tmp)
    worker = h.vllm_server(base, max_lora_rank=16, max_loras=4, max_cpu_loras=8)
    paths = {r: h.peft_adapter(tmp / f"v-r{r}", r=r, seed=r) for r in (8, 16)}
    four = [h.vllm_request(f"a{i}", i + 1, h.peft_adapter(tmp / f"v-a{i}", r=8, seed=i))
            for i in range(4)]
    requests = set(four)
    for request in four:
        worker.add_adapter(request)
    mappings = [_vllm_mapping(env, ids) for ids in ((1, 2, 3, 4), (4, 3, 2, 1))]
    flip = [0]

    def new_mapping() -> None:
        flip[0] ^= 1
        worker.set_active_adapters(requests, mappings[flip[0]])

    def from_checkpoint(rank: int) -> Callable[[], Any]:
        return h.vllm_checkpoint_load(worker, paths[rank])

    extra = h.vllm_request("extra", 50, paths[16])
    worker.set_active_adapters(requests, mappings[0])

    def add() -> None:
        worker.add_adapter(extra)

    def remove() -> None:
        worker.remove_adapter(50)
        worker.set_active_adapters(requests, mappings[flip[0]])  # the 4 back in their slots

    del torch
    rows = [
        Row("vLLM set_active_adapters, 4 adapters, unchanged batch", 1.02,
            lambda: worker.set_active_adapters(requests, mappings[flip[0]]), number=2000),
        Row("vLLM set_active_adapters, 4 adapters, new mapping", 1.02, new_mapping,
            number=500),
        Row("vLLM LoRAModel.from_local_checkpoint r8 (+PEFTHelper)", 1.10,
            from_checkpoint(8), number=60),
        Row("vLLM LoRAModel.from_local_checkpoint r16 (+PEFTHelper)", 1.10,
            from_checkpoint(16), number=60),
        Row("vLLM worker add_adapter (load + add + activate)", 1.10, add, undo=remove,
            number=60),
    ]

    CHECKER_WORK.append(("vLLM", paths[8], guard._server(worker).limits))
    return rows, _switch(guard)


FIELD_BASE = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                  num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                  tie_word_embeddings=True)
"""A base of Llama-3.2-1B's dimensions (the ``vllm-field`` group; its weights never read)."""
FIELD_TARGETS = {"all linear": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                "up_proj", "down_proj"),
                 "q/v": ("q_proj", "v_proj")}


def _field_adapters(tmp: Path) -> dict[str, Path]:
    """The field adapters (`FIELD_TARGETS`), r16 on `FIELD_BASE`, written as PEFT writes
    them (tensor data zeros: a load's time does not depend on the values; ``lora_alpha`` = r,
    so that vLLM scales no weight: the cheapest load, the guard's largest share of it)."""
    from lora_guard.testing import write_adapter

    dims = {k: FIELD_BASE[k] for k in ("hidden_size", "intermediate_size", "vocab_size")}
    paths = {label: write_adapter(
        tmp / f"field-{i}", rank=16, alpha=16, targets=targets, dtype="bfloat16",
        layers=FIELD_BASE["num_hidden_layers"], num_heads=FIELD_BASE["num_attention_heads"],
        num_kv_heads=FIELD_BASE["num_key_value_heads"], base_model="llama-1b-dims", **dims)
        for i, (label, targets) in enumerate(FIELD_TARGETS.items())}
    time.sleep(2.1)  # adapters deployed earlier: lora_guard keeps their folders' stamps
    return paths


def _field_rows(engine: str, guard: Any, check: str,
                load: Callable[[str], Callable[[], Any]],
                unload: Callable[[str], Callable[[], Any]],
                ) -> tuple[list[Row], Callable[[str], None]]:
    """The load rows of a ``*-field`` group, and its report of the check inside the loads.

    "first of its kind": every memory lora_guard keeps (verdicts, module passes, the
    reader's caches) emptied before each load, so each instrumented load runs every check
    from nothing, as on the first adapter of its base, rank and modules a server loads;
    "recipe seen": only the verdicts forgotten (a new adapter of a recipe loaded before);
    "remembered": an adapter loaded before. After each load, outside the timing, the
    adapter is unloaded and the collector's youngest generation run (a loaded adapter holds
    reference cycles: without it each load would fault in fresh memory, a cost a server
    does not pay). ``check``: the integration's function that checks what the engine read,
    timed inside the loads (`AFTER_GROUP`)."""
    from lora_guard._reading.bounded import forget_all

    forgets = {"first of its kind": forget_all, "recipe seen": guard._CLEAN.clear,
               "remembered": lambda: None}

    def undo(label: str, forget: Callable[[], Any]) -> Callable[[], Any]:
        def remove() -> None:
            unload(label)()
            gc.collect(0)  # the load's cycles are young: a full collection takes 0.3 s here
            forget()
        return remove

    rows = [Row(f"{engine}, 1B base, r16 {label}, {when}", 1.10, load(label),
                undo=undo(label, forgets[when]), number=10)
            for label, when in (("all linear", "first of its kind"),
                                ("q/v", "first of its kind"), ("q/v", "recipe seen"),
                                ("all linear", "remembered"))]

    def checks_in_load(scale: float) -> None:
        """The check's own time inside each real load (no A/B arms: a timer around the
        integration's check as the engine's load calls it), beside the load's: what the
        arms above measure with their noise, read directly."""
        real, spent = getattr(guard, check), []

        def timed(*args: Any) -> None:
            start = time.perf_counter()
            try:
                real(*args)
            finally:
                spent.append(time.perf_counter() - start)

        calls = max(5, int(50 * scale))
        guard.instrument()
        setattr(guard, check, timed)
        print(f"\n## {engine}: the check's own time ({check}) inside a guarded load (median "
              f"of {calls} loads after 10; the load's median beside it)")
        try:
            for label in FIELD_TARGETS:
                for when, forget in forgets.items():
                    spent.clear()
                    loads = []
                    for _ in range(10 + calls):
                        gc.disable()
                        start = time.perf_counter()
                        load(label)()
                        loads.append(time.perf_counter() - start)
                        gc.enable()
                        undo(label, forget)()
                    took = statistics.median(spent[10:])
                    whole = statistics.median(loads[10:])
                    print(f"r16 {label:<11} {when:<18} check {_fmt(took):>10} in a load of "
                          f"{_fmt(whole):>10}: {took / (whole - took):.3f} of the rest",
                          flush=True)
        finally:
            setattr(guard, check, real)
            guard.uninstrument()

    AFTER_GROUP.append(checks_in_load)
    return rows, _switch(guard)


def vllm_field_rows(tmp: Path) -> tuple[list[Row], Callable[[str], None]]:
    """The ``vllm`` group's load rows at a field size (`_field_rows`): a worker serving a
    base of Llama-3.2-1B's dimensions (bfloat16, rank up to 16) adding the field adapters
    (`_field_adapters`: all linear modules, 112 modules, 22.6 MB; q/v, 32 modules, 3.4 MB;
    at alpha 2r vLLM would scale the all-linear adapter's 22.6 MB of bfloat16, a load four
    times as long). The toy rows of the ``vllm`` group are the worst case of the ratio (a
    few kB of tensors); these say what a load in the field pays."""
    import _harness as h

    from lora_guard.integrations import vllm as guard

    worker = h.vllm_server(h.vllm_base_dir(tmp, h.llama_config(**FIELD_BASE)),
                           max_lora_rank=16, max_loras=4, max_cpu_loras=8, dtype="bfloat16")
    requests = {label: h.vllm_request(f"field-{i}", 60 + i, path)
                for i, (label, path) in enumerate(_field_adapters(tmp).items())}
    return _field_rows(
        "vLLM add_adapter", guard, "_check_loaded",
        lambda label: lambda: worker.add_adapter(requests[label]),
        lambda label: lambda: worker.remove_adapter(requests[label].lora_int_id))


def sglang_field_rows(tmp: Path) -> tuple[list[Row], Callable[[str], None]]:
    """The ``sglang`` group's load rows at a field size (`_field_rows`): a ``LoRAManager``
    serving a base of Llama-3.2-1B's dimensions (bfloat16, every linear module a target,
    rank up to 16) loading the field adapters (`_field_adapters`)."""
    import _harness as h
    import torch

    from lora_guard.integrations import sglang as guard

    manager = h.sglang_server(base=h.llama_config(**FIELD_BASE), dtype=torch.bfloat16,
                              target_modules=set(FIELD_TARGETS["all linear"]),
                              max_lora_rank=16, max_loras_per_batch=4)
    refs = {label: h.sglang_ref(f"field-{i}", path)
            for i, (label, path) in enumerate(_field_adapters(tmp).items())}

    def load(label: str) -> Callable[[], Any]:
        def call() -> None:
            assert manager.load_lora_adapter(refs[label]).success
        return call

    return _field_rows(
        "sglang load_lora_adapter", guard, "_check_read", load,
        lambda label: lambda: manager.unload_lora_adapter(refs[label]))


def _vllm_mapping(env: Any, ids: tuple[int, ...]) -> Any:
    from vllm.lora.layers import LoRAMapping

    index = tuple(i for i in ids for _ in range(4))
    return LoRAMapping(index, ids, is_prefill=False)


def sglang_rows(tmp: Path) -> tuple[list[Row], Callable[[str], None]]:
    import _harness as h
    import torch

    from lora_guard.integrations import sglang as guard

    names = [f"s{i}" for i in range(4)]
    manager = h.sglang_server(max_loras_per_batch=4, max_lora_rank=16)
    for i, name in enumerate(names):
        path = h.peft_adapter(tmp / name, r=8, seed=i)
        assert manager.load_lora_adapter(h.sglang_ref(name, path)).success
    pool = manager.memory_pool
    batch = _sglang_batch(names)
    resident = set(names)
    manager.fetch_new_loras(resident)

    def step() -> None:
        manager.fetch_new_loras(resident)
        manager.prepare_lora_batch(batch)

    def pool_prepare() -> None:
        pool.prepare_lora_batch(cur_uids=resident, lora_adapters=manager.loras,
                                lora_modules=manager.lora_modules,
                                lora_refs=manager.lora_refs, lora_embed_tokens_module=None,
                                lora_lm_head_module=None)

    pinned_hit = _sglang_pinned_row(manager, names[0])
    swap_in = h.peft_adapter(tmp / "swap", r=8, seed=9)
    assert manager.load_lora_adapter(h.sglang_ref("swap", swap_in)).success
    cycle = [0]

    def swap_one() -> None:
        # one adapter of the next batch is not resident: sglang evicts one and loads it
        cycle[0] ^= 1
        manager.fetch_new_loras({"swap", *names[1:]} if cycle[0] else resident)

    refs = {r: h.peft_adapter(tmp / f"load-r{r}", r=r, seed=r) for r in (8, 16)}
    CHECKER_WORK.append(("sglang", refs[8], guard._limits(manager)))
    weight_row = _sglang_weight_row(manager, h.peft_adapter(tmp / "hook", r=8, seed=7))

    del torch

    rows = [
        Row("sglang step: fetch_new_loras + prepare_lora_batch (4 resident)", 1.02, step,
            number=500),
        Row("sglang LoRAMemoryPool.prepare_lora_batch alone", 1.02, pool_prepare,
            number=3000),
        pinned_hit,
        Row("sglang fetch_new_loras swapping one adapter in", 1.10, swap_one, number=200),
        *(_sglang_load_row(manager, rank, path) for rank, path in refs.items()),
        weight_row,
    ]

    return rows, _switch(guard)


def _switch(guard: Any) -> Callable[[str], None]:
    """The arms: the integration instrumented, or not."""
    def switch(arm: str) -> None:
        if arm == "guarded":
            guard.instrument()
        else:
            guard.uninstrument()
    return switch


def _sglang_load_row(manager: Any, rank: int, path: Path) -> Row:
    import _harness as h

    def load() -> None:
        assert manager.load_lora_adapter(h.sglang_ref(f"load{rank}", path)).success

    def unload() -> None:
        manager.unload_lora_adapter(h.sglang_ref(f"load{rank}", path))

    return Row(f"sglang load_lora_adapter r{rank}", 1.10, load, undo=unload, number=40)


def _sglang_weight_row(manager: Any, path: Path) -> Row:
    """``LoRAAdapter._process_weight`` of one tensor, as a load calls it for each tensor it
    read (on an adapter loaded for this row alone: the call writes the tensor into it)."""
    import _harness as h
    from safetensors.torch import load_file

    assert manager.load_lora_adapter(h.sglang_ref("hook", path)).success
    adapter = manager.loras[next(uid for uid, ref in manager.lora_refs.items()
                                 if ref.lora_name == "hook")]
    name, weight = next(iter(load_file(str(path / "adapter_model.safetensors")).items()))
    return Row("sglang LoRAAdapter._process_weight, one tensor of a load", 1.10,
               lambda: adapter._process_weight(name, weight), number=3000)


def _sglang_pinned_row(manager: Any, name: str) -> Row:
    """A hit in an adapter layer's own pinned store, the engine consulting it (pinning
    available, overlap loading on: set around the timing only, as the tier's test does).
    On sglang 0.5.23, which refuses a stale hit itself, the instrumented arm calls sglang's
    own method (the guard reports that refusal at the swap-in), so this row is its floor."""
    pool = manager.memory_pool
    layer = manager.loras[name].layers[0]
    key, weight = next(iter(layer.weights.items()))
    store = {key: weight.clone()}

    def consult(on: bool) -> Callable[[], None]:
        def call() -> None:
            pool.pin_memory_available = on
            pool.enable_lora_overlap_loading = on
        return call

    def pinned_hit() -> None:
        pool._get_maybe_cached_weight_for_transfer(store, key, weight)

    return Row("sglang pinned-weight cache lookup (a hit)", 1.02, pinned_hit, number=20000,
               around=(consult(True), consult(False)))


def _sglang_batch(names: list[str]) -> Any:
    import types

    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    lora_ids = [names[i % len(names)] for i in range(8)]
    return types.SimpleNamespace(
        lora_ids=lora_ids, batch_size=len(lora_ids), forward_mode=ForwardMode.DECODE,
        extend_seq_lens=None, extend_seq_lens_cpu=None, seq_lens=torch.ones(len(lora_ids),
                                                                           dtype=torch.int32),
        seq_lens_cpu=torch.ones(len(lora_ids), dtype=torch.int32), input_ids=torch.zeros(
            len(lora_ids), dtype=torch.int64))


def peft_rows(tmp: Path) -> tuple[list[Row], Callable[[str], None]]:
    import _harness as h
    import torch
    from peft import PeftModel
    from peft.utils import hotswap
    from transformers import AutoModelForCausalLM

    from lora_guard.integrations import peft as guard

    torch.manual_seed(0)
    config = h.llama_config(num_hidden_layers=4)
    a = h.peft_adapter(tmp / "p-a", base=config, r=8, seed=1)
    b = h.peft_adapter(tmp / "p-b", base=config, r=8, seed=2)
    swap_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_config(config), str(a))
    targets = [a, b]
    flip = [0]

    def swap() -> None:
        flip[0] ^= 1
        hotswap.hotswap_adapter(swap_model, str(targets[flip[0]]), adapter_name="default",
                                torch_device="cpu")

    load_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_config(config), str(a))

    def load() -> None:
        load_model.load_adapter(str(b), adapter_name="other")
        load_model.set_adapter("other")

    def unload() -> None:
        load_model.set_adapter("default")
        load_model.delete_adapter("other")

    rows = [
        Row("PEFT hotswap_adapter (4-layer Llama, r8)", 1.10, swap, number=60),
        Row("PEFT load_adapter + set_adapter", 1.10, load, undo=unload, number=40),
    ]

    return rows, _switch(guard)


# --- the guards beside the same checks by hand ---------------------------------------------

def guard_rows() -> list[Row]:
    sys.path.insert(0, str(ROOT / "bench"))
    import torch
    from bench_guards import GuardedSink, HandCheckedSink

    moe = (torch.empty(8, 1, 32, 2048, device="meta"),
           torch.empty(8, 64, 1536, 16, device="meta"),
           torch.empty(8, 64, 16, 768, device="meta"),
           torch.empty(8, 1, 2048, 16, device="meta"))
    hand, guarded = HandCheckedSink(), GuardedSink()
    hand.set_lora_info(*moe)
    guarded.set_lora_info(*moe)
    hand_call, guarded_call = hand.set_lora_info, guarded.set_lora_info

    def by_hand() -> None:
        hand_call(*moe)

    def with_shapes() -> None:
        guarded_call(*moe)

    return [
        Row("@lg.shapes, 4 tensors + where=, vs the same checks by hand", 1.00,
            {"plain": by_hand, "guarded": with_shapes, "plain again": by_hand},
            number=20000),
    ]


CHECKER_WORK: list[tuple[str, Path, Any]] = []
AFTER_GROUP: list[Callable[[float], None]] = []
"""Reports a group adds, run after its rows (given the run's scale)."""
"""(engine, an r8 adapter, the server's limits): the checker's work on one adapter, read from
its folder and checked, as a load guard that reads the folder does it (sglang's; a vLLM load
and a PEFT hot-swap check what the engine read instead of reading the folder)."""


def report_checker_work() -> None:
    import timeit

    from lora_guard._checking.check_adapters import spec_violations
    from lora_guard.integrations._base import local_adapter

    for engine, path, limits in CHECKER_WORK:
        spec, _ = local_adapter(path, "adapter")
        assert spec is not None
        read = min(timeit.repeat(lambda p=path: local_adapter(p, "adapter"), number=200,
                                 repeat=7)) / 200
        check = min(timeit.repeat(
            lambda s=spec, lim=limits: spec_violations(s, lim, subject="adapter"),
            number=200, repeat=7)) / 200
        print(f"{engine}: the checker's read of an r8 adapter's config + header {_fmt(read)}, "
              f"its checks {_fmt(check)} (best of 7, alone, outside a load)", flush=True)


# --- driver ------------------------------------------------------------------------------------

GROUPS = ("guards", "peft", "sglang", "vllm", "vllm-field", "sglang-field")


def run_group(group: str, rounds: int, scale: float, match: str | None = None) -> None:
    with tempfile.TemporaryDirectory(prefix=f"lora-guard-bench-{group}-") as folder:
        tmp = Path(folder)
        if group == "guards":
            rows = guard_rows()
            run_rows(rows, None, rounds, warm=200, scale=scale)
            report_rows("guards beside the same work by hand", rows,
                        labels=("by hand", "lora_guard"))
            return
        build = {"vllm": vllm_rows, "vllm-field": vllm_field_rows, "sglang": sglang_rows,
                 "sglang-field": sglang_field_rows, "peft": peft_rows}[group]
        rows, switch = build(tmp)
        if match is not None:  # a row alone, for more rounds (a short path's clock)
            rows = [row for row in rows if match in row.name]
        run_rows(rows, switch, rounds, warm=20, scale=scale)
        report_rows(group, rows)
        if match is None:
            report_checker_work()
            for report in AFTER_GROUP:
                report(scale)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=GROUPS, help="one group, in this process")
    parser.add_argument("--match", help="with --only: the rows whose name holds TEXT")
    parser.add_argument("--rounds", type=int, default=9, help="rounds per arm (default 9)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few calls")
    args = parser.parse_args()
    scale = 0.05 if args.quick else 1.0
    rounds = 3 if args.quick else args.rounds
    if args.only:
        run_group(args.only, rounds, scale, args.match)
        return 0
    print(f"# bench_engine_paths: {rounds} rounds per arm; python {sys.version.split()[0]}; "
          f"load average {_load()}")
    failed = 0
    for group in GROUPS:  # each group in a process of its own (the engines' global state)
        command = [sys.executable, __file__, "--only", group, "--rounds", str(rounds)]
        failed |= subprocess.call(command + (["--quick"] if args.quick else []))
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
