"""LG107 (empty-tensor): a zero-size tensor.

Sharded trainers (ZeRO-3, FSDP) hold each parameter in pieces; saved from one rank without
gathering, the weights are empty placeholders that load without an error and add nothing.
"""

from __future__ import annotations

import pathlib

import pytest

from conftest_adapters import TINY_LLAMA, check, llama, messages, save

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
safetensors_torch = pytest.importorskip("safetensors.torch")

from peft import LoraConfig  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # PEFT's notes on saving


def test_a_zero3_save_without_gathering_is_lg107_for_each_placeholder(
        tmp_path: pathlib.Path) -> None:
    folder = save(llama(), LoraConfig(r=8, target_modules=["q_proj", "v_proj"]), tmp_path / "a")
    weights = str(folder / "adapter_model.safetensors")
    placeholders = {key: torch.empty(0) for key in safetensors_torch.load_file(weights)}
    safetensors_torch.save_file(placeholders, weights)  # what ZeRO-3's rank 0 holds ungathered

    report = check(folder, base_config=TINY_LLAMA)

    assert report.codes() == ["LG107"] * 8  # 2 layers x q, v x A, B: each one named
    assert "tensor base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight has zero " \
           "size (shape (0,))." in messages(report)
    assert report.violations[0].hint.startswith("Gather the full state dict before saving")


def test_one_rank_sliced_to_nothing_is_lg107_for_that_tensor_only(tmp_path: pathlib.Path) -> None:
    """A tensor-parallel rank that kept no columns of layer 1's v_proj lora_A: (8, 0)."""
    folder = save(llama(), LoraConfig(r=8, target_modules=["q_proj", "v_proj"]), tmp_path / "a")
    weights = str(folder / "adapter_model.safetensors")
    tensors = safetensors_torch.load_file(weights)
    key = "base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight"
    tensors[key] = tensors[key][:, :0].contiguous()
    safetensors_torch.save_file(tensors, weights)

    report = check(folder, base_config=TINY_LLAMA)

    assert report.codes() == ["LG107"]
    assert messages(report).endswith(f"tensor {key} has zero size (shape (8, 0)).")
