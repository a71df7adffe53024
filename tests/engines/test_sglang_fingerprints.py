"""The installed sglang release against its stored fingerprints (tests/engines/fingerprints/):
a function a rule cites, a LoRA flag or a hook target that differs fails here, naming it, so
a release's drift is found by the tier, not by reading (tools/fingerprints.py)."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("sglang is not installed: the engine tier runs in its own environment "
                "(tests/engines/run builds it and runs the tier)", allow_module_level=True)

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_installed_release_is_the_one_its_fingerprints_were_recorded_from() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "fingerprints.py"),
                           "installed", "sglang"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 difference(s)" in done.stdout
