"""What the checker itself costs per adapter, without the reading. Prints numbers; no assertions.

    python bench/bench_check_part.py [--sizes 2000,10000] [--repeat 7]

``lg.check_adapters(folder)`` on `bench_check.write_corpus`'s distinct corpus (every adapter
its own bytes: each its own recipe, nothing shared), with the reader (``read_recipes``)
replaced by a lookup of the reads made beforehand: what is left is the search of the folder,
each adapter's checks, the verdicts kept and the report. Printed for no limits and for
``for_engine("vllm")`` with a Llama base config (every module's dims compared).

Also the search alone, ``Report.to_json`` and the whole ``lg.check_adapters`` in the same run.
Run it against another source tree (``PYTHONPATH=that/src``) to compare two versions.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
from collections.abc import Callable
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from bench_check import timed, write_corpus

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
         "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
         "num_hidden_layers": 2, "vocab_size": 128}


def per_adapter(fn: Callable[[], object], n: int, repeat: int) -> float:
    """Median microseconds per adapter of ``repeat`` runs after one warm-up run."""
    return timed(fn, repeat) / n * 1e6


class _Forgetful(dict):  # type: ignore[type-arg]
    """A memory that keeps nothing."""

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="2000,10000")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    import lora_guard as lg
    from lora_guard._checking import check_adapters as checker
    from lora_guard._checking import discovery
    from lora_guard._reading.adapters import read_recipes

    print(f"python {sys.version.split()[0]}, lora_guard from {pathlib.Path(lg.__file__).parent}")
    with tempfile.TemporaryDirectory() as tmp:
        base = pathlib.Path(tmp) / "config.json"
        base.write_text(json.dumps(LLAMA))
        limits = {"no limits": lg.ServingLimits(),
                  "vllm + base": lg.ServingLimits.for_engine("vllm", base_config=base)}
        for n in (int(s) for s in args.sizes.split(",")):
            root = pathlib.Path(tmp) / f"n{n}"
            folders = write_corpus(root, n, distinct=True)
            reads = dict(zip(map(str, folders), read_recipes(folders), strict=True))
            print(f"\n{n:,} tiny adapters, distinct files")
            search = per_adapter(lambda: discovery.discover_all([root]), n, args.repeat)  # noqa: B023
            print(f"  the search alone                         {search:6.1f} us per adapter")
            for name, lim in limits.items():
                checker.read_recipes = lambda batch: [reads[str(f)] for f in batch]  # noqa: B023
                try:
                    part = per_adapter(lambda: lg.check_adapters(root, lim), n, args.repeat)  # noqa: B023
                finally:
                    checker.read_recipes = read_recipes
                whole = per_adapter(lambda: lg.check_adapters(root, lim), n, args.repeat)  # noqa: B023
                report = lg.check_adapters(root, lim)
                to_json = per_adapter(report.to_json, n, args.repeat)
                print(f"  {name:12s} checking part: {part:6.1f} us per adapter; "
                      f"to_json {to_json:5.1f}; whole check_adapters {whole:6.1f}")


if __name__ == "__main__":
    main()
