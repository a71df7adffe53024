"""LG109 for an adapter trained on another base model: said once, with the count and the first
mismatches, and a fix that is true of the adapter's config (issue 26, item 8)."""

from __future__ import annotations

import json
import pathlib

import pytest

import lora_guard as lg
from lora_guard.testing import write_adapter

pytestmark = pytest.mark.lora_guard(allow=("LG109",))

TINY_BASE = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
             "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 128}


def _trained_on_a_wider_base(folder: pathlib.Path, base_model: str | None) -> pathlib.Path:
    """q/k/v/o at hidden 96 (a wider model of the same architecture), checked against 64."""
    return write_adapter(folder, hidden_size=96, targets=("q_proj", "k_proj", "v_proj", "o_proj"),
                         config_overrides={"base_model_name_or_path": base_model})


def test_an_adapter_of_another_base_is_one_lg109_with_the_count_and_first_mismatches(
        tmp_path: pathlib.Path) -> None:
    folder = _trained_on_a_wider_base(tmp_path / "wide", "org/llama-96")
    report = lg.check_adapters(folder, lg.ServingLimits(base_config=TINY_BASE))
    assert report.codes() == ["LG109"]
    (said,) = report.violations
    assert "weights do not fit the base model's dims" in said.message
    assert said.details["count"] == sum(m["count"] for m in said.details["mismatches"])
    assert said.details["kinds"] == len(said.details["mismatches"]) > 3
    assert said.message.count(" where the base has ") == 3
    assert "in dim 96 where the base has 64 (hidden_size 64)" in said.message
    assert f"and {said.details['kinds'] - 3} more" in said.message
    assert "base_model_name_or_path" in said.hint  # it names one: look there
    json.dumps(report.to_dict())  # the mismatches are JSON


def test_a_single_mismatch_keeps_its_own_line(tmp_path: pathlib.Path) -> None:
    folder = write_adapter(tmp_path / "a", targets=("q_proj",))
    base = {**TINY_BASE, "head_dim": 20}  # q_proj's out dim 4 x 20: only that one differs
    report = lg.check_adapters(folder, lg.ServingLimits(base_config=base))
    assert [v.details.get("which") for v in report.violations] == ["out"]
    assert "has out dim 64, but q_proj on the base model has 80" in report.violations[0].message


@pytest.mark.parametrize("named", [None, ""])
def test_the_fix_does_not_point_at_an_empty_base_model_name(
        tmp_path: pathlib.Path, named: str | None) -> None:
    folder = _trained_on_a_wider_base(tmp_path / "wide", named)
    (said,) = lg.check_adapters(folder, lg.ServingLimits(base_config=TINY_BASE)).violations
    assert "see base_model_name_or_path" not in said.hint
    assert "does not say which" in said.hint
