"""The whole-model equivalence script (`equivalence_gpu.py`) under pytest: skipped without a
GPU or without the engines; where they are, its verdicts must be the expected ones."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU: the whole-model equivalence runs where a GPU is present",
                allow_module_level=True)
if all(importlib.util.find_spec(e) is None for e in ("vllm", "sglang")):
    pytest.skip("neither vLLM nor sglang is installed", allow_module_level=True)

SCRIPT = Path(__file__).with_name("equivalence_gpu.py")


def test_served_logprobs_match_peft_as_the_cpu_tier_measures() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          timeout=480)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "UNEXPECTED" not in done.stdout
