"""LG101 (rank-exceeds-limit): a rank above the served max rank, or not one of the allowed ranks.

A server sized for rank 16 (`--max-lora-rank 16`) cannot hold a rank-32 adapter: the check
reads each module's rank (the config's `r`, its `rank_pattern`, the tensors) and names the
module and the limit. Boundary tests (15, 16, 17) are in `tests/test_boundaries.py`.
"""

from __future__ import annotations

import pathlib

import pytest

import lora_guard as lg
from conftest_adapters import check, llama, save

pytest.importorskip("peft")

from peft import LoraConfig

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # PEFT's notes on saving


def test_rank_above_the_served_max(zoo: dict[str, pathlib.Path]) -> None:
    report = lg.check_adapters(zoo["r16-all-bf16"], lg.ServingLimits(max_rank=8))
    assert report.codes() == ["LG101"]
    err = report.violations[0]
    assert "rank 16 of model.layers.0.mlp.down_proj is above the served max rank 8" in err.message
    assert "--max-lora-rank" in err.hint


def test_rank_pattern_values_count_against_the_max(zoo: dict[str, pathlib.Path]) -> None:
    report = lg.check_adapters(zoo["rank-pattern-fp16"], lg.ServingLimits(max_rank=4))
    assert [v.details["rank"] for v in report.violations] == [6]
    allowed = lg.check_adapters(zoo["rank-pattern-fp16"], lg.ServingLimits(
        allowed_ranks=(2, 4)))
    assert allowed.codes() == ["LG101"]
    assert "is not one of the served ranks [2, 4]" in allowed.violations[0].message


def test_an_allowed_ranks_violation_is_not_a_max_rank_one(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = save(llama(), LoraConfig(r=8, target_modules=["q_proj"]), tmp_path / "r8")

    report = check(folder, allowed_ranks=(4, 16))

    assert report.codes() == ["LG101"]
    v = report.violations[0]
    assert "rank 8 of model.layers.0.self_attn.q_proj is not one of the served ranks [4, 16]" \
        in v.message
    assert "above" not in v.message and "--max-rank" not in v.hint
    assert "--allowed-ranks" in v.hint
    over = check(folder, max_rank=4).violations[0]
    assert "above the served max rank 4" in over.message and "--max-lora-rank" in over.hint
