"""Overhead of ``pytest --lora-guard`` on a generated suite of 500 guarded tests.

Writes a throw-away suite (10 files x 50 tests; each test builds a guarded pool, calls its
``@lg.shapes`` method, stores into a ``GuardedCache`` and checks slot maps: guards that pass),
then runs it in fresh processes, alternating between:

- ``absent``:   ``-p no:lora_guard`` (the plugin not loaded at all),
- ``disabled``: the plugin installed but not enabled (what every pytest user pays),
- ``enabled``:  ``--lora-guard``.

Prints, for each, the CPU time of the session (collection + tests, in the pytest process)
and the wall time of the whole process, min and median over the runs, and the overhead of
``enabled`` over ``disabled`` (the plugin's per-test cost) and of ``disabled`` over ``absent``
(what merely installing the plugin costs). On a shared machine read the minimum: noise only
ever adds.

    python bench/bench_plugin.py [--tests 500] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

FILE = textwrap.dedent('''
    import pytest
    import torch
    import lora_guard as lg


    class Pool:
        @lg.shapes(a="slots 2*rank hidden", b="slots out rank", frozen=("slots", "rank"))
        def set_lora_info(self, a, b):
            self.a, self.b = a, b


    A = torch.empty(4, 32, 64, device="meta")
    B = torch.empty(4, 128, 16, device="meta")


    @pytest.mark.parametrize("n", range({per_file}))
    def test_guarded(n):
        pool = Pool()
        pool.set_lora_info(A, B)
        pool.set_lora_info(A, B)
        cache = lg.GuardedCache({{}})
        cache[f"w{{n}}"] = A
        cache[f"w{{n}}"] = A
        lg.check_slot_maps({{"a": 0, "b": 1}}, ["a", "b", None, None])
''')

# Times the session itself (collection + running the tests) in CPU seconds of this process,
# so that start-up (imports, page cache) and other processes' load count as little as possible.
CONFTEST = textwrap.dedent('''
    import os, time

    def pytest_sessionstart(session):
        session.config._bench_start = time.process_time()

    def pytest_sessionfinish(session):
        with open(os.environ["LG_BENCH_OUT"], "w") as f:
            f.write(str(time.process_time() - session.config._bench_start))
''')

# Plugins of this environment that have nothing to do with the measurement.
QUIET = ["-p", "no:hypothesispytest", "-p", "no:jaxtyping", "-p", "no:anyio",
         "-p", "no:cacheprovider", "-q"]
MODES = {
    "absent": ["-p", "no:lora_guard"],
    "disabled": [],
    "enabled": ["--lora-guard"],
}


def write_suite(root: Path, tests: int, files: int = 10) -> None:
    per_file = tests // files
    for i in range(files):
        (root / f"test_guarded_{i}.py").write_text(FILE.format(per_file=per_file))
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "conftest.py").write_text(CONFTEST)


def run(root: Path, args: list[str]) -> tuple[float, float]:
    """Wall time of one pytest process, and the CPU time of its session."""
    out = root / "session.txt"
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", *QUIET, *args], cwd=root,
                          capture_output=True, text=True, check=False,
                          env={**os.environ, "LG_BENCH_OUT": str(out)})
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"suite failed under {args}:\n{done.stdout[-2000:]}{done.stderr}")
    return elapsed, float(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=7)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_suite(root, options.tests)
        for args in MODES.values():  # warm the file system and bytecode caches
            run(root, args)
        wall: dict[str, list[float]] = {mode: [] for mode in MODES}
        cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
        for _ in range(options.repeat):
            for mode, args in MODES.items():
                w, c = run(root, args)
                wall[mode].append(w)
                cpu[mode].append(c)
    print(f"suite: {options.tests} guarded tests, {options.repeat} runs of each. session = CPU "
          "time of the session (collect + run); wall = whole process; min = least disturbed run")
    for label, times in (("session", cpu), ("wall", wall)):
        for stat in ("min", "median"):
            pick = min if stat == "min" else statistics.median
            value = {mode: pick(values) for mode, values in times.items()}
            cells = "  ".join(f"{mode} {v:5.2f} s" for mode, v in value.items())
            per_test = (value["enabled"] - value["disabled"]) / options.tests * 1e6
            print(f"  {label:7s} {stat:6s} {cells}  | --lora-guard "
                  f"{100 * (value['enabled'] / value['disabled'] - 1):+5.1f} % "
                  f"({per_test:+4.0f} us/test) | installed, disabled "
                  f"{100 * (value['disabled'] / value['absent'] - 1):+5.1f} % "
                  f"({value['disabled'] - value['absent']:+.2f} s)")
    for mode in MODES:
        print(f"  runs {mode}: session " + ", ".join(f"{t:.2f}" for t in cpu[mode])
              + "; wall " + ", ".join(f"{t:.2f}" for t in wall[mode]))


if __name__ == "__main__":
    main()
