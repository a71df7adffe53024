"""LG116 (unconverted-init): a PiSSA, OLoRA, CorDA, LoRA-GA or LoftQ adapter never converted.

These inits rewrite the base weights: the saved adapter is a delta from a modified base, and
served on the original base it is wrong. PEFT's conversion (save with
`path_initial_model_for_weight_conversion`) makes a plain LoRA that serves on the original.
"""

from __future__ import annotations

import json
import pathlib
import warnings
from typing import Any

import pytest

from conftest_adapters import TINY_LLAMA, check, llama, messages, save

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from peft import LoraConfig, get_peft_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # PEFT's notes on saving


@pytest.mark.parametrize(("init", "method"), [("pissa", "PiSSA"), ("olora", "OLoRA")])
def test_an_unconverted_pissa_or_olora_adapter_is_lg116(
        tmp_path: pathlib.Path, init: Any, method: str) -> None:
    folder = save(llama(), LoraConfig(r=8, target_modules=["q_proj", "v_proj"],
                                      init_lora_weights=init), tmp_path / init)

    report = check(folder, base_config=TINY_LLAMA)

    assert report.codes() == ["LG116"]
    assert f"initialised with {method} (init_lora_weights='{init}') and never converted" in (
        messages(report))
    assert "path_initial_model_for_weight_conversion" in report.violations[0].hint


@pytest.mark.parametrize(("init", "method"), [
    ("pissa_niter_4", "PiSSA"), ("corda", "CorDA"), ("loftq", "LoftQ"), ("lora_ga", "LoRA-GA")])
def test_every_base_rewriting_init_is_named(tmp_path: pathlib.Path, init: str,
                                            method: str) -> None:
    """CorDA, LoftQ and LoRA-GA need data or a quantiser to run: a PEFT adapter whose config
    says so stands for them (the weights are as such an adapter's)."""
    folder = save(llama(), LoraConfig(r=8, target_modules=["q_proj"]), tmp_path / init)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config,
                                                            "init_lora_weights": init}))

    report = check(folder)

    assert report.codes() == ["LG116"]
    assert f"initialised with {method}" in messages(report)


def test_a_converted_pissa_adapter_serves_on_the_original_base(tmp_path: pathlib.Path) -> None:
    """PEFT's documented conversion: save the initial adapter, then the trained one with
    path_initial_model_for_weight_conversion; the result is a plain LoRA of twice the rank."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_peft_model(llama(), LoraConfig(r=8, target_modules=["q_proj"],
                                                   init_lora_weights="pissa"))
        model.peft_config["default"].init_lora_weights = True  # type: ignore[attr-defined]
        model.save_pretrained(str(tmp_path / "init"))
        model.peft_config["default"].init_lora_weights = "pissa"  # type: ignore[attr-defined]
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.data += 0.01  # "training"
        model.save_pretrained(str(tmp_path / "converted"),
                              path_initial_model_for_weight_conversion=str(tmp_path / "init"))

    report = check(tmp_path / "converted", base_config=TINY_LLAMA)

    assert report.ok, messages(report)
    assert report.adapters[0].rank == 16
