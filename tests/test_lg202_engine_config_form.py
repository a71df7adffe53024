"""LG202 (engine-config-form): a config an engine reads in another form than PEFT wrote it.

The sglang and lmdeploy forms are tested with their engines (`tests/test_engine_profiles.py`,
`tests/test_engine_lmdeploy.py`, the engine tier). Here: PEFT itself, the reference engine,
fails on a layer selection written in a form it does not take, which a config edited by hand
or by a converter has.
"""

from __future__ import annotations

import json
import pathlib

import pytest

import lora_guard as lg
from conftest_adapters import llama, messages, peft_alone

pytest.importorskip("peft")
pytest.importorskip("transformers")

from peft import LoraConfig, PeftModel, get_peft_model


def _adapter(folder: pathlib.Path, **changes: object) -> pathlib.Path:
    get_peft_model(llama(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                       init_lora_weights=False)).save_pretrained(str(folder))
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, **changes}))
    return folder


@pytest.mark.parametrize(("changes", "peft_error", "said"), [
    ({"layers_to_transform": "0,1"}, TypeError,
     "layers_to_transform is '0,1', neither an integer nor a list of layer indices"),
    ({"layers_to_transform": 1.0}, TypeError,
     "layers_to_transform is 1.0, neither an integer nor a list"),
    ({"layers_pattern": "layers"}, ValueError,
     "layers_pattern is set without layers_to_transform"),
    ({"layers_to_transform": [0], "target_modules": r".*\.(q_proj|v_proj)"}, ValueError,
     "layers_to_transform is set with target_modules a regex string"),
])
def test_peft_fails_on_a_layer_selection_in_a_form_it_does_not_take(
    tmp_path: pathlib.Path, changes: dict[str, object], peft_error: type[Exception], said: str,
) -> None:
    folder = _adapter(tmp_path / "edited", **changes)
    with pytest.raises(peft_error), peft_alone():
        PeftModel.from_pretrained(llama(), str(folder))

    report = lg.check_adapters([folder], lg.ServingLimits.for_engine("peft"))

    assert report.codes() == ["LG202"]
    assert said in messages(report)
    # the fix for a layer selection, not the sglang / lmdeploy ones
    assert "layers_to_transform as a list of layer indices" in report.violations[0].hint
    # vLLM reads neither field: it serves the weights as they are
    assert lg.check_adapters([folder], lg.ServingLimits.for_engine("vllm")).ok
