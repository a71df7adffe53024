"""Serving equivalence on the real vllm: every corpus adapter through vllm's own LoRA modules
(prefill and decode), against PEFT as trained and reloaded from the files (`equivalence.py`).
The measured table is in `docs/engines/compatibility.md`."""

from __future__ import annotations

import importlib.metadata
import importlib.util

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed: the engine tier runs in its own environment "
                "(tests/engines/run builds it and runs the tier)", allow_module_level=True)

import _harness as h
import equivalence

import lora_guard as lg

pytestmark = pytest.mark.xdist_group("vllm")

ENGINE = "vllm"


@pytest.mark.skipif(importlib.metadata.version("vllm") != "0.34.0",
                    reason="measured on vLLM 0.34.0 only: on 0.31.0 the harness's decode step "
                    "left every module at the base (driver or engine: not yet told apart)")
@pytest.mark.lora_guard(allow=sorted(lg.INVARIANTS),
                         reason="the corpus breaks adapters on purpose, case by case")
def test_what_vllm_computes_with_every_corpus_adapter(tmp_path):
    env = h.vllm_env()
    found = equivalence.check_tier(ENGINE, env.version, tmp_path)
    assert len(found) >= 40
    assert found["good-rslora"].verdict == "as trained"
    assert found["embedding"].verdict == found["lm-head"].verdict == "as trained"
    assert found["good-r8"].verdict == found["good-all-linear"].verdict == "as trained"
