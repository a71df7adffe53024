"""What does reading ``added_tokens.json`` cost each adapter folder? Prints numbers; no
assertions.

    python bench/bench_added_tokens.py [--calls 20000] [--repeat 3]

The reader looks the file up in every adapter folder it reads (one ``open`` that fails with
ENOENT in the usual folder). Prints, per call: the look-up of a missing file, the read of a
two-token file, and the whole folder read (config, header, look-up) for scale.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile
import timeit

from lora_guard._reading.adapters import _read_added_tokens, read_folder
from lora_guard._testing.adapter_writer import write_adapter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        _measure(pathlib.Path(folder), args)


def _measure(root: pathlib.Path, args: argparse.Namespace) -> None:
    plain = pathlib.Path(write_adapter(str(root / "plain"), rank=8))
    tokens = pathlib.Path(write_adapter(str(root / "tokens"), rank=8))
    (tokens / "added_tokens.json").write_text(json.dumps({"<sql>": 128, "</sql>": 129}))
    for label, call in (
        ("added_tokens.json missing (look-up only)", lambda: _read_added_tokens(plain)),
        ("added_tokens.json with 2 tokens", lambda: _read_added_tokens(tokens)),
        ("whole folder read, no added_tokens.json", lambda: read_folder(plain)),
    ):
        best = min(timeit.repeat(call, number=args.calls, repeat=args.repeat)) / args.calls
        print(f"{label}: {best * 1e6:.2f} us per call (best of {args.repeat})")


if __name__ == "__main__":
    main()
