"""inspect_adapter on real PEFT adapters, and the strict header reader on hostile files."""

from __future__ import annotations

import json
import os
import pathlib
import struct

import pytest

import lora_guard as lg
from lora_guard._reading.safetensors import (
    MAX_HEADER_BYTES,
    HeaderError,
    encode_header,
    read_safetensors_header,
    write_safetensors,
)
from lora_guard._testing.adapter_writer import write_adapter

pytest.importorskip("peft")


# --- real PEFT adapters --------------------------------------------------------------------


def test_ranks_dtypes_and_targets_of_a_plain_adapter(zoo: dict[str, pathlib.Path]) -> None:
    spec = lg.inspect_adapter(zoo["r8-qv"])
    assert spec.rank == 8
    assert spec.dtypes == ("float32",)
    assert spec.target_modules == ("q_proj", "v_proj")
    assert spec.moe_layout is None and spec.layout == "dense"
    assert spec.config["lora_alpha"] == 16
    q = spec.modules["model.layers.1.self_attn.q_proj"]
    assert (q.kind, q.rank, q.a_shape, q.b_shape, q.layer) == ("linear", 8, (8, 64), (64, 8), 1)
    assert spec.modules["model.layers.0.self_attn.v_proj"].out_features == 32  # 2 kv heads
    assert spec.size == sum(p.stat().st_size for p in zoo["r8-qv"].iterdir()
                            if p.name.startswith("adapter_"))


def test_bf16_adapter_on_every_linear_module(zoo: dict[str, pathlib.Path]) -> None:
    spec = lg.inspect_adapter(zoo["r16-all-bf16"])
    assert spec.dtypes == ("bfloat16",)
    assert len(spec.modules) == 2 * 7
    assert spec.modules["model.layers.0.mlp.down_proj"].in_features == 128


def test_rank_pattern_ranks_per_module(zoo: dict[str, pathlib.Path]) -> None:
    spec = lg.inspect_adapter(zoo["rank-pattern-fp16"])
    ranks = {name: m.rank for name, m in spec.modules.items()}
    assert ranks == {
        "model.layers.0.self_attn.k_proj": 2, "model.layers.0.self_attn.q_proj": 4,
        "model.layers.1.self_attn.k_proj": 2, "model.layers.1.self_attn.q_proj": 6,
    }
    assert spec.rank == 6
    assert spec.dtypes == ("float16",)


@pytest.mark.parametrize(
    ("name", "feature", "extra"),
    [
        ("dora", "dora", "dora"),
        ("lora-bias", "lora_bias", "lora_bias"),
        ("modules-to-save", "modules_to_save", "modules_to_save"),
        ("trainable-tokens", "trainable_tokens", "trainable_tokens"),
    ],
)
def test_features_are_recognised_with_their_weights(
    zoo: dict[str, pathlib.Path], name: str, feature: str, extra: str
) -> None:
    spec = lg.inspect_adapter(zoo[name])
    assert feature in spec.features
    assert extra in spec.extra_keys.values()
    assert spec.unknown_keys == ()


def test_embedding_lora_and_saved_embedding_weights(zoo: dict[str, pathlib.Path]) -> None:
    spec = lg.inspect_adapter(zoo["embedding-fp16"])
    embed = spec.modules["model.embed_tokens"]
    assert (embed.kind, embed.rank, embed.a_shape, embed.b_shape) == (
        "embedding", 4, (4, 128), (64, 4))
    assert spec.modules["lm_head"].out_features == 128
    assert sorted(spec.extra_keys.values()) == ["embedding-base", "embedding-base"]
    assert spec.features == {}


def test_target_parameters_moe_adapter_is_flat(zoo: dict[str, pathlib.Path]) -> None:
    spec = lg.inspect_adapter(zoo["moe-flat"])
    assert spec.moe_layout is lg.MoELayout.FLAT
    assert lg.detect_moe_layout(spec) is lg.MoELayout.FLAT
    gate_up = spec.modules["model.layers.0.mlp.experts.base_layer"]
    down = spec.modules["model.layers.0.mlp.experts"]
    assert (gate_up.target, gate_up.kind, gate_up.rank, gate_up.experts) == (
        "gate_up_proj", "moe-flat", 4, 4)
    assert (down.target, down.in_features, down.out_features) == ("down_proj", 32, 64)


def test_an_adapter_spec_is_read_only(zoo: dict[str, pathlib.Path]) -> None:
    spec = lg.inspect_adapter(zoo["r8-qv"])
    with pytest.raises(TypeError):
        spec.config["r"] = 64  # type: ignore[index]
    with pytest.raises(AttributeError):
        spec.rank = 64  # type: ignore[misc]


def test_written_packed_and_shared_outer_adapters(tmp_path: pathlib.Path) -> None:
    for layout, expected in (("packed", lg.MoELayout.PER_EXPERT),
                             ("shared-outer", lg.MoELayout.SHARED_OUTER)):
        spec = lg.inspect_adapter(write_adapter(
            tmp_path / layout, rank=8, moe_layout=layout, experts=4,
            targets=("gate_proj", "up_proj", "down_proj")))
        assert spec.moe_layout is expected
        gate_up = spec.modules["model.layers.0.mlp.experts.gate_up_proj"]
        assert (gate_up.kind, gate_up.rank, gate_up.experts) == ("moe-packed", 8, 4)


def test_per_expert_modules_carry_their_expert_index(tmp_path: pathlib.Path) -> None:
    spec = lg.inspect_adapter(write_adapter(
        tmp_path / "a", moe_layout="per-expert", experts=3, targets=("down_proj",)))
    module = spec.modules["model.layers.1.mlp.experts.2.down_proj"]
    assert (module.kind, module.layer, module.expert) == ("moe-per-expert", 1, 2)


# --- hostile files: every one refused as LG108 naming the file and the problem -------------


@pytest.mark.parametrize(
    ("defect", "file", "words"),
    [
        ("missing-config", "adapter_config.json", "missing"),
        ("invalid-config-json", "adapter_config.json", "invalid JSON"),
        ("pickle-bin", "adapter_model.bin", "pickle weights refused"),
        ("missing-weights", "adapter_model.safetensors", "missing"),
        ("truncated-header", "adapter_model.safetensors", "truncated"),
        ("oversized-header", "adapter_model.safetensors", "cap"),
        ("invalid-header-json", "adapter_model.safetensors", "not valid JSON"),
        ("duplicate-key", "adapter_model.safetensors", "duplicate key"),
        ("unknown-dtype", "adapter_model.safetensors", "unknown dtype 'F13'"),
        ("negative-shape", "adapter_model.safetensors", "non-negative"),
        ("offsets-past-end", "adapter_model.safetensors", "past the end"),
        ("offsets-overlap", "adapter_model.safetensors", "overlaps"),
        ("trailing-bytes", "adapter_model.safetensors", "trailing bytes"),
        ("symlink-escape", "adapter_model.safetensors", "outside the adapter folder"),
    ],
)
def test_hostile_adapter_is_refused_as_lg108(
    tmp_path: pathlib.Path, defect: str, file: str, words: str
) -> None:
    folder = write_adapter(tmp_path / "upload", defects=(defect,))
    before = sorted(os.listdir(folder))
    with lg.recording() as rec, pytest.raises(lg.AdapterError) as info:
        lg.inspect_adapter(folder)
    err = info.value
    assert isinstance(err, ValueError)
    assert err.code == "LG108" and err.invariant == "malformed-adapter"
    assert f"adapter 'upload': {file}: " in str(err)
    assert words in str(err)
    assert err.details["file"] == file
    assert rec.codes == ["LG108"]
    assert sorted(os.listdir(folder)) == before


def test_lg108_is_raised_even_in_record_mode(tmp_path: pathlib.Path) -> None:
    folder = write_adapter(tmp_path / "a", defects=("pickle-bin",))
    lg.configure(mode="record")
    with pytest.raises(lg.AdapterError):
        lg.inspect_adapter(folder)


def test_a_pickle_is_never_unpickled(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "evil"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 8,
                                                            "target_modules": ["q_proj"]}))
    marker = tmp_path / "pwned"
    # A pickle that would create a file if it were ever loaded.
    payload = (b"cos\nsystem\n(V touch " + str(marker).encode() + b"\ntR.")
    (folder / "adapter_model.bin").write_bytes(payload)
    with pytest.raises(lg.AdapterError, match="pickle weights refused"):
        lg.inspect_adapter(folder)
    assert not marker.exists()


def test_config_symlink_out_of_the_folder_is_refused(tmp_path: pathlib.Path) -> None:
    folder = write_adapter(tmp_path / "a")
    (tmp_path / "elsewhere.json").write_text((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").unlink()
    (folder / "adapter_config.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(lg.AdapterError, match="adapter_config.json: path leads outside"):
        lg.inspect_adapter(folder)


def hf_cache_snapshot(cache: pathlib.Path, source: pathlib.Path) -> pathlib.Path:
    """Lay an adapter out as huggingface_hub caches it: files in blobs/, linked from
    snapshots/<revision>/ with relative symlinks."""
    repo = cache / "models--org--math-lora"
    snapshot = repo / "snapshots" / "3f2a9c"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, name in enumerate(("adapter_config.json", "adapter_model.safetensors")):
        blob = repo / "blobs" / f"blob{i}"
        blob.write_bytes((source / name).read_bytes())
        (snapshot / name).symlink_to(pathlib.Path("..", "..", "blobs", blob.name))
    return snapshot


def test_an_adapter_in_the_hugging_face_cache_is_read(tmp_path: pathlib.Path) -> None:
    snapshot = hf_cache_snapshot(tmp_path / "hub", write_adapter(tmp_path / "a", rank=16))
    assert lg.inspect_adapter(snapshot).rank == 16
    assert lg.check_adapters([snapshot]).ok


def test_a_cache_snapshot_still_cannot_link_out_of_its_repository(
    tmp_path: pathlib.Path,
) -> None:
    snapshot = hf_cache_snapshot(tmp_path / "hub", write_adapter(tmp_path / "a"))
    (snapshot / "adapter_config.json").unlink()
    (snapshot / "adapter_config.json").symlink_to(tmp_path / "a" / "adapter_config.json")
    with pytest.raises(lg.AdapterError, match="path leads outside"):
        lg.inspect_adapter(snapshot)


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ([1, 2], "not a JSON object"),
        ({"r": 8, "lora_alpha": 8, "target_modules": ["q_proj"], "rank_pattern": {"(a+)+b": 4}},
         "nests one repetition in another"),
        ({"lora_alpha": 8, "target_modules": ["q_proj"]}, "no 'r' field"),
        ({"r": "8", "lora_alpha": 8, "target_modules": ["q_proj"]}, "'r' is '8'"),
        ({"r": 8, "lora_alpha": 8, "target_modules": ["q_proj"], "rank_pattern": {"(": 4}},
         "not a regex"),
        ({"r": 8, "lora_alpha": 8, "target_modules": 3}, "target_modules"),
    ],
)
def test_invalid_config_values_are_lg108(
    tmp_path: pathlib.Path, config: object, words: str
) -> None:
    folder = write_adapter(tmp_path / "a")
    (folder / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(lg.AdapterError, match="LG108") as info:
        lg.inspect_adapter(folder)
    assert words in str(info.value)


def test_duplicate_config_keys_are_refused(tmp_path: pathlib.Path) -> None:
    folder = write_adapter(tmp_path / "a")
    (folder / "adapter_config.json").write_text(
        '{"r": 8, "r": 64, "lora_alpha": 8, "target_modules": ["q_proj"]}')
    with pytest.raises(lg.AdapterError, match="duplicate key 'r'"):
        lg.inspect_adapter(folder)


def test_a_file_instead_of_a_folder(tmp_path: pathlib.Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(lg.AdapterError, match="not an adapter folder"):
        lg.inspect_adapter(tmp_path / "model.safetensors")


# --- the reader itself ---------------------------------------------------------------------


def _file(tmp_path: pathlib.Path, raw: bytes, data: int = 0, length: int | None = None
          ) -> pathlib.Path:
    path = tmp_path / "x.safetensors"
    write_safetensors(path, raw, data, length=length)
    return path


@pytest.mark.parametrize(
    ("raw", "data", "words"),
    [
        (b"[]      ", 0, "does not start with a JSON object"),
        (b"{}\xff     ", 0, "not UTF-8"),
        (b'{"a": NaN}', 0, "non-standard JSON constant"),
        (b'{"a": {"dtype": "F16", "shape": [true], "data_offsets": [0, 2]}}', 2, "shape"),
        (b'{"a": {"dtype": "F16", "shape": [1], "data_offsets": [2, 0]}}', 2, "end before"),
        (b'{"a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 2]}}', 2, "needs 4 bytes"),
        (b'{"a": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}, '
         b'"b": {"dtype": "F16", "shape": [1], "data_offsets": [4, 6]}}', 6, "gap"),
        (b'{"a": {"dtype": "F16", "shape": [1]}}', 0, "has no data_offsets"),
        (b'{"a": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2], "x": [[[1]]]}}', 2,
         "nests"),
        (b'{"__metadata__": {"format": 1}}', 0, "__metadata__"),
        (b"[" * 100_000, 0, "does not start"),
        (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 0, "nests"),
        (b'{"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 1]}}', 1, "whole number"),
    ],
)
def test_reader_refuses_inconsistent_headers(
    tmp_path: pathlib.Path, raw: bytes, data: int, words: str
) -> None:
    with pytest.raises(HeaderError) as info:
        read_safetensors_header(_file(tmp_path, raw, data))
    assert words in info.value.problem


def test_deep_nesting_is_refused_without_recursion(tmp_path: pathlib.Path) -> None:
    raw = b'{"a": {"x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}}"
    with pytest.raises(HeaderError, match="nest"):
        read_safetensors_header(_file(tmp_path, raw))


def test_reader_caps_the_header_length_without_reading_it(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}")
    with pytest.raises(HeaderError, match="over the 100000000 byte cap"):
        read_safetensors_header(path)


@pytest.mark.parametrize("size", [0, 7])
def test_reader_refuses_files_too_short(tmp_path: pathlib.Path, size: int) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"\0" * size)
    with pytest.raises(HeaderError, match="too short"):
        read_safetensors_header(path)


def test_reader_agrees_with_safetensors_on_a_valid_file(tmp_path: pathlib.Path) -> None:
    safetensors = pytest.importorskip("safetensors")
    header, size = encode_header([("w", "bfloat16", (3, 5)), ("b", "float32", (5,)),
                                  ("e", "float16", (0, 4))], {"format": "pt"})
    path = tmp_path / "x.safetensors"
    write_safetensors(path, header, size)
    tensors, metadata = read_safetensors_header(path)
    assert metadata == {"format": "pt"}
    with safetensors.safe_open(str(path), "pt") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
            assert list(tensors[name].shape) == f.get_slice(name).get_shape()
    assert tensors["w"].dtype == "bfloat16" and tensors["w"].nbytes == 30


# --- the reader's fast paths give what the plain code gives ---------------------------------


def test_records_built_fast_equal_the_public_constructors(zoo: dict[str, pathlib.Path]) -> None:
    """The reader builds AdapterSpec, TensorInfo and LoRAModuleSpec without their frozen
    __init__ (for speed); a user gets the same records, equal, hashable and still frozen."""
    import dataclasses

    for name in ("r8-qv", "rank-pattern-fp16", "embedding-fp16", "moe-flat", "dora"):
        spec = lg.inspect_adapter(zoo[name])
        assert spec == dataclasses.replace(spec)
        with pytest.raises(dataclasses.FrozenInstanceError):
            spec.rank = 1  # type: ignore[misc]
        for info in spec.tensors.values():
            assert info == lg.TensorInfo(**{f.name: getattr(info, f.name)
                                            for f in dataclasses.fields(info)})
            assert hash(info) == hash(dataclasses.replace(info))
        for module in spec.modules.values():
            assert module == dataclasses.replace(module)
            with pytest.raises(dataclasses.FrozenInstanceError):
                module.rank = 1  # type: ignore[misc]


def test_the_fast_key_split_agrees_with_the_suffix_rules() -> None:
    """Keys are split by their last ``.lora_`` (one C call); every key, odd ones included,
    splits as the suffix-by-suffix rules split it."""
    import itertools

    from lora_guard._reading import grammar

    pieces = ("base_model.model.", "model.layers.0.", "q_proj", ".lora_", "A", "B", ".weight",
              ".bias", "embedding_A", "magnitude_vector", ".token_adapter",
              ".trainable_tokens_delta", "lora_A", ".", "")

    keys = {"".join(parts) for parts in itertools.product(pieces, repeat=4)}
    for key in keys:
        plain = None
        name = key.removeprefix("base_model.model.")
        for suffix, role in grammar._SUFFIX_ROLES:
            if name.endswith(suffix) and len(name) > len(suffix):
                plain = (name[: -len(suffix)], role)
                break
        assert grammar._split_key(key) == plain, key


def test_folders_read_in_phases_give_what_each_read_gives(tmp_path: pathlib.Path) -> None:
    """The checker reads a batch of folders a phase at a time; every adapter, good or refused
    at any step (config, header, weights, added tokens), gets the spec or the error it gets
    read alone, in order, and one adapter's error stops nothing for the others."""
    from lora_guard._reading.adapters import read_folder, read_folders
    from lora_guard.testing import DEFECTS

    folders = [write_adapter(tmp_path / "ok-0")]
    for defect, code in DEFECTS.items():
        if code == "LG108" or defect in ("config-not-lora", "dora"):
            folders.append(write_adapter(tmp_path / defect, defects=(defect,)))
    tokens = write_adapter(tmp_path / "bad-tokens")
    (tokens / "added_tokens.json").write_text('{"<x>": -1}')
    folders += [tokens, write_adapter(tmp_path / "ok-1", rank=16)]

    def outcome(result: object) -> object:
        if isinstance(result, Exception):
            return type(result).__name__, str(result)
        return result

    def read_alone(folder: pathlib.Path) -> object:
        try:
            return read_folder(folder)
        except Exception as exc:  # what read_folders keeps in its place
            return exc

    batched = read_folders(folders)
    assert [outcome(r) for r in batched] == [outcome(read_alone(f)) for f in folders]
    refused = [f.name for f, r in zip(folders, batched, strict=True) if isinstance(r, Exception)]
    assert "ok-0" not in refused and "ok-1" not in refused and "dora" not in refused
    assert {"bad-tokens", "missing-config", "truncated-header", "pickle-bin"} <= set(refused)
