"""Set up and run everything CI runs: ``python tools/ci.py`` (what ``.ci/run`` calls).

Standard library only, so it runs on any Python the project supports, with the stock pip of a
fresh venv. It builds its own environment, ``.venv-test`` (``LORA_GUARD_TEST_VENV``), whose pip
it upgrades first: the stock pip of Python 3.11 (23.2.1) cannot resolve the test extra (moto
pulls a botocore that aiobotocore refuses, and pip 23.2's resolver stops with
ResolutionImpossible instead of backing out). Then, in order, each step stopping the run on
failure:

    setup     torch 2.13.0 (CPU, pinned first: an open range pulls CUDA), then the extras
    lint      ruff check .
    types     mypy (strict)
    layers    lint-imports (the layer contracts)
    docs      mkdocs build --strict
    suite     pytest -n 2 --lora-guard --lora-guard-instrument=peft (the suite under its own
              plugin, PEFT instrumented)
    peft      tests/upstream/run_peft_suite.py (PEFT's own LoRA tests, integration on)
    engines   tests/engines/run --lora-guard (the real vLLM and sglang on a CPU, in their own
              environment, LORA_GUARD_ENGINES_VENV, default .venv-engines; then lmdeploy
              0.18.0 in one of its own, <that>-lmdeploy-0.18.0: it pins peft<=0.14.0)
    engines-older  tests/engines/run --vllm 0.31.0 --sglang 0.5.20 --lora-guard (one older
              release of each engine, each layered on the newest's environment)

Usage::

    python tools/ci.py                      # every step
    python tools/ci.py lint types suite     # some steps (setup runs when the venv is missing)
    python tools/ci.py --fresh              # rebuild the environments first

The engine tier's environment is built in the background from the end of setup on (its
downloads overlap the lint, type, docs and test steps; its log is ``.venv-test/engines-build.log``),
so a run from scratch stays under CI's 30 minutes.

Exit status: 0 when every step passed, else the failing step's status (pytest's: 1 tests
failed, 2 interrupted, 3 internal error, 4 usage error, 5 no tests collected, each a failure).
A summary with each step's time is printed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PIP_FLOOR = "pip>=26.3"
"""The pip the test extra was verified to resolve with (23.2.1 and 24.2: ResolutionImpossible)."""
TORCH = "torch==2.13.0"
EXTRAS = ".[test,docs,bench,peft-tests]"
DISK_NEEDED_GIB = 12
"""What a run from scratch writes: the environments (test 2.2 GiB, engines 3.3, lmdeploy 2.3,
older releases 1.1) and, briefly, pip's unpacked wheels and the tests' temporary files."""
PYTEST_STATUS = {1: "tests failed", 2: "interrupted", 3: "internal error", 4: "usage error",
                 5: "no tests collected"}


def venv_dir() -> Path:
    return ROOT / os.environ.get("LORA_GUARD_TEST_VENV", ".venv-test")


def engines_venv_dir() -> Path:
    return ROOT / os.environ.get("LORA_GUARD_ENGINES_VENV", ".venv-engines")


def engine_venv_dirs() -> list[Path]:
    """The environments of the default engine tier: the newest engines', and lmdeploy's own
    (``<that>-lmdeploy-VERSION``, from ``tests/engines/requirements-lmdeploy-VERSION.txt``)."""
    newest = sorted(ROOT.glob("tests/engines/requirements-lmdeploy-*.txt"))[-1:]
    return [engines_venv_dir(), *(Path(f"{engines_venv_dir()}-lmdeploy-"
                                       f"{pins.stem.rsplit('-', 1)[1]}") for pins in newest)]


def _bin(name: str) -> str:
    return str(venv_dir() / "bin" / name)


def _python() -> str:
    return _bin("python")


def _env() -> dict[str, str]:
    """The test venv first on PATH, and no PYTHONPATH: the code under test is the install."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PATH"] = f"{venv_dir() / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv_dir())
    return env


def run(*argv: str) -> int:
    print(f"+ {' '.join(argv)}", flush=True)
    return subprocess.run(argv, cwd=ROOT, env=_env(), check=False).returncode


def setup() -> int:
    if not (venv_dir() / "bin" / "python").exists():
        status = subprocess.run([sys.executable, "-m", "venv", str(venv_dir())],
                                check=False).returncode
        if status:
            return status
    for argv in (
        (_python(), "-m", "pip", "install", "-q", "--upgrade", PIP_FLOOR),
        (_python(), "-m", "pip", "install", "-q", TORCH),
        (_python(), "-m", "pip", "install", "-q", "-e", EXTRAS),
    ):
        status = run(*argv)
        if status:
            return status
    return 0


STEPS: dict[str, Callable[[], int]] = {
    "setup": setup,
    "lint": lambda: run(_bin("ruff"), "check", "."),
    "types": lambda: run(_bin("mypy")),
    "layers": lambda: run(_bin("lint-imports")),
    "docs": lambda: run(_bin("mkdocs"), "build", "--strict", "-q"),
    "suite": lambda: run(_python(), "-m", "pytest", "-n", "2", "--lora-guard",
                         "--lora-guard-instrument=peft"),
    "peft": lambda: run(_python(), "tests/upstream/run_peft_suite.py"),
    "engines": lambda: run("bash", "tests/engines/run", "--lora-guard"),
    # One older release of each engine, each in an environment layered on the newest's: vLLM
    # 0.31 (before 0.32's PEFTHelper changes) and sglang 0.5.20 (its flags moved to
    # arg_groups). Every supported release: tests/engines/run --all.
    "engines-older": lambda: run("bash", "tests/engines/run", "--vllm", "0.31.0",
                                 "--sglang", "0.5.20", "--lora-guard"),
}


class EngineBuild:
    """The engine environment, built in the background by ``tests/engines/run --collect-only``
    (which builds it when missing, then only collects the tier's tests)."""

    def __init__(self) -> None:
        self.log = venv_dir() / "engines-build.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if all((folder / "bin" / "python").exists() for folder in engine_venv_dirs()):
            return
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                ["bash", "tests/engines/run", "--collect-only", "-q"], cwd=ROOT, env=_env(),
                stdout=out, stderr=subprocess.STDOUT)

    def wait(self) -> int:
        if self.process is None:
            return 0
        status = self.process.wait()
        if status:
            tail = self.log.read_text(encoding="utf-8", errors="replace").splitlines()[-40:]
            print("\n".join(["the engine environment's build failed:", *tail]), flush=True)
        return status

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait()


def _why(name: str, status: int) -> str:
    if name in ("suite", "peft", "engines", "engines-older") and status in PYTEST_STATUS:
        return f"exit {status}: {PYTEST_STATUS[status]}"
    return f"exit {status}"


def _wanted(argv: Sequence[str] | None) -> list[str]:
    """The steps asked for, in order, setup first when the test venv is missing."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", nargs="*", metavar="STEP",
                        help=f"steps to run, in order (default: all): {', '.join(STEPS)}")
    parser.add_argument("--fresh", action="store_true",
                        help="remove the test and engine environments first")
    args = parser.parse_args(argv)
    unknown = [name for name in args.steps if name not in STEPS]
    if unknown:
        parser.error(f"unknown step {', '.join(unknown)}; steps: {', '.join(STEPS)}")
    if args.fresh:
        for folder in (venv_dir(), *engine_venv_dirs()):
            shutil.rmtree(folder, ignore_errors=True)
    wanted = [name for name in STEPS if name in (args.steps or STEPS)]
    if "setup" not in wanted and not (venv_dir() / "bin" / "python").exists():
        wanted.insert(0, "setup")
    return wanted


def disk_warning() -> str | None:
    """A line to print when the disk may be too small for the environments still to build:
    a run that fills it fails in pip as a download or build error that never says why."""
    missing = [folder for folder in (venv_dir(), *engine_venv_dirs())
               if not (folder / "bin" / "python").exists()]
    free = shutil.disk_usage(ROOT).free / 2**30
    if not missing or free >= DISK_NEEDED_GIB:
        return None
    return (f"warning: {free:.1f} GiB free on the disk holding {ROOT}; building "
            f"{', '.join(folder.name for folder in missing)} from scratch needs about "
            f"{DISK_NEEDED_GIB} GiB. Free some (old clones' .venv-* folders, /tmp) first.")


def _run_steps(wanted: list[str]) -> list[tuple[str, float, int]]:
    """Each step in order, up to the first that fails: (name, seconds, status)."""
    times: list[tuple[str, float, int]] = []
    build = EngineBuild()
    try:
        for name in wanted:
            print(f"\n=== {name} ===", flush=True)
            start = time.monotonic()
            if name.startswith("engines") and (status := build.wait()):
                # not the tier's tests: its environment could not be built
                times.append((f"build of the engine environment (log: {build.log})",
                              time.monotonic() - start, status))
                break
            status = STEPS[name]()
            times.append((name, time.monotonic() - start, status))
            if status:
                break
            if name == "setup" and any(n.startswith("engines") for n in wanted):
                build.start()
    finally:
        build.stop()
    return times


def main(argv: Sequence[str] | None = None) -> int:
    wanted = _wanted(argv)
    disk = disk_warning()
    if disk:
        print(disk, flush=True)
    times = _run_steps(wanted)
    print("\n=== summary ===")
    for name, seconds, code in times:
        print(f"{name:<8} {seconds:7.1f} s  {'ok' if code == 0 else _why(name, code)}")
    skipped = [name for name in wanted if name not in {t[0] for t in times}]
    if skipped:
        print(f"not run (an earlier step failed): {', '.join(skipped)}")
    if disk and any(code for _, _, code in times):
        print(disk)
    status = next((code for _, _, code in times if code), 0)
    if status == 0:
        print(f"all passed; the environment: . {venv_dir()}/bin/activate")
    return status


if __name__ == "__main__":
    sys.exit(main())
