"""The whole path a user runs (each run a process of its own, as a user's is):
``pytest --lora-guard --lora-guard-instrument=sglang`` on a server
test that loads a bad adapter through the real sglang. sglang's loader catches every exception
and returns ``success=False``; a test that only checks the happy path never looks. The plugin
fails it anyway, naming the code and the adapter."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("sglang is not installed: the engine tier runs in its own environment "
                "(tests/engines/run builds it and runs the tier)", allow_module_level=True)

import _harness as h

pytestmark = pytest.mark.xdist_group("sglang")

SERVER_TEST = """
    import _harness as h

    def test_server_loads_the_uploaded_adapter():
        manager = h.sglang_server(max_lora_rank=16, target_modules={{"q_proj", "v_proj"}})
        manager.load_lora_adapter(h.sglang_ref("upload", {path!r}))  # the result is unchecked
"""


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Made before pytester snapshots ``sys.modules`` (torch's libraries register once)."""
    h.skip_if_transformers_needs_torchvision()  # as the inner server test would skip
    root = tmp_path_factory.mktemp("uploads")
    return {"big": h.peft_adapter(root / "big", r=64), "good": h.peft_adapter(root / "good", r=8)}


@pytest.fixture
def server_suite(adapters: dict[str, Path], pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(f"import sys\nsys.path.insert(0, {str(h.HERE)!r})\n")
    return pytester


def test_a_refused_load_that_sglang_swallowed_fails_the_test(
        server_suite: pytest.Pytester, adapters: dict[str, Path]) -> None:
    adapter = adapters["big"]
    server_suite.makepyfile(test_server=textwrap.dedent(SERVER_TEST.format(path=str(adapter))))

    # Without lora_guard the test passes: sglang returned success=False and nobody looked.
    server_suite.runpytest_subprocess().assert_outcomes(passed=1)

    result = server_suite.runpytest_subprocess("--lora-guard", "--lora-guard-instrument=sglang")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*LG101 rank-exceeds-limit: adapter 'upload': rank 64*16*"])


def test_a_good_adapter_passes_under_the_plugin(
        server_suite: pytest.Pytester, adapters: dict[str, Path]) -> None:
    adapter = adapters["good"]
    server_suite.makepyfile(test_server=textwrap.dedent(SERVER_TEST.format(path=str(adapter))))
    result = server_suite.runpytest_subprocess("--lora-guard", "--lora-guard-instrument=sglang")
    result.assert_outcomes(passed=1)
