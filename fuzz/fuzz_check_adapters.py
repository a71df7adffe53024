"""atheris harness: `lora_guard.check_adapters` on an adapter folder made of the input.

    python fuzz/fuzz_check_adapters.py fuzz/corpus/adapter -max_total_time=3600

Property: whatever ``adapter_config.json`` and ``adapter_model.safetensors`` hold, the checker
returns a report whose violations all come from the catalogue; it never raises, never
unpickles, never hangs. The input is split at its first ``\\x00\\xff\\x00\\xff`` separator
into the config bytes and the weights bytes (seeds written by ``fuzz/seeds.py`` use it).
"""

from __future__ import annotations

import os
import sys
import tempfile

import atheris

import lora_guard as lg
from lora_guard._reading import adapters as _adapters  # noqa: F401 - loaded before instrumenting

# lora_guard is often installed in editable mode (a custom loader atheris cannot hook):
# instrument what is loaded, after the fact.
atheris.instrument_all()

SEPARATOR = b"\x00\xff\x00\xff"
_FOLDER = os.path.join(tempfile.mkdtemp(prefix="lora-guard-fuzz-"), "adapter")
os.makedirs(_FOLDER)
_LIMITS = lg.ServingLimits(max_rank=64, max_loras=4)


def test_one_input(data: bytes) -> None:
    config, _, weights = data.partition(SEPARATOR)
    with open(os.path.join(_FOLDER, "adapter_config.json"), "wb") as f:
        f.write(config)
    with open(os.path.join(_FOLDER, "adapter_model.safetensors"), "wb") as f:
        f.write(weights)
    report = lg.check_adapters(_FOLDER, _LIMITS)
    for violation in report.violations:
        if violation.code not in lg.INVARIANTS:
            raise AssertionError(f"a code outside the catalogue: {violation}")
        if len(violation.message) > 10_000:
            raise AssertionError(f"an unbounded message: {len(violation.message)} characters")


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
