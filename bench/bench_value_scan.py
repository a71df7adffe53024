"""What does the value scan cost? ``check_adapters(scan_values=True)`` vs reading the files once.

    python bench/bench_value_scan.py [--adapters 4] [--mb 64] [--repeat 5] [--no-numpy]

For each dtype (float16, bfloat16, float32): N adapters of about ``--mb`` MB each (rank 64 on
every linear module of a 4096-wide model), their data filled with finite non-zero values.
Times are the best of ``--repeat`` runs (the machine is shared: the best run is the one other
jobs disturbed least; the medians are printed too), cold (each file dropped from the page cache with
``posix_fadvise(POSIX_FADV_DONTNEED)`` before each run: a first check of new uploads) and
warm (from the page cache: the hardest case for the scan, nothing hides its CPU time behind
the disk):

- read once: every weights file read through in chunks of the scan's size, nothing done, the
  faster of two ways: ``os.pread`` (a new bytes object per chunk) and ``os.preadv`` into one
  reused buffer (what the scan does);
- check: ``check_adapters(folder)``, headers only;
- check + scan: ``check_adapters(folder, scan_values=True)``.

The scan's budget is 1.5x the time to read the files once.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable

from _page_cache import evict  # bench/ is the script's folder, first on sys.path

import lora_guard as lg
from lora_guard._checking import values
from lora_guard._checking.values import CHUNK
from lora_guard._testing.adapter_writer import write_adapter

_ONE = {"float16": struct.pack("<e", 0.01), "bfloat16": struct.pack("<f", 0.01)[2:],
        "float32": struct.pack("<f", 0.01)}


def timed(fn: Callable[[], object], repeat: int,
          before: Callable[[], object] = lambda: None) -> tuple[float, float]:
    """(best, median) of ``repeat`` runs of ``fn``, ``before`` run untimed before each."""
    times = []
    for _ in range(repeat):
        before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def fill(path: pathlib.Path, value: bytes) -> None:
    """Overwrite the data section with one finite, non-zero value (the writer leaves zeros)."""
    with open(path, "r+b") as f:
        length = int.from_bytes(f.read(8), "little")
        f.seek(8 + length)
        size = path.stat().st_size - 8 - length
        block = value * (CHUNK // len(value))
        while size > 0:
            f.write(block[: min(size, len(block))])
            size -= len(block)


def read_new(files: list[pathlib.Path]) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            offset = 0
            while chunk := os.pread(fd, CHUNK, offset):
                offset += len(chunk)
        finally:
            os.close(fd)


def read_into(files: list[pathlib.Path]) -> None:
    buf = bytearray(CHUNK)
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            offset = 0
            while count := os.preadv(fd, [buf], offset):
                offset += count
        finally:
            os.close(fd)


def read_once(files: list[pathlib.Path], repeat: int,
              before: Callable[[], object] = lambda: None) -> tuple[float, float]:
    """The faster of the two plain reads, (best, median)."""
    return min(timed(lambda: read_new(files), repeat, before),
               timed(lambda: read_into(files), repeat, before))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-numpy", action="store_true",
                        help="scan as without numpy installed (the pure-Python tests)")
    parser.add_argument("--dtypes", default=",".join(_ONE), help="comma-separated")
    args = parser.parse_args()
    if args.no_numpy:
        values._NP = None
    print(f"python {sys.version.split()[0]}, lora_guard {lg.__version__}, "
          f"{args.adapters} adapters of about {args.mb} MB per dtype, chunks of {CHUNK >> 10} KiB, "
          f"numpy {'yes' if values._NP is not None else 'no'}")
    per_layer = 2 * 64 * (4 * (4096 + 4096) + 3 * (4096 + 11008))  # fp16 bytes a layer
    for dtype in args.dtypes.split(","):
        value = _ONE[dtype]
        layers = max(1, round(args.mb * 1e6 / per_layer * (2 if dtype != "float32" else 1)))
        with tempfile.TemporaryDirectory() as tmp:
            root = pathlib.Path(tmp)
            files = []
            for i in range(args.adapters):
                folder = write_adapter(
                    root / f"a{i}", rank=64, layers=layers, hidden_size=4096,
                    intermediate_size=11008, num_heads=32, num_kv_heads=32, dtype=dtype,
                    targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                             "down_proj"))
                fill(folder / "adapter_model.safetensors", value)
                files.append(folder / "adapter_model.safetensors")
            total = sum(p.stat().st_size for p in files)
            assert lg.check_adapters(root, scan_values=True).ok  # warm, and finite non-zero
            scan_values = lambda root=root: lg.check_adapters(root, scan_values=True)  # noqa: E731
            read = read_once(files, args.repeat)
            check = timed(lambda root=root: lg.check_adapters(root), args.repeat)
            scan = timed(scan_values, args.repeat)
            cold_read = read_once(files, args.repeat, lambda files=files: evict(files))
            cold_scan = timed(scan_values, args.repeat, lambda files=files: evict(files))
            print(f"\n{dtype}: {total / 1e6:.0f} MB in {args.adapters} files "
                  f"(best of {args.repeat}; median in brackets)")
            for name, r, s in (("cold (evicted from the page cache before each run)",
                                cold_read, cold_scan), ("warm (in the page cache)", read, scan)):
                print(f"  {name}:")
                print(f"    read once     {r[0] * 1e3:8.1f} ms  ({total / r[0] / 1e9:5.2f} GB/s)"
                      f"  [{r[1] * 1e3:.1f} ms]")
                print(f"    check + scan  {s[0] * 1e3:8.1f} ms  ({total / s[0] / 1e9:5.2f} GB/s)"
                      f"  [{s[1] * 1e3:.1f} ms]  {s[0] / r[0]:.2f}x the read [{s[1] / r[1]:.2f}x]"
                      f" (budget 1.5x)")
            print(f"  check alone (headers, warm) {check[0] * 1e3:.1f} ms")

if __name__ == "__main__":
    main()
