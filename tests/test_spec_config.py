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
