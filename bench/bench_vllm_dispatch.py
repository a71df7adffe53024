"""vLLM's per-step activation: plain, a guard that checks nothing, and lora_guard's guard.

    PYTHONPATH=src $LORA_GUARD_ENGINES_VENV/bin/python bench/bench_vllm_dispatch.py

The first row of ``bench_engine_paths.py`` (``set_active_adapters`` of 4 resident adapters,
an unchanged batch) with a third arm: ``LoRAModelManager.activate_adapter`` replaced by the
integrations' own dispatch around a pass-through wrapper, the floor of any guard on a method
vLLM calls once per adapter per step. 45 rounds of 300 steps, the arms' order rotating; the
best round, the 10th percentile and the median of each arm.
"""

from __future__ import annotations

import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_engine_paths as paths


def main() -> int:
    from vllm.lora import model_manager

    from lora_guard.integrations import _base

    with tempfile.TemporaryDirectory() as folder:
        rows, switch = paths.vllm_rows(Path(folder))
        step = rows[0].call("plain")
        owner = model_manager.LoRAModelManager
        original = owner.__dict__["activate_adapter"]

        class Active:
            _active = True

        def passthrough(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            return wrapped(*args, **kwargs)

        bare = _base._guarded(Active(), original, passthrough, method=True)  # type: ignore[arg-type]

        def arm(name: str) -> None:
            switch("guarded" if name == "lora_guard" else "plain")
            if name == "pass-through":
                owner.activate_adapter = bare
            elif name == "plain":
                owner.activate_adapter = original

        times: dict[str, list[float]] = {"plain": [], "pass-through": [], "lora_guard": []}
        names = list(times)
        for r in range(45):
            for name in names[r % 3:] + names[:r % 3]:
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
    best = min(times["plain"])
    for name, found in times.items():
        found.sort()
        print(f"{name:<13} best {found[0] * 1e6:6.2f} us ({found[0] / best:.2f}x)   p10 "
              f"{found[len(found) // 10] * 1e6:6.2f} us   median "
              f"{statistics.median(found) * 1e6:6.2f} us", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
