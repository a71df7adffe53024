"""Where the clock of a guarded vLLM load goes: its parts taken out one at a time, side by side.

    python bench/bench_vllm_load_parts.py [--rounds N] [--calls N] [--arms A,B,...]

Runs in the engine environment (as ``bench/bench_engine_paths.py``), e.g.
``PYTHONPATH=src $LORA_GUARD_ENGINES_VENV/bin/python bench/bench_vllm_load_parts.py``.
The call is the ``from_local_checkpoint r8 (+PEFTHelper)`` row of ``bench_engine_paths.py``
(vLLM 0.34.0 on the CPU, the engine tier's tiny Llama, an adapter loaded before: its clean
verdict is remembered). Arms, alternating round by round in one process (their order
rotates; warm-up calls after each switch; the collector paused while an arm runs):

- ``plain``: ``uninstrument()``; ``plain-again``: the same, the method's own noise;
- ``guarded``: ``instrument()``;
- ``no-check``: guarded, the check of what vLLM read (``_check_loaded``) a no-op: the hooks'
  dispatch and bodies alone;
- ``no-key``: guarded, ``read_key`` giving back a key made before (its marshal, the tensors'
  shapes and dtypes, and the hashing of a new key not paid);
- ``no-folder``: guarded, the folder's look (one ``stat`` and its stamp) not made;
- ``no-limits``: guarded, the load's limits handed over ready;
- ``lookup-only``: the three above at once: the hooks and the verdict's look-up.

Printed per arm: best round, tenth-percentile round and median round (us a load), and the
best round's difference from ``plain``: each part's clock is the difference between
``guarded`` and its arm. Perf counters are not available on the shared machine; callgrind
counts the instructions of the same load (``bench_callgrind_loads.py vllm-r8 [--cache-sim]``).
The ablations patch the integration's private names for the arm's duration only.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "engines"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ARMS = ("plain", "guarded", "no-check", "no-key", "no-folder", "no-limits", "lookup-only",
        "plain-again")


def _load_call(tmp: Path) -> Callable[[], Any]:
    import _harness as h

    worker = h.vllm_server(h.vllm_base_dir(tmp), max_lora_rank=16, max_loras=4,
                           max_cpu_loras=8)
    path = str(h.peft_adapter(tmp / "v-r8", r=8, seed=8))
    time.sleep(2.1)  # an adapter deployed earlier: its folder's stamp is kept
    return h.vllm_checkpoint_load(worker, path)


def _switcher(load: Callable[[], Any]) -> Callable[[str], None]:
    from lora_guard.integrations import _base
    from lora_guard.integrations import vllm as guard

    real = {"check": guard._check_loaded, "read_key": guard.read_key,
            "folder": _base.CleanVerdicts._folder_clean, "limits_for": guard._limits_for}
    kept: dict[str, Any] = {}

    def keep(config: Any, tensors: Any, *more: Any) -> Any:
        kept["key"] = real["read_key"](config, tensors, *more)
        return kept["key"]

    guard.instrument()
    guard.read_key = keep  # type: ignore[assignment]
    for _ in range(3):
        load()
    guard.read_key = real["read_key"]  # type: ignore[assignment]
    kept["limits"] = None

    def limits_for(expected: Any, **kwargs: Any) -> Any:  # the first load's, handed over
        if kept["limits"] is None:
            kept["limits"] = real["limits_for"](expected, **kwargs)
        return kept["limits"]

    def switch(arm: str) -> None:
        if arm.startswith("plain"):
            _ablate(guard, _base, real, ())
            guard.uninstrument()
            return
        guard.instrument()
        _ablate(guard, _base, {**real, "key": kept["key"], "limits": limits_for},
                _PARTS.get(arm, ()))
    return switch


_PARTS = {"no-check": ("check",), "no-key": ("key",), "no-folder": ("folder",),
          "no-limits": ("limits",), "lookup-only": ("key", "folder", "limits")}


def _ablate(guard: Any, base: Any, real: dict[str, Any], parts: tuple[str, ...]) -> None:
    """The integration with ``parts`` taken out (the rest, and every part for none, real)."""
    guard._check_loaded = ((lambda load, config, tensors: None) if "check" in parts
                           else real["check"])
    guard.read_key = (lambda config, tensors, *more: real["key"]) if "key" in parts \
        else real["read_key"]
    base.CleanVerdicts._folder_clean = ((lambda self, folder: True) if "folder" in parts
                                        else real["folder"])
    guard._limits_for = real["limits"] if "limits" in parts else real["limits_for"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="rounds per arm (default 30)")
    parser.add_argument("--calls", type=int, default=40, help="loads per round (default 40)")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated arms")
    args = parser.parse_args()
    arms = args.arms.split(",")
    unknown = sorted(set(arms) - set(ARMS))
    if unknown or "plain" not in arms:
        parser.error(f"--arms takes 'plain' and any of {', '.join(ARMS)}; got {unknown}")
    with tempfile.TemporaryDirectory(prefix="lora-guard-load-parts-") as folder:
        load = _load_call(Path(folder))
        switch = _switcher(load)
        times: dict[str, list[float]] = {arm: [] for arm in arms}
        for r in range(args.rounds):
            for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
                switch(arm)
                for _ in range(5):
                    load()
                gc.collect()
                gc.disable()
                start = time.perf_counter()
                for _ in range(args.calls):
                    load()
                times[arm].append((time.perf_counter() - start) / args.calls)
                gc.enable()
        switch("plain")
    base = min(times["plain"])
    print(f"## a remembered vLLM load (from_local_checkpoint r8 + PEFTHelper), "
          f"{args.rounds} rounds x {args.calls} loads an arm; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'arm':<12} {'best':>9} {'p10':>9} {'median':>9} {'best - plain':>13}")
    for arm in arms:
        found = sorted(times[arm])
        print(f"{arm:<12} {found[0] * 1e6:7.1f} us {found[len(found) // 10] * 1e6:6.1f} us "
              f"{statistics.median(found) * 1e6:6.1f} us {(found[0] - base) * 1e6:+10.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
