"""Differential agreement on the real lmdeploy 0.18.0 (PyTorch engine): every corpus adapter
goes through lmdeploy's own ``add_adapters`` on its own tiny Llama, first alone, then with
lora_guard's integration, and through ``lora-guard check --engine lmdeploy``; they agree, or
lmdeploy is silent on an adapter it would serve wrongly (the reason is in `SILENT`).

Two tables (docs/engines/compatibility.md): the corpus as a current PEFT saves it (lmdeploy's
pinned peft 0.14 fails every one of them: LG202), and the same adapters with their configs in
PEFT 0.14's form (the keys 0.14 does not know dropped), where lmdeploy's own rules decide.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

if importlib.util.find_spec("lmdeploy") is None:
    pytest.skip("lmdeploy is not installed: its tier runs in its own environment "
                "(tests/engines/run --lmdeploy 0.18.0 builds it)", allow_module_level=True)

import _lmdeploy as ld
import agreement
import corpus

import lora_guard as lg
from lora_guard.integrations import lmdeploy as guard

pytestmark = pytest.mark.xdist_group("lmdeploy")

ENGINE = "lmdeploy"
SILENT = {
    "good-rslora": "lmdeploy scales by lora_alpha / r, not rsLoRA's lora_alpha / sqrt(r): the "
                   "delta serves at another strength (measured: test_lmdeploy_equivalence)",
    "good-alpha-pattern": "lmdeploy scales every module by lora_alpha / r: v_proj serves at a "
                          "quarter of its strength (measured: test_lmdeploy_equivalence)",
    "pissa": "PiSSA rewrote the base weights in training: on the original base, garbage",
    "olora": "OLoRA rewrote the base weights in training: on the original base, garbage",
    "added-tokens": "lmdeploy reads no added_tokens.json: the adapter's new tokens are never "
                    "served",
    "missing-lora-b": "lora_A without lora_B loads: that module's lora_B rows stay "
                      "uninitialised (torch.empty) (measured: test_lmdeploy_equivalence)",
    "good-layers-to-transform": "lmdeploy gives q_proj/v_proj a slot in every layer: layer "
                                "1's is never written and serves uninitialised memory "
                                "(measured: test_lmdeploy_equivalence)",
}
"""The cases lmdeploy accepts (configs in PEFT 0.14's form) and serves wrongly."""
FORMS = {"0.18.0": "as a current PEFT saves them",
         "0.18.0, configs in PEFT 0.14's form": "keys PEFT 0.14 does not know dropped"}


def _verdict(name: str, path: Path) -> tuple[str, str, tuple[str, ...]]:
    model = ld.lmdeploy_model()
    with lg.recording() as seen:
        try:
            ld.load(model, {name: path})
        except lg.LoRAGuardError as exc:
            return "refuses", str(exc), tuple(dict.fromkeys(seen.codes))
        except Exception as exc:  # the engine's own failure, whatever it is
            return "refuses", f"{type(exc).__name__}: {exc}", ()
    return "accepts", "", ()


def rows(adapters: Path, base_config: Path) -> list[agreement.Row]:
    limits = lg.ServingLimits.for_engine(ENGINE, base_config=base_config)
    found = []
    for case in corpus.CASES:
        path = adapters / case.name
        alone = _verdict(case.name, path)
        guard.instrument()
        try:
            guarded = _verdict(case.name, path)
        finally:
            guard.uninstrument()
        check = tuple(dict.fromkeys(lg.check_adapters([path], limits).codes()))
        found.append(agreement.Row(case, alone[0], alone[1],
                                   "refuses" if guarded[2] else "accepts", guarded[2],
                                   "refuses" if check else "accepts", check))
    return found


@pytest.mark.lora_guard(allow=sorted(lg.INVARIANTS),
                         reason="the corpus breaks adapters on purpose, case by case")
@pytest.mark.parametrize("form", list(FORMS))
def test_lmdeploy_and_lora_guard_agree_on_every_corpus_adapter(tmp_path: Path,
                                                                form: str) -> None:
    env = ld.lmdeploy_env()
    root = ld.corpus_root()
    adapters = root / "adapters"
    if form != "0.18.0":
        adapters = tmp_path / "peft-0.14"
        for case in corpus.CASES:
            ld.in_peft_0_14_form(root / "adapters" / case.name, adapters / case.name)
    agreement.SILENT[ENGINE] = SILENT if form != "0.18.0" else {}
    found = rows(adapters, ld.base_config_path(root))

    assert len(found) == len(corpus.CASES) >= 40
    for verdict in ("agreement", "check_agreement"):  # the runtime guard, check --engine
        misses = [r.case.name for r in found if getattr(r, verdict) == "MISS"]
        assert misses == [], f"{verdict}: lmdeploy refuses these, lora_guard passes {misses}"
        silent = {r.case.name for r in found if getattr(r, verdict) == "engine-silent"}
        assert silent == set(agreement.SILENT[ENGINE]), "each engine-silent case says why"
    if form == "0.18.0":  # lmdeploy's pinned peft 0.14 fails every current PEFT config
        assert {r.engine for r in found} == {"refuses"}
        assert all("LG202" in r.codes for r in found)
    else:
        served = [r for r in found if r.engine == "accepts" and r.case.name not in SILENT]
        assert len(served) >= 12 and all(r.guard == r.check == "accepts" for r in served), \
            "no false alarm"
    # one profile: the guard in the engine and `check --engine` report the very same codes
    assert [(r.case.name, r.codes) for r in found] == [
        (r.case.name, r.check_codes) for r in found]
    assert env.version == "0.18.0"
    stale = agreement.check_page(ENGINE, agreement.table(ENGINE, form, found), form)
    assert stale is None, stale
