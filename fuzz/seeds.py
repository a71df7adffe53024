"""Write seed inputs for the atheris harnesses from the hostile corpus of the test suite.

    python fuzz/seeds.py            # writes fuzz/corpus/header/* and fuzz/corpus/adapter/*

Seeds are generated, never committed: every case of ``tests/hostile/corpus.py`` whose folder
holds both files becomes one adapter seed, and its weights file one header seed.
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from hostile.corpus import CASES  # noqa: E402

SEPARATOR = b"\x00\xff\x00\xff"
MAX_SEED = 1 << 16  # big cases (a 1 MB key, 20,000 tensors) make slow seeds: skipped


def main() -> None:
    out_header, out_adapter = HERE / "corpus" / "header", HERE / "corpus" / "adapter"
    out_header.mkdir(parents=True, exist_ok=True)
    out_adapter.mkdir(parents=True, exist_ok=True)
    written = 0
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            root = Path(tmp) / case.name
            root.mkdir()
            folder = case.build(root)
            config, weights = folder / "adapter_config.json", folder / "adapter_model.safetensors"
            if not (config.is_file() and weights.is_file() and not weights.is_symlink()):
                continue
            if weights.stat().st_size > MAX_SEED or config.stat().st_size > MAX_SEED:
                continue
            body = weights.read_bytes()
            name = hashlib.sha1(body).hexdigest()[:16]
            # fuzz_header.py framing: byte 0 = 1 (through a file), bytes 1-2 = extra data.
            (out_header / f"{case.name}-{name}").write_bytes(b"\x01\x00\x00" + body)
            (out_adapter / f"{case.name}-{name}").write_bytes(
                config.read_bytes() + SEPARATOR + body)
            written += 1
    print(f"{written} seeds in {out_header} and {out_adapter}")


if __name__ == "__main__":
    main()
