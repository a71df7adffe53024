"""What lmdeploy 0.18.0 serves with each adapter it accepts, measured against PEFT.

For each corpus adapter lmdeploy loads (configs in PEFT 0.14's form, the one lmdeploy can
read), every LoRA module lmdeploy built runs its own forward (``LoRA.forward`` ->
``TritonLoRAImpl`` -> the fused_lora Triton kernel, in Triton's interpreter on the CPU: see
``_lmdeploy.lora_delta``) on random tokens; PEFT 0.14 (lmdeploy's pinned peft) loads the same
adapter on a transformers model of the base it was trained on, and its LoRA layer's output
minus its base layer's is the reference. Memory lmdeploy allocates and never writes is made
visible as NaN (`_lmdeploy.uninitialised_as_nan`).

The adapters that serve otherwise than PEFT are exactly those lora_guard refuses on lmdeploy
and lmdeploy itself accepts (`SILENT` of the agreement test), and nothing else. PiSSA and
OLoRA are not measured here: their deltas are served as PEFT computes them, on the original
base weights they no longer match (the base, not the delta, differs; measured on vLLM and
sglang, where the engines' base layers run on the CPU).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("lmdeploy") is None:
    pytest.skip("lmdeploy is not installed: its tier runs in its own environment "
                "(tests/engines/run --lmdeploy 0.18.0 builds it)", allow_module_level=True)

import _lmdeploy as ld
import agreement
import corpus
import torch

import lora_guard as lg

pytestmark = pytest.mark.xdist_group("lmdeploy")

MEASURED = ("good-r8", "good-r1", "good-attention", "good-mlp", "good-rslora",
            "good-alpha-pattern", "good-layers-to-transform", "good-dropout", "rank-64",
            "packed-qkv", "missing-lora-b", "bias-all-none-saved")
SERVES_WRONGLY = {"good-rslora", "good-alpha-pattern", "good-layers-to-transform",
                  "missing-lora-b"}
CASES = {case.name: case for case in corpus.CASES}


def _peft_modules(case: corpus.Case, path: Path) -> dict[str, Any]:
    """PEFT 0.14's model of the adapter: module path (``model.layers.0.self_attn.q_proj``)
    -> its LoRA layer (or the plain layer where PEFT put none)."""
    import _harness as h
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = case.base() if case.base else h.llama_config()
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_config(config), str(path))
    model.eval()
    return {name.removeprefix("base_model.model."): module
            for name, module in model.named_modules()}


def _peft_delta(module: Any, x: torch.Tensor) -> torch.Tensor:
    base = getattr(module, "base_layer", None)
    if base is None:  # no LoRA on this module in PEFT's model: it adds nothing
        return torch.zeros(x.shape[0], module.out_features)
    with torch.no_grad():
        return module(x) - base(x)


def measure(case: corpus.Case, path: Path) -> dict[str, float]:
    """Module -> the largest difference of lmdeploy's LoRA output from PEFT's, relative to
    PEFT's (NaN where lmdeploy serves uninitialised memory)."""
    model = ld.lmdeploy_model()
    with ld.uninitialised_as_nan():
        ld.load(model, {case.name: path})
    peft = _peft_modules(case, path)
    torch.manual_seed(1)
    found = {}
    for name, module in ld.loaded(model).items():
        if int(module.adapter_info.ranks[1]) == 0:
            continue  # no slot of this adapter here
        parent, target = name.split(".lora_adapters.")
        peft_name = parent.rsplit(".", 1)[0] + "." + target
        x = torch.randn(5, module.adapter_info.in_features)
        served = ld.lora_delta(module, x)
        expected = _peft_delta(peft[peft_name], x)
        scale = float(expected.abs().max()) or 1.0
        found[peft_name] = float((served - expected).abs().max()) / scale
    return found


def _wrong(errors: dict[str, float]) -> list[str]:
    return [m for m, e in errors.items() if not e <= 1e-4]  # NaN is wrong too


@pytest.mark.lora_guard(allow=sorted(lg.INVARIANTS),
                         reason="the corpus breaks adapters on purpose, case by case")
def test_lmdeploy_serves_as_peft_exactly_the_adapters_lora_guard_passes(tmp_path: Path) -> None:
    root = ld.corpus_root()
    limits = lg.ServingLimits.for_engine("lmdeploy", base_config=ld.base_config_path(root))
    wrong, passed = set(), set()
    lines = ["| adapter | modules measured | lmdeploy vs PEFT (largest relative error) | "
             "lora_guard on lmdeploy |", "|---|---|---|---|"]
    for name in MEASURED:
        path = ld.in_peft_0_14_form(root / "adapters" / name, tmp_path / name)
        errors = measure(CASES[name], path)
        assert errors, name
        bad = _wrong(errors)
        if bad:
            wrong.add(name)
        codes = lg.check_adapters([path], limits).codes()
        if not codes:
            passed.add(name)
        worst = max(errors.values(), key=lambda e: float("inf") if e != e else e)
        said = "NaN: uninitialised memory served" if worst != worst else f"{worst:.2g}"
        where = f" ({bad[0]}{f' and {len(bad) - 1} more' if len(bad) > 1 else ''})" \
            if bad else ""
        lines.append(f"| `{name}` | {len(errors)} | {said}{where} | "
                     f"{', '.join(codes) or 'passes'} |")
    assert wrong == SERVES_WRONGLY
    assert passed == set(MEASURED) - SERVES_WRONGLY
    stale = agreement.check_page("lmdeploy measured", "\n".join(lines) + "\n")
    assert stale is None, stale
