"""Attacks on the reader left over from round 2, each built as an uploader would build it:
a path component too long for the file system, a header offset written as ``-0``, a layer
index of 5,000 digits, an adapter folder swapped for a symlink between the search and the read.

Each gets a verdict that names the problem in lora_guard's words (LG108, exit 1), never an
internal error, never Python's own exception text, and never a read outside the folder.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import lora_guard as lg
from hostile.corpus import PREFIX, adapter, config, header, tensors, write_weights
from lora_guard._frontends.cli import main as cli_main

# Every test here breaks an invariant on purpose.
pytestmark = pytest.mark.lora_guard(allow=("LG108", "LG101"))


def _json_report(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = cli_main(["check", *argv, "--isolated", "--no-progress", "--format", "json"])
    out = capsys.readouterr()
    assert "internal error" not in out.err, out.err
    return code, json.loads(out.out)


# --- a path component too long -------------------------------------------------------------


@pytest.mark.parametrize("tail", ["", "/adapter_config.json", "/adapter"])
def test_a_path_component_too_long_is_lg108_exit_1_not_an_internal_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], tail: str) -> None:
    path = f"{tmp_path}/{'a' * 300}{tail}"
    code, report = _json_report(capsys, path)
    assert code == 1
    (entry,) = report["adapters"]
    (violation,) = entry["violations"]
    assert violation["code"] == "LG108"
    assert "File name too long" in violation["message"]
    assert lg.check_adapters(path).codes() == ["LG108"]  # the API says the same


# --- a header offset of -0 -----------------------------------------------------------------


def _negative_zero(root: Path, field: str) -> Path:
    """A valid adapter whose first tensor's first offset (or first dim) is written ``-0``."""
    head, data = header(tensors())
    raw = json.dumps(head).encode()
    first = json.dumps(head[PREFIX.format(layer=0, proj="q_proj") + ".lora_A.weight"]).encode()
    if field == "offset":
        edited = first.replace(b'"data_offsets": [0,', b'"data_offsets": [-0,')
    else:
        edited = first.replace(b'"shape": [8,', b'"shape": [-0, 8,')
    assert edited != first
    folder = adapter(root)
    write_weights(folder / "adapter_model.safetensors", raw.replace(first, edited, 1), data)
    return folder


@pytest.mark.parametrize("field", ["offset", "dim"])
def test_a_header_number_written_minus_zero_is_refused_as_the_safetensors_library_does(
        tmp_path: Path, field: str) -> None:
    folder = _negative_zero(tmp_path, field)
    report = lg.check_adapters(folder)
    assert report.codes() == ["LG108"]
    assert "-0" in report.violations[0].message
    assert "unsigned" in report.violations[0].message
    safetensors = pytest.importorskip("safetensors")
    with pytest.raises(Exception, match="-0"):  # the library refuses the file too
        with safetensors.safe_open(str(folder / "adapter_model.safetensors"), "np"):
            pass


def test_minus_zero_inside_a_name_or_metadata_is_not_a_number_and_passes(tmp_path: Path) -> None:
    """Only a number -0 is refused: text holding "-0" (a run name) is no reason to."""
    head, data = header(tensors())
    head["__metadata__"] = {"format": "pt", "run": "lr-0.0001"}
    folder = adapter(tmp_path, weights=(head, data))
    assert lg.check_adapters(folder).ok


# --- a layer index of 5,000 digits ---------------------------------------------------------


@pytest.mark.parametrize("where", ["layer", "expert"])
def test_a_5000_digit_index_is_refused_in_lora_guards_words(tmp_path: Path, where: str) -> None:
    digits = "9" * 5000
    module = (f"base_model.model.model.layers.{digits}.self_attn.q_proj" if where == "layer"
              else f"base_model.model.model.layers.0.mlp.experts.{digits}.gate_proj")
    head, data = header([(f"{module}.lora_A.weight", "F16", [8, 64]),
                         (f"{module}.lora_B.weight", "F16", [64, 8])])
    folder = adapter(tmp_path, weights=(head, data))
    report = lg.check_adapters(folder)
    assert report.codes() == ["LG108"]
    message = report.violations[0].message
    assert f"{where} index of 5,000 digits" in message
    assert "int_max_str_digits" not in message and "Exceeds the limit" not in message
    with pytest.raises(lg.AdapterError) as raised:
        lg.inspect_adapter(folder)
    assert "LG108" in str(raised.value) and "5,000 digits" in str(raised.value)
    assert "int_max_str_digits" not in str(raised.value)


# --- a folder swapped for a symlink between the search and the read ------------------------


_OPENED: list[str] = []
_WATCHED = threading.local()


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and getattr(_WATCHED, "on", False) and isinstance(args[0], str):
        path = args[0]
        if isinstance(args[2], int) and args[2] & getattr(os, "O_NOFOLLOW", 0):
            # a link itself is never followed: where it is, not where it leads
            path = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
        else:
            path = os.path.realpath(path)
        _OPENED.append(path)


sys.addaudithook(_audit)


def test_a_folder_swapped_for_a_symlink_after_the_search_is_not_read_where_it_leads(
        tmp_path: Path) -> None:
    """The search finds 40 real adapter folders; while the first batch is checked, an attacker
    replaces the 40th (found, not yet read) by a symlink to a folder elsewhere holding a
    rank-64 adapter. The checker refuses the swapped folder (LG108), reads nothing of the
    other folder, and the other 39 get their own verdicts."""
    for i in range(40):
        adapter(tmp_path / "uploads", name=f"a{i:02d}")
    outside = adapter(tmp_path / "elsewhere", cfg=config(r=64),
                      weights=header(tensors(rank=64)))
    last = tmp_path / "uploads" / "a39"
    swapped: list[bool] = []

    def swap(done: int, total: int) -> None:
        if done == 1:  # the search is over, the second batch not yet read
            parked = tmp_path / "parked"
            os.rename(last, parked)
            os.symlink(outside, last)
            swapped.append(True)

    _OPENED.clear()
    _WATCHED.on = True
    try:
        report = lg.check_adapters(tmp_path / "uploads", lg.ServingLimits(max_rank=16),
                                   progress=swap)
    finally:
        _WATCHED.on = False
    assert swapped
    assert len(report.ids) == 40
    assert report.by_adapter.keys() == {str(last)}
    (refused,) = report.by_adapter[str(last)]
    assert refused.code == "LG108"
    assert "replaced by a symlink" in refused.message
    assert _OPENED and not [p for p in _OPENED if p.startswith(str(tmp_path / "elsewhere"))]


def test_a_symlinked_folder_named_explicitly_is_still_followed(tmp_path: Path) -> None:
    """The user names the link: it is checked where it leads (only a search refuses links)."""
    target = adapter(tmp_path / "real", cfg=config(r=64), weights=header(tensors(rank=64)))
    link = tmp_path / "link"
    os.symlink(target, link)
    assert lg.check_adapters(link, lg.ServingLimits(max_rank=16)).codes() == ["LG101"]
