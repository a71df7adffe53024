"""LG115 (no-weights): an adapter whose weights file holds no tensors.

A ZeRO-3 (or FSDP) save without gathering writes a valid safetensors file with an empty
header: it loads, and serves the base model unchanged. Boundary test (0 tensors, 1) in
`tests/test_boundaries.py`.
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


def test_an_adapter_whose_weights_hold_no_tensor_is_lg115(tmp_path: pathlib.Path) -> None:
    """A ZeRO-3 save without gathering: a valid safetensors file with an empty header."""
    folder = save(llama(), LoraConfig(r=8, target_modules=["q_proj"]), tmp_path / "zero3")
    safetensors_torch.save_file({}, str(folder / "adapter_model.safetensors"))

    report = check(folder, base_config=TINY_LLAMA)

    assert report.codes() == ["LG115"]
    assert "adapter_model.safetensors holds no tensors" in messages(report)
    assert "gather" in report.violations[0].hint
