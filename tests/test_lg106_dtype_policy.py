"""LG106 (dtype-policy): a dtype outside the served set, or mixed dtypes in one adapter.

A server that serves bf16 only (`dtypes=("bf16",)`) casts or refuses a float32 adapter: the
check names the dtype, the tensor and what is allowed.
"""

from __future__ import annotations

import pathlib

import lora_guard as lg


def test_dtype_policy(zoo: dict[str, pathlib.Path]) -> None:
    report = lg.check_adapters([zoo["r8-qv"], zoo["r16-all-bf16"]],
                               lg.ServingLimits(dtypes=("bf16",)))
    assert report.codes() == ["LG106"]
    assert "dtype float32 of" in report.violations[0].message
    assert "allowed: bfloat16" in report.violations[0].message
