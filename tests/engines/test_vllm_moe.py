"""MoE adapters on the real vLLM's loader: each case read by ``PEFTHelper`` and
``LoRAModel.from_local_checkpoint`` and each MoE layer's experts packed by
``PackedLoRALayerWeights.pack_moe``, as ``LoRAModelManager._create_merged_loras_inplace``
packs them when the adapter is activated, beside ``lora-guard check --engine vllm==<release>``.

vLLM's MoE LoRA layers cannot be built on a CPU (its own Qwen2MoeForCausalLM stops at
"Unquantized MoE LoRA backend 'TRITON' does not support ... device cpu"), so the judge is the
loader and packing code that does run here, called on the objects vLLM builds from the files:
experts of different ranks fail in ``pack_moe`` on every release (by name from 0.32), and
0.29's ``pack_moe`` packs rsLoRA experts with ``lora_alpha / r``.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed: the engine tier runs in its own environment "
                "(tests/engines/run builds it and runs the tier)", allow_module_level=True)

torch = pytest.importorskip("torch")

import _harness as h  # noqa: E402
import moe  # noqa: E402

import lora_guard as lg  # noqa: E402
from lora_guard._checking.engines import version_key  # noqa: E402

pytestmark = pytest.mark.xdist_group("vllm")

_ORDER = ("gate_proj", "down_proj", "up_proj")  # pack_moe's w1, w2, w3 of each expert


def _load(path: Any) -> tuple[str, Any]:
    """("refused", why) or ("loaded", {layer: packed experts}), as vLLM's worker loads the
    adapter and its model manager packs each MoE layer's experts."""
    env = h.vllm_env()
    from vllm.lora.lora_weights import PackedLoRALayerWeights

    expected = set(moe.SIZES) | {f"experts.{e}.{p}" for e in range(moe.EXPERTS)
                                 for p in moe.SIZES}
    try:
        helper = env.peft_helper.PEFTHelper.from_local_dir(str(path), 4096)
        helper.validate_legal(env.LoRAConfig(max_lora_rank=16, max_loras=1))
        model = env.lora_model.LoRAModel.from_local_checkpoint(
            str(path), expected, peft_helper=helper, lora_model_id=1, device="cpu",
            dtype=torch.float32)
        packed = {layer: PackedLoRALayerWeights.pack_moe(
            [model.get_lora(f"model.layers.{layer}.mlp.experts.{e}.{p}")
             for e in range(moe.EXPERTS) for p in _ORDER], f"model.layers.{layer}.mlp.experts")
            for layer in range(2)}
    except Exception as exc:  # the engine's own refusal
        return "refused", f"{type(exc).__name__}: {exc}"
    return "loaded", (model, packed)


def _check(version: str, path: Any) -> list[str]:
    """The codes ``check --engine`` reports on the adapter, once each."""
    limits = lg.ServingLimits.for_engine(f"vllm=={version}", "--max-lora-rank", "16")
    return sorted(set(lg.check_adapters([path], limits=limits).codes()))


@pytest.mark.lora_guard(allow=("LG111", "LG112"), reason="experts of different ranks, on purpose")
def test_experts_of_different_ranks_are_refused_by_pack_moe_on_every_release(tmp_path):
    env = h.vllm_env()
    path = moe.BY_NAME["moe-expert-ranks"].build(tmp_path)
    verdict, why = _load(path)
    assert verdict == "refused", why
    codes = _check(env.version, path)
    if version_key(env.version) >= (0, 32):
        assert "different LoRA ranks" in why, why  # named since 0.32
        assert codes == ["LG111"], codes
    else:  # and before 0.32 the rank_pattern expert would be scaled by lora_alpha / r too
        assert codes == ["LG111", "LG112"], codes


@pytest.mark.lora_guard(allow=("LG112",), reason="rsLoRA experts on vLLM 0.29, on purpose")
def test_rslora_experts_are_packed_at_alpha_over_r_on_0_29_only(tmp_path):
    env = h.vllm_env()
    path = moe.BY_NAME["moe-rslora"].build(tmp_path)
    verdict, found = _load(path)
    assert verdict == "loaded", found
    model, packed = found
    first = model.get_lora("model.layers.0.mlp.experts.0.gate_proj")
    rslora = moe.ALPHA / math.sqrt(moe.RANK)
    served = packed[0].scaling[0]
    codes = _check(env.version, path)
    if version_key(env.version) < (0, 30):  # engine-silent: the experts' strength is wrong
        assert served == pytest.approx(moe.ALPHA / moe.RANK) != pytest.approx(rslora)
        assert codes == ["LG112"], codes
    else:
        assert served == pytest.approx(first.scaling) == pytest.approx(rslora)
        assert codes == [], codes


def test_a_plain_per_expert_adapter_loads_and_passes(tmp_path):
    env = h.vllm_env()
    path = moe.BY_NAME["moe-plain"].build(tmp_path)
    verdict, found = _load(path)
    assert verdict == "loaded", found
    assert tuple(found[1][0].lora_a[0].shape) == (moe.EXPERTS, moe.RANK, 64)
    assert _check(env.version, path) == []
