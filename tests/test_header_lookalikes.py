"""A header entry that only looks like one read before is still checked.

The reader remembers the tensor entries it has checked (a fleet of adapters of one recipe
repeats them, whatever their metadata) and finds them again by their value. ``8.0`` and
``true`` equal ``8`` and ``1`` as Python values, and ``{}`` or ``""`` hold no dims like ``[]``: each
of these lookalikes, read after the good adapter it mimics, must still be refused by name.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

import lora_guard as lg
from lora_guard.testing import write_adapter

WEIGHTS = "adapter_model.safetensors"


def _header(folder: pathlib.Path) -> tuple[dict[str, Any], bytes]:
    raw = (folder / WEIGHTS).read_bytes()
    length = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + length]), raw[8 + length:]


def _rewrite(folder: pathlib.Path, header: dict[str, Any], data: bytes) -> None:
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (folder / WEIGHTS).write_bytes(len(text).to_bytes(8, "little") + text + data)


def _with_scalar(folder: pathlib.Path) -> pathlib.Path:
    """The adapter plus a 0-dim F32 tensor (``shape: []``) at the end of its data."""
    header, data = _header(folder)
    header["base_model.model.scale"] = {"dtype": "F32", "shape": [],
                                        "data_offsets": [len(data), len(data) + 4]}
    _rewrite(folder, header, data + bytes(4))
    return folder


def _lookalike(folder: pathlib.Path, field: str, value: Any) -> pathlib.Path:
    """The adapter with ``field`` of its first LoRA A entry (or the scalar) set to ``value``."""
    header, data = _header(folder)
    name = ("base_model.model.scale" if value in ({}, "")
            else next(k for k in header if "lora_A" in k))
    header[name][field] = value
    _rewrite(folder, header, data)
    return folder


@pytest.mark.lora_guard(expect=["LG108"], reason="reads a lookalike header on purpose")
@pytest.mark.parametrize(("rank", "field", "value", "said"), [
    (8, "shape", [8.0, 64], "has shape [8.0, 64], not a list of non-negative integers"),
    (8, "shape", [8, 64.0], "has shape [8, 64.0], not a list of non-negative integers"),
    (1, "shape", [True, 64], "has shape [True, 64], not a list of non-negative integers"),
    (8, "data_offsets", [False, 1024], "has data_offsets [False, 1024], not two non-negative"),
    (8, "data_offsets", [0.0, 1024], "has data_offsets [0.0, 1024], not two non-negative"),
    (8, "data_offsets", [0, 1024.0], "has data_offsets [0, 1024.0], not two non-negative"),
    (8, "shape", {}, "has shape {}, not a list of non-negative integers"),
    (8, "shape", "", "has shape , not a list of non-negative integers"),
])
def test_an_entry_equal_in_value_to_a_checked_one_is_refused_for_its_types(
        tmp_path: pathlib.Path, rank: int, field: str, value: Any, said: str) -> None:
    good = _with_scalar(write_adapter(tmp_path / "good", rank=rank, dtype="float16"))
    lg.inspect_adapter(good)  # read first: its entries are remembered
    bad = _lookalike(_with_scalar(write_adapter(tmp_path / "bad", rank=rank, dtype="float16")),
                     field, value)

    with pytest.raises(lg.AdapterError) as refused:
        lg.inspect_adapter(bad)
    assert said in str(refused.value)
    assert lg.inspect_adapter(good).tensors == lg.inspect_adapter(good).tensors
