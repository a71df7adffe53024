"""Every limit of the checker at its edge: at the limit, one below and one above.

A mutant that turns ``rank > max_rank`` into ``rank > max_rank + 1`` (or ``>=``) must fail one
of these. The adapters are PEFT-format folders written by `lora_guard.testing.write_adapter`
(PEFT's keys and shapes for a tiny Llama, zero data; a few with data for the value scan).
"""

from __future__ import annotations

import json
import pathlib
import struct
from typing import Any

import pytest

import lora_guard as lg
from lora_guard._checking.invariants.lg102_rank_inconsistent import _conv_groups
from lora_guard._checking.rules.shared import share as _share
from lora_guard._testing.adapter_writer import write_adapter

BASE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
        "model_type": "llama"}
MOE = {**BASE, "model_type": "qwen3_moe", "num_experts": 4, "moe_intermediate_size": 128,
       "head_dim": 16}


def codes(folder: pathlib.Path | list[pathlib.Path], **limits: Any) -> list[str]:
    paths = folder if isinstance(folder, list) else [folder]
    return lg.check_adapters(paths, lg.ServingLimits(**limits)).codes()


def edit_config(folder: pathlib.Path, **fields: Any) -> pathlib.Path:
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, **fields}))
    return folder


# --- LG101: max rank and allowed ranks ------------------------------------------------------


@pytest.mark.parametrize(("max_rank", "expected"), [(15, ["LG101"]), (16, []), (17, [])])
def test_rank_16_against_max_rank_15_16_17(tmp_path: pathlib.Path, max_rank: int,
                                           expected: list[str]) -> None:
    assert codes(write_adapter(tmp_path / "a", rank=16), max_rank=max_rank) == expected


@pytest.mark.parametrize(("max_rank", "expected"), [(31, ["LG101"]), (32, []), (33, [])])
def test_a_rank_pattern_value_against_max_rank(tmp_path: pathlib.Path, max_rank: int,
                                               expected: list[str]) -> None:
    folder = write_adapter(tmp_path / "a", rank=8, rank_pattern={"q_proj": 32})
    assert codes(folder, max_rank=max_rank) == expected


def test_the_lg101_message_names_the_limit_and_the_rank(tmp_path: pathlib.Path) -> None:
    report = lg.check_adapters([write_adapter(tmp_path / "a", rank=16)],
                               lg.ServingLimits(max_rank=15))
    assert "rank 16 of " in report.violations[0].message
    assert "above the served max rank 15" in report.violations[0].message
    assert report.violations[0].details["rank"] == 16


@pytest.mark.parametrize(("allowed", "expected"), [
    ((15,), ["LG101"]), ((16,), []), ((17,), ["LG101"]), ((8, 16), []), ((8, 32), ["LG101"])])
def test_allowed_ranks_take_exactly_the_ranks_named(tmp_path: pathlib.Path,
                                                   allowed: tuple[int, ...],
                                                   expected: list[str]) -> None:
    assert codes(write_adapter(tmp_path / "a", rank=16), allowed_ranks=allowed) == expected


def test_max_rank_wins_over_allowed_ranks_for_one_rank(tmp_path: pathlib.Path) -> None:
    report = lg.check_adapters([write_adapter(tmp_path / "a", rank=16)],
                               lg.ServingLimits(max_rank=8, allowed_ranks=(8,)))
    assert [v.details.get("max_rank") for v in report.violations] == [8]


# --- LG110: slots --------------------------------------------------------------------------


@pytest.mark.parametrize(("max_loras", "expected"), [(2, ["LG110"]), (3, []), (4, [])])
def test_three_adapters_against_2_3_4_slots(tmp_path: pathlib.Path, max_loras: int,
                                            expected: list[str]) -> None:
    folders = [write_adapter(tmp_path / name) for name in ("a", "b", "c")]
    assert codes(folders, max_loras=max_loras) == expected


# --- LG109: layers, experts, dims, vocab ----------------------------------------------------


@pytest.mark.parametrize(("layers", "expected"), [(1, ["LG109"]), (2, []), (3, [])])
def test_layer_indices_against_the_base_layer_count(tmp_path: pathlib.Path, layers: int,
                                                    expected: list[str]) -> None:
    """An adapter of layers 0 and 1 fits a base of 2 or 3 layers, not of 1."""
    folder = write_adapter(tmp_path / "a", layers=2)
    assert codes(folder, base_config={**BASE, "num_hidden_layers": layers}) == expected


@pytest.mark.parametrize(("experts", "expected"), [(3, ["LG109"]), (4, []), (5, ["LG109"])])
def test_per_expert_indices_and_counts_against_the_base(tmp_path: pathlib.Path, experts: int,
                                                        expected: list[str]) -> None:
    """Experts 0-3: index 3 is past a 3-expert base; 5 experts is another count for a packed
    layout, but a per-expert adapter of 4 may serve on a base of 5 (experts it leaves out)."""
    folder = write_adapter(tmp_path / "a", moe_layout="per-expert", experts=4,
                           targets=("gate_proj", "up_proj", "down_proj"))
    got = codes(folder, base_config={**MOE, "num_experts": experts})
    assert got == (["LG109"] if experts == 3 else [])


@pytest.mark.parametrize(("experts", "expected"), [(3, ["LG109"]), (4, []), (5, ["LG109"])])
def test_a_flat_moe_expert_count_against_the_base(tmp_path: pathlib.Path, experts: int,
                                                  expected: list[str]) -> None:
    folder = write_adapter(tmp_path / "a", moe_layout="flat", experts=4,
                           targets=("gate_proj", "up_proj", "down_proj"))
    assert sorted(set(codes(folder, base_config={**MOE, "num_experts": experts}))) == expected


@pytest.mark.parametrize(("hidden", "expected"), [(63, ["LG109"]), (64, []), (65, ["LG109"])])
def test_module_dims_must_equal_the_base(tmp_path: pathlib.Path, hidden: int,
                                         expected: list[str]) -> None:
    folder = write_adapter(tmp_path / "a", hidden_size=64, num_heads=4, num_kv_heads=2)
    base = {**BASE, "hidden_size": hidden, "head_dim": 16}
    assert sorted(set(codes(folder, base_config=base))) == expected


@pytest.mark.parametrize(("vocab", "expected"), [(127, ["LG109"]), (128, []), (129, ["LG109"])])
def test_an_embedding_against_the_base_vocab(tmp_path: pathlib.Path, vocab: int,
                                             expected: list[str]) -> None:
    folder = write_adapter(tmp_path / "a", targets=("embed_tokens",), vocab_size=128)
    assert codes(folder, base_config={**BASE, "vocab_size": vocab}) == expected


# --- LG115, LG121: nothing in the file, a scaling of zero -----------------------------------


def test_zero_tensors_is_lg115_and_one_is_not(tmp_path: pathlib.Path) -> None:
    from lora_guard._reading.safetensors import encode_header, write_safetensors

    folder = write_adapter(tmp_path / "a", targets=("q_proj",), layers=1)
    header, size = encode_header([])
    write_safetensors(folder / "adapter_model.safetensors", header, size)
    assert codes(folder) == ["LG115"]
    header, size = encode_header([
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", "float16", (8, 64)),
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", "float16", (64, 8))])
    write_safetensors(folder / "adapter_model.safetensors", header, size)
    assert codes(folder) == []


@pytest.mark.parametrize(("alpha", "expected"), [(0, ["LG121"]), (0.001, []), (1, []),
                                                 (-1, [])])
def test_only_an_alpha_of_exactly_zero_is_lg121(tmp_path: pathlib.Path, alpha: float,
                                                expected: list[str]) -> None:
    assert codes(edit_config(write_adapter(tmp_path / "a"), lora_alpha=alpha)) == expected


def test_an_alpha_pattern_value_of_zero_is_lg121_for_the_modules_it_matches(
        tmp_path: pathlib.Path) -> None:
    folder = edit_config(write_adapter(tmp_path / "a"), alpha_pattern={"v_proj": 0})
    report = lg.check_adapters([folder])
    assert report.codes() == ["LG121"]
    assert "model.layers.0.self_attn.v_proj (and 1 more)" in report.violations[0].message
    edit_config(folder, alpha_pattern={"v_proj": 1})
    assert lg.check_adapters([folder]).ok


def test_alpha_zero_overridden_everywhere_by_alpha_pattern_is_clean(
        tmp_path: pathlib.Path) -> None:
    folder = edit_config(write_adapter(tmp_path / "a"), lora_alpha=0,
                         alpha_pattern={"q_proj": 8, "v_proj": 8})
    assert codes(folder) == []
    edit_config(folder, alpha_pattern={"q_proj": 8})
    report = lg.check_adapters([folder])
    assert report.codes() == ["LG121"]
    assert "v_proj" in report.violations[0].message and "q_proj" not in (
        report.violations[0].message.split("scaling")[1])


# --- LG119/LG120: the value scan at its edges ------------------------------------------------


def _set_data(folder: pathlib.Path, key_part: str, value: bytes, index: int = 0) -> None:
    """Write ``value`` as element ``index`` (-1: the last) of each tensor whose key holds
    ``key_part``."""
    from lora_guard._reading.safetensors import read_safetensors_header

    path = folder / "adapter_model.safetensors"
    tensors, _ = read_safetensors_header(path)
    with open(path, "r+b") as f:
        length = int.from_bytes(f.read(8), "little")
        for key, info in tensors.items():
            if key_part in key:
                at = index if index >= 0 else info.numel + index
                f.seek(8 + length + info.offsets[0] + at * len(value))
                f.write(value)


def test_one_non_zero_value_makes_a_lora_b_not_a_no_op(tmp_path: pathlib.Path) -> None:
    folder = write_adapter(tmp_path / "a", dtype="float16")  # the writer's data is zeros
    scanned = lg.check_adapters([folder], scan_values=True)
    assert scanned.codes() == ["LG119"]
    assert scanned.violations[0].details["count"] == 4
    _set_data(folder, "lora_B", struct.pack("<e", 2.0**-24), index=-1)  # the last value
    assert lg.check_adapters([folder], scan_values=True).ok


def test_the_largest_finite_values_are_not_inf_and_the_next_are(tmp_path: pathlib.Path) -> None:
    folder = write_adapter(tmp_path / "a", dtype="float32")
    _set_data(folder, "lora_B", struct.pack("<f", 1.0))
    _set_data(folder, "q_proj.lora_A", struct.pack("<f", 3.4028234663852886e38))  # max
    _set_data(folder, "v_proj.lora_A", struct.pack("<f", -3.4028234663852886e38))
    assert lg.check_adapters([folder], scan_values=True).ok
    _set_data(folder, "layers.1.self_attn.q_proj.lora_A", b"\x00\x00\x80\x7f")  # +inf
    report = lg.check_adapters([folder], scan_values=True)
    assert report.codes() == ["LG120"]
    assert "holds 0 NaN and 1 Inf values (of 512)" in report.violations[0].message


@pytest.mark.parametrize(("dtype", "largest", "smallest_bad"), [
    ("float16", b"\xff\x7b", b"\x00\x7c"), ("bfloat16", b"\x7f\x7f", b"\x80\x7f")])
def test_16_bit_floats_at_the_edge_of_finite(tmp_path: pathlib.Path, dtype: str,
                                             largest: bytes, smallest_bad: bytes) -> None:
    folder = write_adapter(tmp_path / "a", dtype=dtype)
    _set_data(folder, "lora_B", b"\x00\x3c" if dtype == "float16" else b"\x80\x3f")
    _set_data(folder, "layers.0.self_attn.q_proj.lora_A", largest)
    _set_data(folder, "layers.0.self_attn.v_proj.lora_A", largest[:1] + bytes(
        [largest[1] | 0x80]))  # the most negative finite value
    assert lg.check_adapters([folder], scan_values=True).ok
    _set_data(folder, "layers.1.self_attn.q_proj.lora_A", smallest_bad)
    report = lg.check_adapters([folder], scan_values=True)
    assert report.codes() == ["LG120"] and report.violations[0].details["inf"] == 1
    _set_data(folder, "layers.1.self_attn.q_proj.lora_A", smallest_bad[:1] + bytes(
        [smallest_bad[1] | 0x80]), index=1)  # -inf beside it
    assert lg.check_adapters([folder], scan_values=True).violations[0].details["inf"] == 2


# --- the small helpers' edges ----------------------------------------------------------------


def test_conv_groups_must_divide_rank_in_and_out() -> None:
    assert _conv_groups((8, 8, 3, 3), (16, 2, 1, 1)) == 4
    assert _conv_groups((8, 8, 3, 3), (16, 8, 1, 1)) == 1
    assert _conv_groups((8, 8, 3, 3), (16, 3, 1, 1)) == 0  # 8 % 3
    assert _conv_groups((8, 6, 3, 3), (16, 2, 1, 1)) == 0  # in 6 % 4
    assert _conv_groups((8, 8, 3, 3), (18, 2, 1, 1)) == 0  # out 18 % 4
    assert _conv_groups((8, 8, 3, 3), (16, 0, 1, 1)) == 0
    assert _conv_groups((8,), (16, 2)) == 0


def test_shares_are_rounded_and_tiny_ones_said_so() -> None:
    assert [_share(1, 200), _share(1, 100), _share(995, 1000), _share(0, 10), _share(1, 0)] == [
        "<1", "1", "100", "0", "0"]
    assert [_share(1, 1), _share(1000, 1000), _share(1, 3)] == ["100", "100", "33"]


# --- LG104: served targets, by name, by path suffix, fused, experts ---------------------------


@pytest.mark.parametrize(("served", "expected"), [
    (("q_proj", "v_proj"), []),
    (("q_proj",), ["LG104"]),                                     # one short
    (("self_attn.q_proj", "self_attn.v_proj"), []),               # path suffixes
    (("layers.0.self_attn.q_proj", "layers.0.self_attn.v_proj"), ["LG104"]),  # layer 1 not
    (("attn.q_proj", "v_proj"), ["LG104"]),                       # not a whole-name suffix
])
def test_served_targets_by_name_and_path_suffix(tmp_path: pathlib.Path, served: tuple[str, ...],
                                                expected: list[str]) -> None:
    folder = write_adapter(tmp_path / "a", targets=("q_proj", "v_proj"))
    assert sorted(set(codes(folder, target_modules=served))) == expected


@pytest.mark.parametrize(("target", "served", "expected"), [
    ("gate_up_proj", ("gate_proj", "up_proj"), []),
    ("gate_up_proj", ("gate_proj",), ["LG104"]),
    ("gate_up_proj", ("up_proj", "down_proj"), ["LG104"]),
    ("qkv_proj", ("q_proj", "k_proj", "v_proj"), []),
    ("qkv_proj", ("q_proj", "k_proj"), ["LG104"]),
    ("qkv_proj", ("k_proj", "v_proj"), ["LG104"]),
    ("w13", ("w1", "w3"), []),
    ("w13", ("w1",), ["LG104"]),
    ("w13", ("w3",), ["LG104"]),
])
def test_a_fused_module_is_served_when_all_its_parts_are(
        tmp_path: pathlib.Path, target: str, served: tuple[str, ...],
        expected: list[str]) -> None:
    from lora_guard._reading.safetensors import encode_header, write_safetensors

    folder = write_adapter(tmp_path / "a", targets=("q_proj",), layers=1)
    prefix = f"base_model.model.model.layers.0.mlp.{target}"
    header, size = encode_header([(f"{prefix}.lora_A.weight", "float16", (8, 64)),
                                  (f"{prefix}.lora_B.weight", "float16", (256, 8))])
    write_safetensors(folder / "adapter_model.safetensors", header, size)
    got = lg.check_adapters([folder], lg.ServingLimits(target_modules=served))
    assert got.codes() == expected
    if expected:
        assert f"({target}) is not served" in got.violations[0].message


@pytest.mark.parametrize("layout", ["flat", "shared-outer", "per-expert"])
@pytest.mark.parametrize(("served", "expected"), [
    (("experts",), []), (("gate_proj", "up_proj", "down_proj"), []), (("q_proj",), ["LG104"])])
def test_moe_expert_weights_are_served_by_experts_or_their_names(
        tmp_path: pathlib.Path, served: tuple[str, ...], expected: list[str],
        layout: str) -> None:
    folder = write_adapter(tmp_path / "a", moe_layout=layout, experts=4,
                           targets=("gate_proj", "up_proj", "down_proj"))
    if layout == "per-expert" and served == ("experts",):
        expected = ["LG104"]  # per-expert modules are named gate_proj/up_proj/down_proj
    assert sorted(set(codes(folder, target_modules=served))) == expected
