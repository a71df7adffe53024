"""Run PEFT's own LoRA tests with lora_guard's PEFT integration instrumented.

PEFT's test suite is the widest set of legitimate LoRA adapters there is: every layer type,
rank and alpha patterns, hot-swapping, conv groups, multiple adapters. Run under
``pytest --lora-guard --lora-guard-instrument=peft``, each of its tests that passes without
lora_guard must pass with it (a guard that fires there is a false alarm on an adapter PEFT
itself saves, loads and serves).

The tests come from the source distribution of the PEFT release installed here, fetched from
the package index into a temporary folder (nothing of PEFT's is copied into this repository).
Usage (the extras: ``pip install -e '.[test,peft-tests]'``)::

    python tests/upstream/run_peft_suite.py            # the selection below, ~2 min on 2 cores
    python tests/upstream/run_peft_suite.py -- -x -k hotswap   # extra pytest arguments

Exit status: pytest's (0 when every selected test passed instrumented).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

# PEFT's hot-swap tests (they load adapters of other ranks and shapes into a running model)
# and the LoRA cases of its custom-models suite that save, load and serve adapters (every
# layer kind PEFT has: linear, embedding, conv 1d/2d/3d with groups, MHA, nn.Parameter, BD-LoRA,
# DoRA, ...): what the PEFT integration guards. The other custom-model tests (training steps,
# merging numerics, dtype autocast) never reach a guarded call; the selection keeps it short.
SELECTION = {
    "tests/test_initialization.py": "TestHotSwapping",
    "tests/test_custom_models.py": (
        "TestPeftCustomModel and (lora or LoRA) and (test_save_load_roundtrip"
        " or test_load_multiple_adapters or test_inference_safetensors)"
    ),
}


def fetch_peft_tests(version: str, into: Path) -> Path:
    """Download PEFT ``version``'s source distribution and unpack its tests under ``into``."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
         f"peft=={version}", "-d", str(into)],
        check=True,
    )
    (sdist,) = into.glob(f"peft-{version}.tar.gz")
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers()
                   if m.name.startswith(f"peft-{version}/tests/") and m.isfile()]
        archive.extractall(into, members=members, filter="data")
    root = into / f"peft-{version}"
    (root / "tests" / "__init__.py").touch()  # PEFT's tests import .testing_utils
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    parser.add_argument("-n", default="2", help="pytest-xdist workers (default 2)")
    args = parser.parse_args(argv)
    version = metadata.version("peft")
    with tempfile.TemporaryDirectory(prefix="peft-tests-") as tmp:
        root = fetch_peft_tests(version, Path(tmp))
        # One pytest run per file: each selection is a -k expression over its own file.
        status = 0
        for path, expression in SELECTION.items():
            command = [
                sys.executable, "-m", "pytest", path, "-k", expression,
                "-o", "addopts=", "-p", "no:cacheprovider", "--import-mode=prepend",
                "-q", "--disable-warnings", "-n", args.n,
                "--lora-guard", "--lora-guard-instrument=peft",
                *args.pytest_args,
            ]
            print(f"PEFT {version}: {' '.join(command[3:])}", flush=True)
            status = subprocess.run(command, cwd=root).returncode or status
        return status


if __name__ == "__main__":
    sys.exit(main())
