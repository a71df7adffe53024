"""LG117 (not-lora): an adapter of another PEFT method than LoRA (LoHa, LoKr, IA3, VeRA,
AdaLoRA, OFT, BOFT), which a LoRA server cannot serve; named with its method.
"""

from __future__ import annotations

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
