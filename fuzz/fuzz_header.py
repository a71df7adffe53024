"""atheris harness: the strict safetensors header reader, for long runs.

    python fuzz/fuzz_header.py fuzz/corpus/header -max_total_time=3600

Property: every input is either a self-consistent header (known dtypes, sizes that match the
shapes, byte ranges that tile the data exactly) or a `HeaderError` with a one-line problem.
Any other exception, a crash, a hang (``-timeout=``) or an allocation over ``-rss_limit_mb``
is a finding. The first input byte picks the path: in memory (`parse_header`) or through a
real file (`read_safetensors_header`, which adds the 8-byte length prefix checks); bytes 1-2
give the size of the data section; the rest is the header (in memory) or the file's first
bytes (through a file). ``fuzz/seeds.py`` writes seeds in this framing.
"""

from __future__ import annotations

import os
import sys
import tempfile

import atheris

from lora_guard._reading.safetensors import HeaderError, parse_header, read_safetensors_header

# lora_guard is often installed in editable mode (a custom loader atheris cannot hook):
# instrument what is loaded, after the fact.
atheris.instrument_all()

_DIR = tempfile.mkdtemp(prefix="lora-guard-fuzz-")
_FILE = os.path.join(_DIR, "adapter_model.safetensors")


def _consistent(tensors: dict, data_size: int) -> None:  # type: ignore[type-arg]
    position = 0
    for info in sorted(tensors.values(), key=lambda i: i.offsets):
        if info.offsets[0] != position or info.nbytes != info.offsets[1] - info.offsets[0]:
            raise AssertionError(f"accepted a header whose ranges do not tile: {tensors}")
        position = info.offsets[1]
    if position != data_size:
        raise AssertionError(f"accepted {position} bytes of tensors for {data_size} of data")


def test_one_input(data: bytes) -> None:
    # Byte 0: bit 0 picks the path; bytes 1-2: data size after the header; then the file.
    through_file = bool(data[:1] and data[0] & 1)
    data_size = int.from_bytes(data[1:3], "little")
    raw = data[3:]
    try:
        if through_file:
            with open(_FILE, "wb") as f:
                f.write(raw)
                f.truncate(len(raw) + data_size)
            tensors, _ = read_safetensors_header(_FILE)
            length = int.from_bytes(raw[:8], "little")
            _consistent(tensors, len(raw) + data_size - 8 - length)
        else:
            tensors, _ = parse_header(raw, data_size)
            _consistent(tensors, data_size)
    except HeaderError as exc:
        if not exc.problem or "\n" in exc.problem:
            raise AssertionError(f"unclear problem: {exc.problem!r}") from None


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
