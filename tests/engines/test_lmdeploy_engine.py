"""lora_guard's lmdeploy integration on the real lmdeploy 0.18.0 PyTorch engine, on a CPU.

A server starts as lmdeploy's model agent starts it: its own tiny Llama built by
``build_patched_model``, then ``agent.add_adapters(model, {name: path})`` for ``--adapters
name=path``. With the integration on, a bad adapter is refused with lora_guard's error before
``add_adapters`` touches the model (no LoRA module added), a good one loads as lmdeploy loads
it, and a worker process instrumented by a ``sitecustomize`` refuses it too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

if importlib.util.find_spec("lmdeploy") is None:
    pytest.skip("lmdeploy is not installed: its tier runs in its own environment "
                "(tests/engines/run --lmdeploy 0.18.0 builds it)", allow_module_level=True)

import _lmdeploy as ld
import torch

import lora_guard as lg
from lora_guard.integrations import lmdeploy as guard

pytestmark = pytest.mark.xdist_group("lmdeploy")

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def adapters(tmp_path: Path) -> dict[str, Path]:
    root = ld.corpus_root() / "adapters"
    return {name: ld.in_peft_0_14_form(root / name, tmp_path / name)
            for name in ("good-r8", "good-attention", "good-rslora", "missing-lora-b")}


@pytest.fixture
def guarded():
    guard.instrument()
    yield
    guard.uninstrument()


def _state(model: torch.nn.Module) -> tuple[list[str], list[str]]:
    return ([n for n, _ in model.named_modules()], [n for n, _ in model.named_parameters()])


def test_the_hook_is_the_name_the_model_agent_calls_and_is_restored_exactly() -> None:
    env = ld.lmdeploy_env()
    original = env.agent.add_adapters
    assert original is env.patch.add_adapters  # bound at import: `from ... import add_adapters`
    report = guard.instrument()
    try:
        assert set(report.attached) == {
            "lmdeploy.pytorch.engine.model_agent.agent:add_adapters",
            "lmdeploy.pytorch.models.patch:add_adapters"}
        assert env.agent.add_adapters is not original
    finally:
        guard.uninstrument()
    assert env.agent.add_adapters is original and env.patch.add_adapters is original


def test_good_adapters_load_through_the_guard_as_lmdeploy_loads_them(
        guarded: None, adapters: dict[str, Path]) -> None:
    model = ld.lmdeploy_model()
    ld.load(model, {"sql": adapters["good-r8"], "chat": adapters["good-attention"]})
    loaded = ld.loaded(model)
    q = loaded["model.layers.0.self_attn.qkv_proj.lora_adapters.q_proj"].adapter_info
    assert q.ranks.tolist() == [0, 8, 8]  # "no adapter", then chat, sql (sorted by name)
    assert loaded["model.layers.1.self_attn.qkv_proj.lora_adapters.k_proj"] \
        .adapter_info.ranks.tolist() == [0, 8, 0]


@pytest.mark.lora_guard(expect=["LG112", "LG103"],
                         reason="adapters lmdeploy serves wrongly, refused on purpose")
def test_a_bad_adapter_is_refused_before_the_model_is_touched(
        guarded: None, adapters: dict[str, Path]) -> None:
    model = ld.lmdeploy_model()
    before = _state(model)
    with pytest.raises(lg.AdapterError) as caught:
        ld.load(model, {"ok": adapters["good-r8"], "rs": adapters["good-rslora"],
                        "half": adapters["missing-lora-b"]})
    assert caught.value.code in ("LG103", "LG112")
    codes = {v.code for v in caught.value.violations}
    assert codes == {"LG112", "LG103"}  # every adapter checked first, reported together
    assert "adapter 'rs'" in str(caught.value) or "adapter 'half'" in str(caught.value)
    assert _state(model) == before and ld.loaded(model) == {}  # left as it was


@pytest.mark.lora_guard(expect=["LG202"], reason="a current PEFT's config, refused on purpose")
def test_a_current_peft_config_gets_lora_guards_error_not_lmdeploys_type_error(
        guarded: None) -> None:
    model = ld.lmdeploy_model()
    current = ld.corpus_root() / "adapters" / "good-r8"
    with pytest.raises(lg.AdapterError, match="PEFT 0.14 does not know") as caught:
        ld.load(model, {"sql": current})
    assert caught.value.code == "LG202" and ld.loaded(model) == {}


WORKER = """
    import sys
    sys.path.insert(0, {here!r})
    import _lmdeploy as ld
    import lora_guard as lg
    model = ld.lmdeploy_model()
    try:
        ld.load(model, {{"rs": {path!r}}})
    except lg.LoRAGuardError as exc:
        print("REFUSED", exc.code, len(ld.loaded(model)))
    else:
        print("LOADED", len(ld.loaded(model)))
"""


def test_a_worker_process_instrumented_by_sitecustomize_refuses_it(
        adapters: dict[str, Path], tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "from lora_guard.integrations import lmdeploy\nlmdeploy.instrument()\n")
    code = textwrap.dedent(WORKER.format(here=str(Path(__file__).parent),
                                         path=str(adapters["good-rslora"])))
    for path, said in ((f"{site}{os.pathsep}{SRC}", "REFUSED LG112 0"), (str(SRC), "LOADED")):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": path}, timeout=600, check=False)
        assert said in done.stdout, done.stdout + done.stderr[-2000:]


def test_doctor_shows_each_hook_with_the_release() -> None:
    done = subprocess.run([sys.executable, "-m", "lora_guard._frontends.cli", "doctor",
                           "--format", "json"], capture_output=True, text=True, timeout=600,
                          check=False, env={**os.environ, "PYTHONPATH": str(SRC)})
    data = json.loads(done.stdout)["engines"]["lmdeploy"]
    assert data["version"] == "0.18.0" and data["supported"] is True
    assert data["profile"] == "lmdeploy==0.18.0"
    assert sorted(data["attached"]) == [
        "lmdeploy.pytorch.engine.model_agent.agent:add_adapters",
        "lmdeploy.pytorch.models.patch:add_adapters"]
    assert data["missing"] == {} and data["import_errors"] == {}
