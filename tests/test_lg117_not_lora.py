"""LG117 (not-lora): an adapter of another PEFT method than LoRA (LoHa, LoKr, IA3, VeRA,
AdaLoRA, OFT, BOFT), which a LoRA server cannot serve; named with its method.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

import lora_guard as lg
from conftest_adapters import TINY_LLAMA, check, llama, messages, save

pytest.importorskip("torch")
pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # PEFT's notes on saving


def _other_methods() -> list[tuple[str, Any]]:
    return [
        ("LoHa", peft.LoHaConfig(r=8, target_modules=["q_proj"])),
        ("LoKr", peft.LoKrConfig(r=8, target_modules=["q_proj"])),
        ("IA3", peft.IA3Config(target_modules=["q_proj", "down_proj"],
                               feedforward_modules=["down_proj"])),
        ("VeRA", peft.VeraConfig(r=8, target_modules=["q_proj"])),
        ("AdaLoRA", peft.AdaLoraConfig(r=8, target_modules=["q_proj"], total_step=10)),
        ("OFT", peft.OFTConfig(oft_block_size=8, target_modules=["q_proj"])),
        ("BOFT", peft.BOFTConfig(boft_block_size=4, target_modules=["q_proj"])),
    ]


@pytest.mark.parametrize(("method", "config"), _other_methods(), ids=lambda x: str(x)[:8])
def test_another_peft_method_is_lg117_named_with_its_method(
        tmp_path: pathlib.Path, method: str, config: Any) -> None:
    folder = save(llama(), config, tmp_path / method)

    report = check(folder, base_config=TINY_LLAMA)

    assert report.codes() == ["LG117"]
    text = messages(report)
    assert f"is {method}, another PEFT method than LoRA" in text
    assert "the server serves LoRA only" in text
    with pytest.raises(lg.AdapterError, match="serves LoRA only") as caught:
        lg.inspect_adapter(folder)
    assert caught.value.code == "LG117"


# LoRA's own peft_type, spelled as a hand-written or converted config spells it. Each engine's
# real loader was run on these (vLLM 0.34.0 / 0.31.0, sglang 0.5.23 / 0.5.20, PEFT 0.21,
# lmdeploy 0.18.0; tests/engines/ corpus `peft-type-*` keeps judging them): vLLM does not read
# peft_type, sglang asserts `peft_type.lower() == "lora"`, PEFT and lmdeploy look it up in
# PeftType (KeyError), and a missing field fails all three.
_MISSING = object()
_SPELLINGS = {  # spelling -> the engines that refuse it (None: `check` without --engine)
    "lora": {None, "peft", "lmdeploy"},
    "Lora": {None, "peft", "lmdeploy"},
    "LORA ": {None, "peft", "lmdeploy", "sglang"},
    None: {None, "peft", "lmdeploy", "sglang"},
    _MISSING: {None, "peft", "lmdeploy", "sglang"},
    "LORA": set(),
}


def _lora_spelled(tmp_path: pathlib.Path, spelling: object) -> pathlib.Path:
    folder = save(llama(), peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]),
                  tmp_path / "spelled")
    config_file = folder / "adapter_config.json"
    config = json.loads(config_file.read_text())
    if spelling is _MISSING:
        del config["peft_type"]
    else:
        config["peft_type"] = spelling
    config_file.write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("spelling", list(_SPELLINGS),
                         ids=lambda s: "missing" if s is _MISSING else repr(s))
def test_loras_peft_type_in_another_spelling_is_each_engines_call(
        tmp_path: pathlib.Path, spelling: object) -> None:
    folder = _lora_spelled(tmp_path, spelling)

    refused = set()
    for engine in (None, "vllm", "sglang", "peft", "lmdeploy"):
        limits = None if engine is None else lg.ServingLimits.for_engine(engine)
        report = lg.check_adapters([folder], limits)
        # (lmdeploy also refuses every config a current PEFT saves: LG202, its own test)
        assert set(report.codes()) - {"LG117"} == ({"LG202"} if engine == "lmdeploy" else set())
        found = [v for v in report.violations if v.code == "LG117"]
        if found:
            assert "refuses the adapter at load" in found[0].message
            assert (engine or "PEFT") in found[0].message
            assert 'Write `"peft_type": "LORA"`' in found[0].hint
            refused.add(engine)

    assert refused == _SPELLINGS[spelling]
    spec = lg.inspect_adapter(folder)  # the reader reads it: acceptance is the engine's
    assert spec.config.get("peft_type", _MISSING) == spelling


def test_another_methods_name_over_lora_weights_is_lg117_on_every_engine(
        tmp_path: pathlib.Path) -> None:
    # vLLM does not read peft_type and would serve these weights as LoRA; the config says
    # they are LoHa's, which PEFT loads (as LoHa) and sglang and lmdeploy refuse.
    folder = _lora_spelled(tmp_path, "loha")

    for engine in (None, "vllm", "sglang", "peft", "lmdeploy"):
        limits = None if engine is None else lg.ServingLimits.for_engine(engine)
        report = lg.check_adapters([folder], limits)
        assert report.codes() == ["LG117"], engine  # the reader's: nothing else is read
        assert "is LoHa, another PEFT method than LoRA" in messages(report)


def test_peft_loading_a_lora_spelled_lowercase_gets_lg117_before_peft_fails(
        tmp_path: pathlib.Path) -> None:
    from lora_guard.integrations import peft as peft_guard

    good = save(llama(), peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]),
                tmp_path / "good")
    spelled = _lora_spelled(tmp_path, "lora")
    peft_guard.instrument()
    try:
        model = peft.PeftModel.from_pretrained(llama(), str(good))
        with pytest.raises(lg.AdapterError, match="peft_type 'lora'") as caught:
            model.load_adapter(str(spelled), adapter_name="spelled")
    finally:
        peft_guard.uninstrument()

    assert caught.value.code == "LG117"
    assert "spelled" not in model.peft_config  # refused before PEFT read it
