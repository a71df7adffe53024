"""What a checked adapter's config looks like to the user: the file's fields, read-only.

Specs keep their config in a compact form (a fleet of 100,000 adapters is held in one
Report); these tests say that it still reads like the ``adapter_config.json`` PEFT wrote.
"""

from __future__ import annotations

import json
import pathlib

import pytest

import lora_guard as lg
from conftest_adapters import peft_adapter


def test_a_checked_adapter_config_reads_like_the_file_peft_wrote(tmp_path: pathlib.Path) -> None:
    folder = peft_adapter(tmp_path / "math", r=8, lora_alpha=16,
                          target_modules=["q_proj", "v_proj"])
    written = json.loads((folder / "adapter_config.json").read_text())

    config = lg.inspect_adapter(folder).config

    assert config == written
    assert dict(config) == written
    assert list(config) == list(written)  # the file's order
    assert config["r"] == 8 and config.get("lora_alpha") == 16
    assert sorted(config["target_modules"]) == ["q_proj", "v_proj"]
    assert config.get("no_such_field", "default") == "default"
    assert "r" in config and "no_such_field" not in config
    with pytest.raises(KeyError):
        config["no_such_field"]


def test_a_spec_config_cannot_be_changed_behind_the_report(tmp_path: pathlib.Path) -> None:
    folder = peft_adapter(tmp_path / "math", r=8, target_modules=["q_proj"])
    report = lg.check_adapters(tmp_path)
    config = report.adapters[0].config

    with pytest.raises(TypeError):
        config["r"] = 64  # type: ignore[index]
    with pytest.raises(AttributeError):
        report.adapters[0].config = {"r": 64}  # type: ignore[misc]
    mine = dict(config)
    mine["r"] = 64  # a copy the user may change
    assert lg.inspect_adapter(folder).config["r"] == 8


def test_two_adapters_with_different_configs_keep_their_own_values(
        tmp_path: pathlib.Path) -> None:
    peft_adapter(tmp_path / "small", r=4, target_modules=["q_proj"])
    peft_adapter(tmp_path / "big", r=16, target_modules=["q_proj", "v_proj"])

    report = lg.check_adapters(tmp_path)

    by_name = {spec.name: spec.config for spec in report.adapters}
    assert by_name["small"]["r"] == 4 and by_name["big"]["r"] == 16
    assert by_name["small"]["target_modules"] == ["q_proj"]
    assert sorted(by_name["big"]["target_modules"]) == ["q_proj", "v_proj"]


def _with_config(folder: pathlib.Path, **fields: object) -> pathlib.Path:
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(fields)
    path.write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(("fields", "said"), [
    ({"r": 0}, "field 'r' is 0, not a positive integer"),
    ({"r": True}, "field 'r' is True, not a positive integer"),
    ({"r": 8.0}, "field 'r' is 8.0, not a positive integer"),
    ({"lora_alpha": "16"}, "field 'lora_alpha' is '16', not a finite number"),
    ({"lora_alpha": False}, "field 'lora_alpha' is False, not a finite number"),
    ({"target_modules": ["q_proj", 3]}, "field 'target_modules' is ['q_proj', 3]"),
    ({"rank_pattern": {"q_proj": 0}}, "rank_pattern['q_proj'] is 0"),
    ({"alpha_pattern": []}, "field 'alpha_pattern' is [], not an object"),
    ({"target_parameters": "w"}, "field 'target_parameters' is 'w', not a list"),
    ({"bias": "some"}, "field 'bias' is 'some', not one of"),
    ({"modules_to_save": [None]}, "field 'modules_to_save' is [None]"),
])
def test_a_usual_peft_config_with_one_field_gone_wrong_is_refused_naming_it(
        tmp_path: pathlib.Path, fields: dict[str, object], said: str) -> None:
    from lora_guard.testing import write_adapter

    folder = _with_config(write_adapter(tmp_path / "math"), **fields)

    with pytest.raises(lg.AdapterError) as refused:
        lg.inspect_adapter(folder)
    assert said in str(refused.value)


@pytest.mark.parametrize("fields", [
    {"bias": "all"}, {"bias": "lora_only"}, {"lora_alpha": 16.5}, {"target_modules": []},
    {"modules_to_save": ["lm_head"]}, {"rank_pattern": {"q_proj": 4}},
    {"alpha_pattern": None, "rank_pattern": None},
])
def test_a_config_off_the_usual_path_is_still_read(tmp_path: pathlib.Path,
                                                    fields: dict[str, object]) -> None:
    from lora_guard.testing import write_adapter

    folder = _with_config(write_adapter(tmp_path / "math"), **fields)

    config = lg.inspect_adapter(folder).config
    assert {name: config[name] for name in fields} == fields


def test_config_lists_of_any_json_are_kept_as_written(tmp_path: pathlib.Path) -> None:
    from lora_guard.testing import write_adapter

    fields: dict[str, object] = {
        "layers_to_transform": [0, 1], "eva_config": [{"rho": 2}, ["x"]],
        "exclude_modules": ["x" * 201, "lm_head"], "layers_pattern": ["layers", 1.5],
    }
    first = lg.inspect_adapter(_with_config(write_adapter(tmp_path / "a"), **fields)).config
    second = lg.inspect_adapter(_with_config(write_adapter(tmp_path / "b"), **fields)).config

    assert {name: first[name] for name in fields} == fields
    assert {name: second[name] for name in fields} == fields
    assert second["target_modules"] is first["target_modules"]  # equal name lists shared


def _with_metadata(folder: pathlib.Path, metadata: dict[str, str] | None) -> pathlib.Path:
    weights = folder / "adapter_model.safetensors"
    raw = weights.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + length])
    header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    weights.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + length:])
    return folder


def test_each_adapter_keeps_its_own_safetensors_metadata_read_only(
        tmp_path: pathlib.Path) -> None:
    from lora_guard.testing import write_adapter

    metadata = [{"format": "pt"}, {"format": "pt"}, {"format": "pt", "name": "b"},
                {f"k{i}": "v" for i in range(9)}, None]
    specs = [lg.inspect_adapter(_with_metadata(write_adapter(tmp_path / f"a{i}"), m))
             for i, m in enumerate(metadata)]

    assert [dict(s.metadata) for s in specs] == [m or {} for m in metadata]
    assert specs[0].metadata is specs[1].metadata  # equal metadata: one shared object
    with pytest.raises(TypeError):
        specs[2].metadata["format"] = "np"  # type: ignore[index]
    with pytest.raises(TypeError):
        specs[3].metadata["k0"] = "w"  # type: ignore[index]
    assert dict(specs[2].metadata) == {"format": "pt", "name": "b"}
