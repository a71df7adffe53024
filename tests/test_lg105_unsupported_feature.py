"""`bias="all"` / `"lora_only"` is refused for sglang only where the adapter holds bias tensors.

sglang reads no bias: an adapter whose training changed the base's biases (PEFT saves them with
the adapter) is served without them, and `lora-guard check --engine sglang` refuses it (LG105).
On a base without biases PEFT saves none: the flag alone changes nothing sglang serves (the
engine tier measures both, `tests/engines/test_sglang_equivalence.py`). vLLM refuses the flag
itself, so its profile refuses both.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

import lora_guard as lg  # noqa: E402


def _trained(path: pathlib.Path, *, biased_base: bool, bias: str) -> pathlib.Path:
    """A fine-tune as a user runs it: LoRA on q/v with ``bias``, the biases trained too."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, attention_bias=biased_base)
    model: Any = peft.get_peft_model(
        transformers.LlamaForCausalLM(config),
        peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"], bias=bias))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".bias") and parameter.requires_grad:
                parameter.add_(0.1)  # what training does to them
    model.save_pretrained(str(path))
    return path


def _codes(path: pathlib.Path, engine: str) -> list[str]:
    return lg.check_adapters([path], lg.ServingLimits.for_engine(engine)).codes()


@pytest.mark.parametrize("bias", ["all", "lora_only"])
def test_sglang_refuses_saved_trained_biases_and_accepts_the_flag_alone(
        tmp_path: pathlib.Path, bias: str) -> None:
    trained = _trained(tmp_path / "trained", biased_base=True, bias=bias)
    flag_only = _trained(tmp_path / "flag-only", biased_base=False, bias=bias)
    assert lg.inspect_adapter(trained).extra_keys, "PEFT saved the trained biases"
    assert not lg.inspect_adapter(flag_only).extra_keys, "no bias to save"

    assert _codes(trained, "sglang") == ["LG105"]
    report = lg.check_adapters([trained], lg.ServingLimits.for_engine("sglang"))
    assert "trained biases" in report.violations[0].message
    assert _codes(flag_only, "sglang") == []
    # vLLM refuses the flag itself (PEFTHelper: "Adapter bias is not supported")
    assert _codes(trained, "vllm") == ["LG105"]
    assert _codes(flag_only, "vllm") == ["LG105"]
