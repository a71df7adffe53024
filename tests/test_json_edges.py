"""Config and header texts at the edges of JSON read exactly as ``json.loads`` reads them.

The reader scans a text that starts with its value without the generic decoder's whitespace
steps; these say that whitespace around the value, trailing text and empty files still get
the value or the error the JSON standard library gives.
"""

from __future__ import annotations

import json
import pathlib

import pytest

import lora_guard as lg
from lora_guard.testing import write_adapter

CONFIG = "adapter_config.json"


def _config_text(folder: pathlib.Path) -> str:
    return json.dumps(json.loads((folder / CONFIG).read_text()))


@pytest.mark.parametrize("wrap", ["{}", " {}", "\n\t{}\r\n", "{}   ", "{}\n"])
def test_a_config_with_json_whitespace_around_it_is_read(tmp_path: pathlib.Path,
                                                          wrap: str) -> None:
    folder = write_adapter(tmp_path / "math", rank=8)
    text = _config_text(folder)
    (folder / CONFIG).write_text(wrap.replace("{}", text))

    assert lg.inspect_adapter(folder).config == json.loads(text)


@pytest.mark.lora_guard(expect=["LG108"], reason="configs that are not one JSON object")
@pytest.mark.parametrize("wrap", ["{} x", "{}\n{}", "{}\x0b", "\x0b{}", "", "   ", "{}]"])
def test_a_config_with_more_than_its_object_says_what_json_says(tmp_path: pathlib.Path,
                                                                 wrap: str) -> None:
    folder = write_adapter(tmp_path / "math", rank=8)
    text = wrap.replace("{}", _config_text(folder))
    (folder / CONFIG).write_text(text)
    with pytest.raises(json.JSONDecodeError) as stdlib:
        json.loads(text)

    with pytest.raises(lg.AdapterError) as refused:
        lg.inspect_adapter(folder)
    assert f"invalid JSON ({stdlib.value})" in str(refused.value)


@pytest.mark.parametrize("pad", [b"", b"  ", b" \n\t"])
def test_a_header_with_whitespace_before_or_after_it_is_read(tmp_path: pathlib.Path,
                                                             pad: bytes) -> None:
    folder = write_adapter(tmp_path / "math", rank=8)
    weights = folder / "adapter_model.safetensors"
    raw = weights.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = pad + raw[8:8 + length].rstrip() + pad
    weights.write_bytes(len(header).to_bytes(8, "little") + header + raw[8 + length:])

    spec = lg.inspect_adapter(folder)
    assert spec.modules["model.layers.0.self_attn.q_proj"].rank == 8


@pytest.mark.lora_guard(expect=["LG108"], reason="a header with text after its object")
def test_a_header_with_text_after_its_object_says_what_json_says(tmp_path: pathlib.Path) -> None:
    folder = write_adapter(tmp_path / "math", rank=8)
    weights = folder / "adapter_model.safetensors"
    raw = weights.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = raw[8:8 + length].rstrip() + b" {}"
    weights.write_bytes(len(header).to_bytes(8, "little") + header + raw[8 + length:])
    with pytest.raises(json.JSONDecodeError) as stdlib:
        json.loads(header)

    with pytest.raises(lg.AdapterError) as refused:
        lg.inspect_adapter(folder)
    assert f"header is not valid JSON ({stdlib.value})" in str(refused.value)
