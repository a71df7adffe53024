"""Differential agreement on the real vllm: every corpus adapter gets the engine's own verdict
and lora_guard's, and they agree, or the engine is silent on an adapter it would serve wrongly
(the reason is in `agreement.SILENT`). The table is `docs/engines/compatibility.md`."""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed: the engine tier runs in its own environment "
                "(tests/engines/run builds it and runs the tier)", allow_module_level=True)

import _harness as h
import agreement

import lora_guard as lg
from lora_guard.integrations import vllm as guard

pytestmark = pytest.mark.xdist_group("vllm")

ENGINE = "vllm"


@pytest.mark.lora_guard(allow=sorted(lg.INVARIANTS),
                         reason="the corpus breaks adapters on purpose, case by case")
def test_the_engine_and_lora_guard_agree_on_every_corpus_adapter(tmp_path):
    env = h.vllm_env()
    found = agreement.rows(ENGINE, tmp_path, guard)

    assert len(found) >= 40
    for verdict in ("agreement", "check_agreement"):  # the runtime guard, check --engine
        misses = [r.case.name for r in found if getattr(r, verdict) == "MISS"]
        assert misses == [], f"{verdict}: the engine refuses these, lora_guard passes {misses}"
        silent = {r.case.name for r in found if getattr(r, verdict) == "engine-silent"}
        assert silent == set(agreement.silent(ENGINE, env.version)), \
            "each engine-silent case says why"
    served = [r for r in found if r.engine == "accepts" and r.case.name.startswith("good-")
              and r.case.name not in agreement.silent(ENGINE, env.version)]
    assert served and all(r.guard == r.check == "accepts" for r in served), "no false alarm"
    # one profile: the guard in the engine and `check --engine` report the very same codes
    assert [(r.case.name, r.codes) for r in found] == [
        (r.case.name, r.check_codes) for r in found]
    stale = agreement.check_page(ENGINE, agreement.table(ENGINE, env.version, found),
                                 env.version)
    assert stale is None, stale
