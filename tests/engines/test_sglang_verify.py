"""`lora-guard verify --engine sglang` on a trained adapter, as a user runs it: the installed
sglang's own LoRA layers against PEFT's, module by module, on the CPU."""

from __future__ import annotations

import importlib.util
import json

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("sglang is not installed: the engine tier runs in its own environment "
                "(tests/engines/run builds it and runs the tier)", allow_module_level=True)

import _harness as h

from lora_guard._frontends.cli import main

pytestmark = pytest.mark.xdist_group("sglang")


@pytest.fixture
def rslora(tmp_path):
    """A trained rsLoRA adapter (q/v, r=8) and its base model's folder, as saved."""
    h.sglang_env()
    keep: dict = {}
    adapter = h.peft_adapter(tmp_path / "rslora", keep=keep, use_rslora=True)
    return adapter, keep["base"]


def test_verify_names_how_sglang_serves_a_trained_rslora_adapter(rslora, capsys):
    adapter, base = rslora
    code = main(["verify", str(adapter), "--engine", "sglang", "--base", str(base)])
    out, err = capsys.readouterr()

    assert code == 1, out  # differs
    assert f"on sglang {h.sglang_env().version}" in out  # the installed release
    for layer in (0, 1):
        for module in ("q_proj", "v_proj"):
            line = next(x for x in out.splitlines() if f"layers.{layer}.self_attn.{module}" in x)
            assert "differs: scaled by 0.3536: rsLoRA ignored (alpha/r)" in line
            assert "decode, prefill" in line
    assert "k_proj" not in out  # served as trained: not listed
    # sglang's default --lora-target-modules, inferred from the adapter: q/k/v are wrapped (one
    # qkv_proj per layer), with the embeddings and lm_head that run either way
    assert "verdict: differs (4 of 8 modules as trained" in out
    assert "4/4 modules" in err  # the progress bar reached the end (engine modules)


def test_verify_json_lists_every_module_in_both_phases(rslora, capsys):
    adapter, base = rslora
    code = main(["verify", str(adapter), "--engine", "sglang", "--base", str(base),
                 "--format", "json", "--no-progress"])
    out, err = capsys.readouterr()
    report = json.loads(out)

    assert code == 1 and "modules" not in err  # no progress bar
    assert report["verdict"] == "differs" and report["engine"] == "sglang"
    rows = report["modules"]
    assert len(rows) == 16  # embeddings, q/k/v of 2 layers, lm_head (8) x 2 phases
    assert {r["phase"] for r in rows} == {"prefill", "decode"}
    off = {r["part"] for r in rows if r["verdict"] != "as trained"}
    assert off == {f"model.layers.{i}.self_attn.{m}" for i in (0, 1) for m in ("q_proj", "v_proj")}
