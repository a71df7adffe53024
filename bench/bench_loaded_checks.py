"""What the checks of an engine's first load of an adapter cost, without the engine.

    python bench/bench_loaded_checks.py [--calls 200] [--rounds 7]

A vLLM load the guard has not found clean before runs `integrations._base.loaded_adapter`
(the spec of what vLLM read: its config and its tensors' names, shapes and dtypes) and then
`spec_violations` with vLLM's profile; this script runs that pair on the engine tier's adapter
(a PEFT rank-8 q/v adapter of the tiny 2-layer Llama, written by `write_adapter`), with
stand-ins for torch tensors (a shape, a dtype, an element size: what the guard reads of them),
so it runs in the test environment, without torch or vLLM. Printed: microseconds per call
(``time.process_time``, best of the rounds) of the pair and of `loaded_adapter` alone.

Instructions, which do not depend on the machine's load: run it under callgrind twice and take
the difference, e.g. ``valgrind --tool=callgrind --callgrind-out-file=/dev/null python
bench/bench_loaded_checks.py --calls 200 --rounds 1`` and ``--calls 600``: (second - first) /
400 / 2 is one pair plus one `loaded_adapter` alone. Use ``--only pair`` (or ``make``) to
count one of them.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile
import time
from collections.abc import Callable

from lora_guard._checking.check_adapters import spec_violations
from lora_guard._checking.limits import running_limits
from lora_guard._reading.safetensors import DTYPE_BITS, DTYPE_NAMES, read_safetensors_header
from lora_guard.integrations._base import loaded_adapter
from lora_guard.testing import write_adapter

_SERVED = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                     "down_proj", "lm_head", "embed_tokens"})
_SIZES = {DTYPE_NAMES[code]: bits // 8 for code, bits in DTYPE_BITS.items() if bits % 8 == 0}


class _DType:
    """What the guard reads of a ``torch.dtype``: its ``str``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"


class _Tensor:
    """What the guard reads of a tensor: ``shape``, ``dtype``, ``element_size()``."""

    __slots__ = ("dtype", "shape")

    def __init__(self, shape: tuple[int, ...], dtype: _DType) -> None:
        self.shape, self.dtype = shape, dtype

    def element_size(self) -> int:
        return _SIZES[self.dtype.name]


def _cpu(fn: Callable[[], object], calls: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, time.process_time() - start)
    return best / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--only", choices=("pair", "make"), default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_adapter(pathlib.Path(tmp) / "a", rank=8)
        config = json.loads((folder / "adapter_config.json").read_text())
        infos, _ = read_safetensors_header(folder / "adapter_model.safetensors")
        dtypes: dict[str, _DType] = {}
        tensors = {name: _Tensor(info.shape, dtypes.setdefault(info.dtype, _DType(info.dtype)))
                   for name, info in infos.items()}
        limits = running_limits("vllm", "0.34.0", max_lora_rank=16,
                                narrow={"max_rank": 16, "target_modules": _SERVED})
        subject = "adapter 'a'"

        def make() -> None:
            spec, found = loaded_adapter(str(folder), config, tensors, subject)
            if spec is None or found:
                raise SystemExit(f"the adapter was refused: {found}")

        def pair() -> None:
            spec, found = loaded_adapter(str(folder), config, tensors, subject)
            if spec is None or found:
                raise SystemExit(f"the adapter was refused: {found}")
            found = spec_violations(spec, limits, subject=subject, vocab_size=128)
            if found:
                raise SystemExit(f"the adapter was refused: {found}")

        for fn in (pair, make):  # warm: imports, the reader's tables
            fn()
        if args.only is None or args.only == "pair":
            print(f"loaded_adapter + spec_violations  {_cpu(pair, args.calls, args.rounds):8.1f}"
                  " us per call (CPU, best round)")
        if args.only is None or args.only == "make":
            print(f"loaded_adapter alone              {_cpu(make, args.calls, args.rounds):8.1f}"
                  " us per call (CPU, best round)")


if __name__ == "__main__":
    main()
