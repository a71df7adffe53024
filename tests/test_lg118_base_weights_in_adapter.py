"""LG118 (base-weights-in-adapter): full base-model weights shipped inside an adapter.

Targeting embed_tokens makes PEFT save the whole base embedding too; a server drops it and
keeps its own. The message says what it costs (bytes, share of the weights file).
"""

from __future__ import annotations

import pathlib

import pytest

from conftest_adapters import TINY_LLAMA, check, llama, messages, save

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from peft import LoraConfig

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # PEFT's notes on saving


def test_embedding_base_weights_in_an_adapter_are_lg118_with_their_cost(
        tmp_path: pathlib.Path) -> None:
    """Targeting embed_tokens makes PEFT save the whole base embedding too
    (save_embedding_layers='auto'); a server drops it and keeps its own."""
    folder = save(llama(), LoraConfig(r=8, target_modules=["q_proj", "embed_tokens"]),
                  tmp_path / "emb")

    report = check(folder)

    assert report.codes() == ["LG118"]
    text = messages(report)
    assert "model.embed_tokens.base_layer.weight ((128, 64), 32,768 bytes, 70% of the " \
           "weights file)" in text
    assert report.violations[0].details["bytes"] == 128 * 64 * 4
    assert "save_embedding_layers=False" in report.violations[0].hint
    # against the base model's config, its vocabulary is compared instead: same vocab, clean
    assert check(folder, base_config=TINY_LLAMA).ok
    resized = check(folder, base_config={**TINY_LLAMA, "vocab_size": 160})
    assert "LG109" in resized.codes() and "LG118" not in resized.codes()
    # saved without them, the adapter is lighter and clean without a base config too
    lighter = save(llama(), LoraConfig(r=8, target_modules=["q_proj", "embed_tokens"]),
                   tmp_path / "light", save_embedding_layers=False)
    assert check(lighter).ok
