"""MoE adapters on the real sglang: its own Qwen2-MoE (`moe.qwen2_moe_config`) and
``LoRAManager`` with the MoE LoRA buffers (``gate_up_proj_moe``, ``down_proj_moe``) on a CPU,
each case loaded and copied into the memory pool as a request would, beside
``lora-guard check --engine sglang==<installed release>``.

sglang's MoE LoRA path builds and loads on a CPU, so the engine itself is the judge: an indexed
shared-expert weight (``shared_experts.0.*``) is written over routed expert 0 up to 0.5.22
(the pool's expert 0 then holds the shared expert's halves) and refused from 0.5.23
(``LoRAMemoryPool.load_lora_weight_to_buffer``).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("sglang is not installed: the engine tier runs in its own environment "
                "(tests/engines/run builds it and runs the tier)", allow_module_level=True)

torch = pytest.importorskip("torch")

import _harness as h  # noqa: E402
import moe  # noqa: E402

import lora_guard as lg  # noqa: E402
from lora_guard._checking.engines import version_key  # noqa: E402

pytestmark = pytest.mark.xdist_group("sglang")


@pytest.fixture
def model() -> Any:
    """A fresh tiny Qwen2-MoE of sglang's own (a LoRAManager wraps its layers in place)."""
    env = h.sglang_env()
    from sglang.srt.models.qwen2_moe import Qwen2MoeForCausalLM

    return env, Qwen2MoeForCausalLM(moe.qwen2_moe_config(), quant_config=None)


def _serve(env: Any, model: Any, path: Any) -> tuple[str, Any]:
    """("refused", its message) or ("loaded", the memory pool), as sglang loads a request's
    adapter: ``load_lora_adapter``, then ``fetch_new_loras`` copies it into the pool."""
    manager = env.manager.LoRAManager(
        model, moe.qwen2_moe_config(), max_loras_per_batch=2, load_config=env.LoadConfig(),
        dtype=torch.float32, server_args=env.args, lora_backend="torch_native",
        max_lora_rank=16, target_modules={"gate_up_proj", "down_proj"}, lora_paths=None)
    ref = env.registry.LoRARef(lora_id=path.name, lora_name=path.name, lora_path=str(path),
                               pinned=False)
    try:
        result = manager.load_lora_adapter(ref)
        if not result.success:
            return "refused", result.error_message
        manager.fetch_new_loras({path.name, None})
    except Exception as exc:  # the engine's own refusal, as the request sees it
        return "refused", f"{type(exc).__name__}: {exc}"
    return "loaded", manager.memory_pool


def _check(version: str, path: Any) -> list[str]:
    """The codes ``check --engine`` reports on the adapter, once each."""
    limits = lg.ServingLimits.for_engine(f"sglang=={version}", "--max-lora-rank", "16",
                                         "--lora-target-modules", "gate_up_proj", "down_proj")
    return sorted(set(lg.check_adapters([path], limits=limits).codes()))


@pytest.mark.lora_guard(allow=("LG104", "LG112"), reason="the MoE cases break adapters on purpose")
def test_indexed_shared_experts_overwrite_expert_0_before_0_5_23_and_are_refused_after(
        model, tmp_path):
    env, base = model
    path = moe.BY_NAME["moe-shared-indexed"].build(tmp_path)
    verdict, pool = _serve(env, base, path)
    codes = _check(env.version, path)
    assert "LG104" in codes, codes  # every release: refused by lora_guard
    if version_key(env.version) >= (0, 5, 23):
        assert verdict == "refused" and "indexed shared-expert" in pool, pool
        return
    assert verdict == "loaded"  # engine-silent: and what it serves is wrong
    from safetensors.torch import load_file

    tensors = load_file(str(path / "adapter_model.safetensors"))
    slot = pool.uid_to_buffer_id[path.name]
    expert_0 = pool.A_buffer["gate_up_proj_moe"][0][slot, 0, : moe.RANK]
    shared = tensors[f"{moe.PREFIX}.0.mlp.shared_experts.0.gate_proj.lora_A.weight"]
    routed = tensors[f"{moe.PREFIX}.0.mlp.experts.0.gate_proj.lora_A.weight"]
    assert torch.equal(expert_0, shared) and not torch.equal(expert_0, routed)


@pytest.mark.lora_guard(allow=("LG111", "LG112"), reason="experts of different ranks, on purpose")
def test_experts_of_different_ranks_fail_the_copy_into_the_pool(model, tmp_path):
    env, base = model
    path = moe.BY_NAME["moe-expert-ranks"].build(tmp_path)
    verdict, why = _serve(env, base, path)
    assert verdict == "refused" and "does not match weight shape" in why, why
    # and the rank_pattern expert would be scaled by lora_alpha / r (one scaling, LG112)
    assert _check(env.version, path) == ["LG111", "LG112"]


@pytest.mark.lora_guard(allow=("LG112",), reason="rsLoRA on sglang: one scaling (LG112)")
@pytest.mark.parametrize("name", ["moe-plain", "moe-rslora"])
def test_per_expert_adapters_load_as_lora_guard_says(model, tmp_path, name):
    env, base = model
    path = moe.BY_NAME[name].build(tmp_path)
    verdict, detail = _serve(env, base, path)
    codes = _check(env.version, path)
    assert verdict == "loaded", detail
    # rsLoRA is served at lora_alpha / r (engine-silent, LG112); the plain one passes
    assert codes == (["LG112"] if name == "moe-rslora" else []), codes
