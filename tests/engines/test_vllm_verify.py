"""`lora-guard verify --engine vllm` on a trained adapter, as a user runs it: the installed
vllm's own LoRA layers against PEFT's, module by module, on the CPU."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed: the engine tier runs in its own environment "
                "(tests/engines/run builds it and runs the tier)", allow_module_level=True)

import _harness as h

from lora_guard._frontends.cli import main
from lora_guard._frontends.verify import VALIDATED_RELEASES

pytestmark = pytest.mark.xdist_group("vllm")


@pytest.fixture
def rslora(tmp_path):
    """A trained rsLoRA adapter (q/v, r=8) and its base model's folder, as saved."""
    h.vllm_env()
    keep: dict = {}
    adapter = h.peft_adapter(tmp_path / "rslora", keep=keep, use_rslora=True)
    return adapter, keep["base"]


INSTALLED = importlib.metadata.version("vllm")
measured = pytest.mark.skipif(
    INSTALLED not in (VALIDATED_RELEASES["vllm"] or ()),
    reason="verify is measured on vLLM " + ", ".join(VALIDATED_RELEASES["vllm"] or ()))


@measured
def test_verify_finds_vllm_serves_a_trained_rslora_adapter_as_trained(rslora, capsys):
    adapter, base = rslora
    code = main(["verify", str(adapter), "--engine", "vllm", "--base", str(base),
                 "--format", "json", "--no-progress"])
    report = json.loads(capsys.readouterr().out)

    assert code == 0
    assert report["verdict"] == "as trained" and report["engine"] == "vllm"
    trained = [r for r in report["modules"] if r["effect"] > 0]
    # the adapter does change q/v in both layers, both phases, and vLLM serves exactly that
    assert {r["part"].rsplit(".", 1)[1] for r in trained} == {"q_proj", "v_proj"}
    assert len(trained) == 8
    assert all(r["diff"] <= 1e-4 * r["effect"] for r in trained)


@pytest.mark.skipif(INSTALLED in (VALIDATED_RELEASES["vllm"] or ()),
                    reason="a release verify is measured on")
def test_verify_refuses_a_vllm_release_it_was_not_measured_on(rslora, capsys):
    adapter, base = rslora
    code = main(["verify", str(adapter), "--engine", "vllm", "--base", str(base)])
    err = capsys.readouterr().err

    assert code == 2
    assert "[engine-release-unverified]" in err and f"vllm {INSTALLED}" in err


@measured
def test_verify_reports_the_engines_refusal(tmp_path, capsys):
    h.vllm_env()
    keep: dict = {}
    adapter = h.peft_adapter(tmp_path / "dora", keep=keep, use_dora=True)
    code = main(["verify", str(adapter), "--engine", "vllm", "--base", str(keep["base"])])
    out = capsys.readouterr().out

    assert code == 1
    assert "the engine refuses to load it: ValueError: vLLM does not yet support DoRA." in out
    assert "verdict: refused" in out
