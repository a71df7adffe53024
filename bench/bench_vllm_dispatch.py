"""vLLM's per-step activation: plain, plain again (A/A), one Python call, lora_guard's guard.

    PYTHONPATH=src $LORA_GUARD_ENGINES_VENV/bin/python bench/bench_vllm_dispatch.py [rounds]

The first row of ``bench_engine_paths.py`` (``set_active_adapters`` of 4 resident adapters,
an unchanged batch) with two more arms: plain again (the noise floor of the method), and
``LoRAModelManager.activate_adapter`` replaced by a bare Python function that calls the
original (``def f(self, lora_id): return original(self, lora_id)``): the floor of any guard
written in Python on a method vLLM calls once per adapter per step. 45 rounds of 300 steps
(or ``rounds``), the arms' order rotating; the best round, the 10th percentile and the
median of each arm, each as a ratio to plain's.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_engine_paths as paths


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        rows, switch = paths.vllm_rows(Path(folder))  # sets vLLM's CPU platform up first
        from vllm.lora import model_manager

        step = rows[0].call("plain")
        owner = model_manager.LoRAModelManager
        original = owner.__dict__["activate_adapter"]

        def one_call(self: Any, lora_id: Any) -> Any:
            return original(self, lora_id)

        def arm(name: str) -> None:
            switch("guarded" if name == "lora_guard" else "plain")
            if name == "one call":
                owner.activate_adapter = one_call

        times: dict[str, list[float]] = {
            "plain": [], "plain again": [], "one call": [], "lora_guard": []}
        names = list(times)
        rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 45
        for r in range(rounds):
            for name in names[r % 4:] + names[:r % 4]:
                arm(name)
                for _ in range(50):
                    step()
                gc.disable()
                start = time.perf_counter()
                for _ in range(300):
                    step()
                times[name].append((time.perf_counter() - start) / 300)
                gc.enable()
        arm("plain")
    base = sorted(times["plain"])
    for name, found in times.items():
        found.sort()
        p10, median = found[len(found) // 10], statistics.median(found)
        print(f"{name:<12} best {found[0] * 1e6:6.2f} us ({found[0] / base[0]:.3f}x)   p10 "
              f"{p10 * 1e6:6.2f} us ({p10 / base[len(base) // 10]:.3f}x)   median "
              f"{median * 1e6:6.2f} us ({median / statistics.median(base):.3f}x)", flush=True)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
