"""How close is the checker to the I/O floor, and does it scale? Prints numbers; no assertions.

    python bench/bench_check.py [--sizes 1000,10000] [--repeat 3] [--cli] [--huge]

1. ``lg.check_adapters(folder)`` against the raw floor in the same run: for each adapter the
   8-byte length, the header bytes and ``adapter_config.json`` read, and both ``json.loads``-ed,
   nothing else (no validation, no discovery: the floor is handed the list of folders).
2. ``--cli``: ``lora-guard check FOLDER --format F`` for text, json, github and sarif, each in a
   fresh process (``lora_guard._frontends.cli.main`` timed inside it, without the imports),
   with the time per adapter and the peak memory (``ru_maxrss``) of that process.
3. ``--huge`` adds 100,000 adapters to the sizes (a few minutes: writing the corpus included).

The corpus: tiny PEFT-format adapters (2 layers, hidden 64) of eight kinds (rank 8 or 16,
q/v or all attention projections, fp16 or bf16), copied round-robin into one folder each, as
a fleet trained from a few recipes is. ``--distinct`` gives every adapter its own bytes (its
name in the config's ``revision`` and in the header's ``__metadata__``): the checker then
parses every file (it parses byte-identical configs and headers once).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

_KINDS = [
    {"rank": rank, "targets": targets, "dtype": dtype}
    for rank in (8, 16)
    for targets in (("q_proj", "v_proj"), ("q_proj", "k_proj", "v_proj", "o_proj"))
    for dtype in ("float16", "bfloat16")
]


def _distinct(config: bytes, weights: bytes, name: str) -> tuple[bytes, bytes]:
    """The same adapter with its own bytes: its name in the config's ``revision`` and in the
    header's ``__metadata__`` (so no two configs or headers are byte-identical)."""
    config = config.replace(b'"revision": null', f'"revision": "{name}"'.encode())
    length = int.from_bytes(weights[:8], "little")
    header = json.loads(weights[8:8 + length])
    header["__metadata__"] = {"format": "pt", "name": name}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return config, len(raw).to_bytes(8, "little") + raw + weights[8 + length:]


def write_corpus(root: pathlib.Path, count: int, distinct: bool = False) -> list[pathlib.Path]:
    """``count`` adapter folders under ``root`` (``a000000`` ...), eight kinds round-robin;
    ``distinct``: no two with byte-identical files."""
    from lora_guard.testing import write_adapter

    templates = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, kind in enumerate(_KINDS):
            folder = write_adapter(pathlib.Path(tmp) / f"t{i}", **kind)  # type: ignore[arg-type]
            templates.append(((folder / "adapter_config.json").read_bytes(),
                              (folder / "adapter_model.safetensors").read_bytes()))
    root.mkdir(parents=True, exist_ok=True)
    folders = []
    for i in range(count):
        folder = root / f"a{i:06d}"
        folder.mkdir()
        config, weights = templates[i % len(templates)]
        if distinct:
            config, weights = _distinct(config, weights, folder.name)
        (folder / "adapter_config.json").write_bytes(config)
        (folder / "adapter_model.safetensors").write_bytes(weights)
        folders.append(folder)
    return folders


def floor(folders: list[pathlib.Path]) -> int:
    """The raw floor: length, header and config read and parsed; nothing checked."""
    parsed = 0
    for folder in folders:
        with open(os.path.join(folder, "adapter_config.json"), "rb") as f:
            json.loads(f.read())
        with open(os.path.join(folder, "adapter_model.safetensors"), "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            json.loads(f.read(length))
        parsed += 1
    return parsed


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of ``repeat`` runs after one warm-up run."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def child(fmt: str, folder: str) -> None:
    """One CLI run in this process: prints seconds and peak RSS (MB) as JSON."""
    import contextlib
    import io

    from lora_guard._frontends.cli import main as cli_main

    sink = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(sink):
        code = cli_main(["check", folder, "--format", fmt])
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "rss_mb": peak, "exit": code,
                      "output_mb": len(sink.getvalue()) / 1e6}))


def run_child(fmt: str, folder: pathlib.Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--child", fmt, str(folder)],
                         check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def baseline_rss() -> float:
    """Peak RSS (MB) of a process that imports the CLI and checks nothing."""
    code = ("import resource, lora_guard._frontends.cli, lora_guard._checking.check_adapters;"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")
    return float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                text=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cli", action="store_true", help="time the CLI in every format")
    parser.add_argument("--huge", action="store_true", help="add 100,000 adapters")
    parser.add_argument("--distinct", action="store_true",
                        help="no two adapters with byte-identical config or header")
    parser.add_argument("--child", nargs=2, metavar=("FORMAT", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    import lora_guard as lg

    sizes = [int(s) for s in args.sizes.split(",")] + ([100_000] if args.huge else [])
    print(f"python {sys.version.split()[0]}, lora_guard {lg.__version__}, "
          f"{os.cpu_count()} cpus")
    if args.cli:
        print(f"CLI process baseline (imports only): {baseline_rss():.0f} MB peak RSS")
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            root = pathlib.Path(tmp) / f"n{n}"
            start = time.perf_counter()
            folders = write_corpus(root, n, args.distinct)
            kind = "distinct" if args.distinct else "eight recipes"
            print(f"\n{n:,} tiny adapters, {kind} (corpus written in "
                  f"{time.perf_counter() - start:.1f} s)")
            repeat = args.repeat if n <= 10_000 else 1
            raw = timed(lambda: floor(folders), repeat)  # noqa: B023
            check = timed(lambda: lg.check_adapters(root), repeat)  # noqa: B023
            print(f"  raw floor (read + json.loads)   {raw * 1e3:9.1f} ms "
                  f"({raw / n * 1e6:6.1f} us per adapter)")
            print(f"  lg.check_adapters(folder)       {check * 1e3:9.1f} ms "
                  f"({check / n * 1e6:6.1f} us per adapter)")
            print(f"  checker / floor                 {check / raw:9.2f}x")
            if args.cli:
                for fmt in ("text", "json", "github", "sarif"):
                    r = run_child(fmt, root)
                    print(f"  lora-guard check --format {fmt:7s} {r['seconds'] * 1e3:9.1f} ms "
                          f"({r['seconds'] / n * 1e6:6.1f} us per adapter), peak RSS "
                          f"{r['rss_mb']:6.0f} MB, output {r['output_mb']:6.1f} MB")


if __name__ == "__main__":
    main()
