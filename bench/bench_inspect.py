"""How fast is inspecting adapters? Prints numbers; no assertions.

    python bench/bench_inspect.py [--adapters 1000] [--big-mb 100] [--repeat 5]

1. ``inspect_adapter`` over N small PEFT-format adapters (r=8 on q/v of a 2-layer model), and
   ``check_adapters`` of the folder, vs ``safetensors.safe_open`` + ``get_slice`` per key.
2. ``inspect_adapter`` of one ~100 MB adapter, and the reference reader (``safe_open`` +
   ``get_slice`` of every key + the config), vs ``safetensors.torch.load_file`` of it, and
   vs a full load (``load_file`` and every tensor copied, as a server copying it into its
   pool), in the same page-cache state for all three: warm (the files in the page cache) and
   cold (evicted with ``posix_fadvise(DONTNEED)`` before every call), the calls interleaved,
   best and median of each, and the full load's ratio best vs best and median vs median.
   Every ``inspect_adapter`` here is a first read: the readers' memory of headers and configs
   seen before (which makes a repeated read of the same bytes nearly free) is emptied first.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

from _page_cache import evict  # bench/ is the script's folder, first on sys.path

import lora_guard as lg
from lora_guard._reading.adapters import forget_remembered
from lora_guard._testing.adapter_writer import write_adapter


def best_and_median(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def fill(path: pathlib.Path) -> None:
    """Overwrite the data section with non-zero bytes (a sparse file would flatter load_file)."""
    with open(path, "r+b") as f:
        length = int.from_bytes(f.read(8), "little")
        f.seek(8 + length)
        size = path.stat().st_size - 8 - length
        chunk = bytes(range(1, 256)) * 4096
        while size > 0:
            f.write(chunk[: min(size, len(chunk))])
            size -= len(chunk)


def bench_many(root: pathlib.Path, n: int, repeat: int) -> None:
    """Part 1: inspect and check ``n`` small adapters, vs safe_open + get_slice of each."""
    from safetensors import safe_open

    folders = [write_adapter(root / "many" / f"a{i:04d}") for i in range(n)]

    def inspect_all() -> None:
        forget_remembered()
        for folder in folders:
            lg.inspect_adapter(folder)

    def check_all() -> None:
        forget_remembered()
        assert lg.check_adapters(root / "many").ok

    def safe_open_all() -> None:
        for folder in folders:
            json.loads((folder / "adapter_config.json").read_text())
            with safe_open(str(folder / "adapter_model.safetensors"), "pt") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                    f.get_slice(key).get_shape()

    print(f"\n{n} small adapters (r=8, q_proj+v_proj, 2 layers, 8 tensors each)")
    for label, fn in (("lg.inspect_adapter, each", inspect_all),
                      ("lg.check_adapters(folder)", check_all),
                      ("safe_open + get_slice, each", safe_open_all)):
        fn()  # warm the page cache and imports
        best, median = best_and_median(fn, repeat)
        print(f"  {label:30s} best {best * 1e3:8.1f} ms  median {median * 1e3:8.1f} ms  "
              f"({median / n * 1e6:6.1f} us per adapter)")


def write_big(root: pathlib.Path, big_mb: int) -> tuple[pathlib.Path, int]:
    """One big adapter of about ``big_mb`` MB: rank 64 on every linear module of a 4096-wide
    model, its data filled with non-zero bytes. Returns its folder and its number of layers."""
    per_layer = 2 * 64 * (4 * (4096 + 4096) + 3 * (4096 + 11008))  # fp16 bytes
    layers = max(1, round(big_mb * 1e6 / per_layer))
    big = write_adapter(root / "big", rank=64, layers=layers, hidden_size=4096,
                        intermediate_size=11008, num_heads=32, num_kv_heads=32,
                        targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                 "up_proj", "down_proj"))
    fill(big / "adapter_model.safetensors")
    return big, layers


def timed_runs(fns: dict[str, Callable[[], object]], repeat: int,
               before: Callable[[], None]) -> dict[str, list[float]]:
    """Seconds of each function per run, the functions interleaved run after run, with
    ``before`` (evict, or nothing) before every single call: each sees the same page-cache
    state."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            before()
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def print_state(state: str, times: dict[str, list[float]]) -> None:
    print(f"  {state}:")
    for name, runs in times.items():
        print(f"    {name:34s} best {min(runs) * 1e3:8.2f} ms  "
              f"median {statistics.median(runs) * 1e3:8.2f} ms")
    full = times["load_file + copy every tensor"]
    for reader in ("lg.inspect_adapter", REFERENCE):
        runs = times[reader]
        print(f"    a full load over {reader}: {min(full) / min(runs):.0f}x best vs best, "
              f"{statistics.median(full) / statistics.median(runs):.0f}x median vs median")


REFERENCE = "safe_open + get_slice (reference)"
"""The reference reader: the safetensors library's own header parse (Rust), every shape
asked for, and the config parsed: what the issue's "about 150x" was measured with."""


def bench_big(root: pathlib.Path, big_mb: int, repeat: int) -> None:
    """Part 2: a first inspect of one big adapter, vs load_file and vs a full load, with the
    files in the page cache (warm) and evicted from it before each call (cold)."""
    from safetensors.torch import load_file

    big, layers = write_big(root, big_mb)
    weights = big / "adapter_model.safetensors"
    size = weights.stat().st_size

    def inspect_first() -> None:
        forget_remembered()
        lg.inspect_adapter(big)

    def load_and_read() -> None:  # what a server does next: copy the data into its pool
        for tensor in load_file(str(weights)).values():
            tensor.clone()

    def reference() -> None:
        from safetensors import safe_open

        json.loads((big / "adapter_config.json").read_bytes())
        with safe_open(str(weights), "pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                f.get_slice(key).get_shape()

    fns: dict[str, Callable[[], object]] = {
        "lg.inspect_adapter": inspect_first,
        REFERENCE: reference,
        "safetensors.torch.load_file": lambda: load_file(str(weights)),
        "load_file + copy every tensor": load_and_read,
    }
    for fn in fns.values():  # warm-up: imports, the file in the page cache
        fn()
    spec = lg.inspect_adapter(big)
    print(f"\none adapter of {size / 1e6:.1f} MB ({len(spec.tensors)} tensors, "
          f"{layers} layers, rank 64); {repeat} runs of each, interleaved")
    print_state("warm (both in the page cache)", timed_runs(fns, repeat, lambda: None))
    files = [weights, big / "adapter_config.json"]
    print_state("cold (both evicted from the page cache before each call)",
                timed_runs(fns, repeat, lambda: evict(files)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapters", type=int, default=1000)
    parser.add_argument("--big-mb", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    print(f"python {sys.version.split()[0]}, lora_guard {lg.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        bench_many(root, args.adapters, args.repeat)
        bench_big(root, args.big_mb, args.repeat)


if __name__ == "__main__":
    main()
