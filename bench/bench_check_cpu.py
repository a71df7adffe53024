"""CPU time of `lg.check_adapters` against the raw floor, in one process, with and without the
cyclic garbage collector: what `bench_check.py`'s wall clock shows with the I/O and the
collector's share told apart.

    python bench/bench_check_cpu.py [N] [--fleet]

Writes N adapters (default 10,000; distinct unless ``--fleet``) with
`bench_check.write_corpus`, checks them once to warm up, then twice with the collector on and
twice with it paused, each followed by the floor (`bench_check.floor`); prints microseconds per
adapter of ``time.process_time`` and the ratio to the floor of the same round.
"""

from __future__ import annotations

import gc
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import bench_check

import lora_guard as lg


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    n = int(args[0]) if args else 10_000
    distinct = "--fleet" not in sys.argv
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp) / "c"
        folders = bench_check.write_corpus(root, n, distinct=distinct)
        lg.check_adapters(root)  # warm: imports, tables built on first use
        print(f"{n:,} adapters, {'distinct' if distinct else 'eight recipes'}")
        for collector in ("on", "paused", "on", "paused"):
            if collector == "paused":
                gc.disable()
            start = time.process_time()
            lg.check_adapters(root)
            check = time.process_time() - start
            gc.enable()
            start = time.process_time()
            bench_check.floor(folders)
            raw = time.process_time() - start
            print(f"  collector {collector:<7} {check / n * 1e6:7.1f} us per adapter, floor "
                  f"{raw / n * 1e6:5.1f} us, checker / floor {check / raw:5.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
