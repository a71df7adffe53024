"""LG121 (zero-scaling): a scaling of zero (lora_alpha 0, or an alpha_pattern value of 0): the
adapter adds nothing. Boundary tests (exactly zero, alpha_pattern) in `tests/test_boundaries.py`.
"""

from __future__ import annotations

import pathlib

import pytest

from conftest_adapters import check, llama, messages, save

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from peft import LoraConfig

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # PEFT's notes on saving


def test_alpha_zero_is_lg121_the_adapter_adds_nothing(tmp_path: pathlib.Path) -> None:
    folder = save(llama(), LoraConfig(r=8, lora_alpha=0, target_modules=["q_proj"]),
                  tmp_path / "alpha0")

    report = check(folder)

    assert report.codes() == ["LG121"]
    assert "lora_alpha is 0, so the scaling alpha/r of model.layers.0.self_attn.q_proj " \
           "(and 1 more) is 0" in messages(report)
