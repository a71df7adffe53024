"""write_adapter writes what PEFT's save_pretrained writes, and every defect it promises."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

import lora_guard as lg
from conftest_adapters import TINY_QWEN3_MOE, peft_adapter
from lora_guard._reading.safetensors import read_safetensors_header
from lora_guard._testing.adapter_writer import DEFECTS, write_adapter

pytest.importorskip("peft")


def _header(folder: pathlib.Path) -> dict[str, tuple[tuple[int, ...], str]]:
    tensors, _ = read_safetensors_header(folder / "adapter_model.safetensors")
    return {name: (info.shape, info.dtype) for name, info in tensors.items()}


def _config(folder: pathlib.Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((folder / "adapter_config.json").read_text())
    return config


SAME_SETTINGS = [
    pytest.param(
        {"rank": 8, "alpha": 16, "targets": ("q_proj", "v_proj"), "dtype": "float32"},
        {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]},
        id="attention-fp32",
    ),
    pytest.param(
        {"rank": 4, "alpha": 8, "dtype": "bfloat16",
         "targets": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                     "down_proj"),
         "rank_pattern": {"k_proj": 2, "layers.1.self_attn.q_proj": 6}},
        {"r": 4, "lora_alpha": 8, "dtype": "bfloat16",
         "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                            "down_proj"],
         "rank_pattern": {"k_proj": 2, "layers.1.self_attn.q_proj": 6}},
        id="all-linear-rank-pattern-bf16",
    ),
    pytest.param(
        {"rank": 4, "alpha": 4, "targets": ("embed_tokens", "lm_head"), "dtype": "float16"},
        {"r": 4, "lora_alpha": 4, "target_modules": ["embed_tokens", "lm_head"],
         "dtype": "float16"},
        id="embeddings-fp16",
    ),
]


@pytest.mark.parametrize(("ours", "theirs"), SAME_SETTINGS)
def test_written_adapter_matches_peft_save_pretrained(
    tmp_path: pathlib.Path, ours: dict[str, object], theirs: dict[str, object]
) -> None:
    mine = write_adapter(tmp_path / "mine", base_model=None, **ours)  # type: ignore[arg-type]
    peft = peft_adapter(tmp_path / "peft", **theirs)  # type: ignore[arg-type]

    assert _header(mine) == _header(peft)
    mine_config, peft_config = _config(mine), _config(peft)
    assert set(mine_config) == set(peft_config)
    for field in ("r", "lora_alpha", "rank_pattern", "bias", "use_dora", "lora_bias",
                  "modules_to_save", "peft_type", "target_parameters", "task_type",
                  "base_model_name_or_path", "use_rslora"):
        assert mine_config[field] == peft_config[field], field
    assert set(mine_config["target_modules"]) == set(peft_config["target_modules"])


def test_flat_moe_layout_matches_peft_target_parameters(tmp_path: pathlib.Path) -> None:
    mine = write_adapter(
        tmp_path / "mine", rank=4, alpha=4, targets=("q_proj", "gate_proj", "up_proj",
                                                     "down_proj"),
        moe_layout="flat", experts=TINY_QWEN3_MOE["num_experts"],
        intermediate_size=TINY_QWEN3_MOE["moe_intermediate_size"], dtype="float32",
        base_model=None,
    )
    peft = peft_adapter(
        tmp_path / "peft", model="qwen3moe", r=4, lora_alpha=4, target_modules=["q_proj"],
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
    )
    assert _header(mine) == _header(peft)
    # PEFT saves target_parameters from a set: its order follows the hash seed.
    assert sorted(_config(mine)["target_parameters"]) == sorted(_config(peft)["target_parameters"])
    assert lg.inspect_adapter(mine).moe_layout is lg.MoELayout.FLAT


def test_each_packed_layout_is_detected_as_it_was_written(tmp_path: pathlib.Path) -> None:
    expected = {"per-expert": lg.MoELayout.PER_EXPERT, "packed": lg.MoELayout.PER_EXPERT,
                "shared-outer": lg.MoELayout.SHARED_OUTER, "flat": lg.MoELayout.FLAT}
    for layout, detected in expected.items():
        folder = write_adapter(tmp_path / layout, moe_layout=layout,
                               targets=("gate_proj", "up_proj", "down_proj"))
        assert lg.detect_moe_layout(lg.inspect_adapter(folder)) is detected, layout


def test_adapters_are_kilobytes(tmp_path: pathlib.Path) -> None:
    folder = write_adapter(tmp_path / "a")
    size = sum(p.stat().st_size for p in folder.iterdir())
    assert size < 16_000


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_each_defect_is_reported_with_its_code(tmp_path: pathlib.Path, defect: str) -> None:
    folder = write_adapter(tmp_path / defect, defects=(defect,))
    report = lg.check_adapters(folder, lg.ServingLimits(base_config={
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}))
    assert DEFECTS[defect] in report.codes(), report.violations


@pytest.mark.parametrize("defect", ["empty-tensor", "rank-mismatch", "orphan-a", "mixed-dtype"])
def test_a_layer_moved_out_of_range_keeps_the_other_defect_of_a_one_layer_adapter(
        tmp_path: pathlib.Path, defect: str) -> None:
    """Moving the last layer renames the pair the other defect breaks: both are written, in
    whichever order they are given (a one-layer plan the strategies draw)."""
    for order in ((defect, "layer-out-of-range"), ("layer-out-of-range", defect)):
        folder = write_adapter(tmp_path / "-".join(order), layers=1, defects=order)
        report = lg.check_adapters(folder, lg.ServingLimits(base_config={
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}))
        assert {DEFECTS[defect], "LG109"} <= set(report.codes()), report.violations


def test_defects_that_break_a_pair_each_break_their_own(tmp_path: pathlib.Path) -> None:
    """An orphaned A and a B of another dtype: two pairs broken, both found; an adapter with
    one pair is refused for the two, before its folder is made."""
    folder = write_adapter(tmp_path / "two", defects=("orphan-a", "mixed-dtype"))
    assert {"LG103", "LG106"} <= set(lg.check_adapters(folder).codes())
    with pytest.raises(ValueError, match="orphan-a, mixed-dtype each break a LoRA pair of "
                       "their own, and this adapter has 1; give it more targets or layers"):
        write_adapter(tmp_path / "one", targets=("q_proj",), layers=1,
                      defects=("orphan-a", "mixed-dtype"))
    assert not (tmp_path / "one").exists()


def test_unknown_defect_lists_the_known_ones(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="unknown defect") as info:
        write_adapter(tmp_path / "a", defects=("orphan",))
    assert "orphan-b" in str(info.value)
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"rank": 0}, "rank"),
        ({"targets": "q_proj"}, "targets=('q_proj',)"),
        ({"targets": ("qproj",)}, "each target must be one of"),
        ({"dtype": "fp8"}, "dtype"),
        ({"moe_layout": "stacked"}, "moe_layout"),
        ({"moe_layout": "flat", "targets": ("q_proj",)}, "needs an MLP target"),
        ({"hidden_size": 65}, "head_dim"),
        ({"rank_pattern": {"q_proj": -1}}, "rank_pattern"),
        ({"rank_pattern": {"(": 4}}, "not a regex"),
    ],
)
def test_bad_options_are_refused_before_anything_is_written(
    tmp_path: pathlib.Path, options: dict[str, object], words: str
) -> None:
    with pytest.raises(ValueError, match="write_adapter") as info:
        write_adapter(tmp_path / "a", **options)  # type: ignore[arg-type]
    assert words in str(info.value)
    assert not (tmp_path / "a").exists()


def test_config_overrides_land_in_the_config(tmp_path: pathlib.Path) -> None:
    folder = write_adapter(tmp_path / "a", config_overrides={"use_rslora": True, "r": 8})
    assert _config(folder)["use_rslora"] is True
