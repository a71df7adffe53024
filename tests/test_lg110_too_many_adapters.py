"""LG110 (too-many-adapters): more adapters than the server has slots (`--max-loras`).

A check of the whole set, reported once for the set (`by_adapter["*"]`, the JSON report's
`set_violations`). Boundary tests (3 adapters against 2, 3, 4 slots) are in
`tests/test_boundaries.py`.
"""

from __future__ import annotations

import pathlib

import lora_guard as lg
from lora_guard._testing.adapter_writer import write_adapter


def test_too_many_adapters_for_the_slots(tmp_path: pathlib.Path) -> None:
    for i in range(3):
        write_adapter(tmp_path / f"a{i}")
    report = lg.check_adapters(tmp_path, lg.ServingLimits(max_loras=2))
    assert report.codes() == ["LG110"]
    assert report.by_adapter["*"][0].message == (
        "adapter set: 3 adapters, but the server has 2 slots.")
    assert report.to_dict()["set_violations"][0]["code"] == "LG110"
