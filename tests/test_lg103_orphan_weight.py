"""LG103 (orphan-weight): a lora_A without its lora_B, or the reverse.

A module with one half is silently skipped by a server (it serves the base weights there) or
crashes its loader. (lmdeploy's slot never written, the `unfilled-slot` variant, is tested on
lmdeploy itself: tests/engines/test_lmdeploy_engine.py.)
"""

from __future__ import annotations

import pathlib

import pytest

from conftest_adapters import TINY_LLAMA, check, llama, messages, save

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
safetensors_torch = pytest.importorskip("safetensors.torch")

from peft import LoraConfig  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # PEFT's notes on saving


def test_a_merged_save_that_lost_one_shards_lora_b_is_lg103_naming_the_module(
        tmp_path: pathlib.Path) -> None:
    """A sharded trainer merged its ranks' weights into one file, and the shard that held
    layer 1's q_proj lora_B never made it in: the file loads, the module serves the base."""
    folder = save(llama(), LoraConfig(r=8, target_modules=["q_proj", "v_proj"]), tmp_path / "a")
    weights = str(folder / "adapter_model.safetensors")
    tensors = safetensors_torch.load_file(weights)
    del tensors["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"]
    safetensors_torch.save_file(tensors, weights)

    report = check(folder, base_config=TINY_LLAMA)

    assert report.codes() == ["LG103"]
    assert messages(report).endswith(
        "model.layers.1.self_attn.q_proj has lora_A but no lora_B.")
    assert report.violations[0].hint.startswith("Re-save the adapter so every module has both")
