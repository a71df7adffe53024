"""LG104 (unsupported-target): a weight whose module the server does not serve, or a key
outside PEFT's grammar.

A server that serves LoRA on attention only (`target_modules=("q_proj", ...)`) drops an
adapter's MLP weights without a word: the check names each module it would drop. A fused
module (gate_up_proj) is served when all its parts are. Boundary tests (by name, by path
suffix, fused parts, MoE experts) are in `tests/test_boundaries.py`.
"""

from __future__ import annotations

import pathlib

import lora_guard as lg


def test_modules_the_server_does_not_serve(zoo: dict[str, pathlib.Path]) -> None:
    report = lg.check_adapters(zoo["r16-all-bf16"], lg.ServingLimits(
        target_modules=("q_proj", "k_proj", "v_proj", "o_proj")))
    assert report.codes() == ["LG104"] * 3
    assert {v.details["target"] for v in report.violations} == {
        "gate_proj", "up_proj", "down_proj"}
    fused = lg.check_adapters(zoo["moe-flat"], lg.ServingLimits(
        target_modules=("q_proj", "gate_proj", "up_proj", "down_proj")))
    assert fused.ok, fused.violations
