"""Serving equivalence on the real sglang: every corpus adapter through sglang's own LoRA modules
(prefill and decode), against PEFT as trained and reloaded from the files (`equivalence.py`).
The measured table is in `docs/engines/compatibility.md`."""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("sglang is not installed: the engine tier runs in its own environment "
                "(tests/engines/run builds it and runs the tier)", allow_module_level=True)

import _harness as h
import equivalence

import lora_guard as lg

pytestmark = pytest.mark.xdist_group("sglang")

ENGINE = "sglang"


@pytest.mark.lora_guard(allow=sorted(lg.INVARIANTS),
                         reason="the corpus breaks adapters on purpose, case by case")
def test_what_sglang_computes_with_every_corpus_adapter(tmp_path):
    env = h.sglang_env()
    found = equivalence.check_tier(ENGINE, env.version, tmp_path)
    assert len(found) >= 40
    # what the issue measured by hand, now asserted
    assert found["good-rslora"].detail.endswith("rsLoRA ignored (alpha/r)")
    assert "alpha_pattern ignored" in found["good-alpha-pattern"].detail
    assert "a bias differs" in found["lora-bias"].detail
    assert "a bias differs" in found["bias-lora-only"].detail
    assert found["save-lm-head"].verdict == found["save-embed"].verdict == "other"
    assert "adapter ignored" in found["trainable-tokens"].detail
    assert found["bias-all-none-saved"].verdict == "as trained"
    assert found["good-r8"].verdict == found["good-all-linear"].verdict == "as trained"
