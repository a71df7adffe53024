"""The whole path a user runs: `pytest --lora-guard --lora-guard-instrument=sglang` on a server
test that loads a bad adapter through sglang. sglang's loader catches every exception and
returns success=False; a test that only checks the happy path never looks. The plugin fails
it anyway, naming the code and the adapter."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch  # noqa: F401 - imported once per process before pytester's in-process runs

from lora_guard._adapter_writer import write_adapter

REPLICAS = Path(__file__).parent / "replicas"

SERVER_TEST = """
    import torch, types
    from sglang.srt.lora.lora_manager import LoRAManager
    from sglang.srt.lora.lora_registry import LoRARef

    BASE = types.SimpleNamespace(hidden_size=64, num_hidden_layers=2, vocab_size=128)

    def test_server_loads_the_uploaded_adapter():
        manager = LoRAManager(torch.nn.Linear(2, 2), BASE, max_loras_per_batch=2,
                              max_lora_rank=16, target_modules=["q_proj", "v_proj"])
        ref = LoRARef(lora_id="upload", lora_name="upload", lora_path={path!r})
        manager.load_lora_adapter(ref)   # the result is never checked: the happy path
"""


@pytest.fixture
def server_suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.syspathinsert(REPLICAS)
    return pytester


def test_a_refused_load_that_sglang_swallowed_fails_the_test(
    server_suite: pytest.Pytester, tmp_path: Path
) -> None:
    adapter = write_adapter(tmp_path / "upload", rank=64, targets=("q_proj", "v_proj"))
    server_suite.makepyfile(test_server=textwrap.dedent(SERVER_TEST.format(path=str(adapter))))

    # Without lora_guard the test passes: sglang returned success=False and nobody looked.
    server_suite.runpytest().assert_outcomes(passed=1)

    result = server_suite.runpytest("--lora-guard", "--lora-guard-instrument=sglang")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*LG101 rank-exceeds-limit: adapter 'upload': rank 64*max rank 16*",
        "*LG101*1*",  # the session summary by code
    ])


def test_a_good_adapter_passes_under_the_plugin(
    server_suite: pytest.Pytester, tmp_path: Path
) -> None:
    adapter = write_adapter(tmp_path / "upload", rank=8, targets=("q_proj", "v_proj"))
    server_suite.makepyfile(test_server=textwrap.dedent(SERVER_TEST.format(path=str(adapter))))
    server_suite.runpytest("--lora-guard", "--lora-guard-instrument=sglang").assert_outcomes(
        passed=1)
