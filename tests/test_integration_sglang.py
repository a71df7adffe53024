"""sglang instrumented, against the replica under tests/replicas (sglang has no CPU build).

The replica keeps sglang's module paths and signatures and its failure modes: a loader that
turns every exception into ``LoRAUpdateOutput(success=False, error_message=str(e))``, a bare
assert for a batch with more adapters than slots, a pinned cache keyed by name only, and a
shared sink that assigns its weights before it checks its pools.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

import lora_guard as lg  # noqa: E402
from lora_guard.integrations import IntegrationWarning  # noqa: E402
from lora_guard.integrations import sglang as sglang_guard  # noqa: E402

REPLICAS = Path(__file__).parent / "replicas"
HIDDEN, LAYERS, VOCAB = 32, 2, 64
BASE = types.SimpleNamespace(hidden_size=HIDDEN, num_hidden_layers=LAYERS, vocab_size=VOCAB)


def _forget_sglang() -> None:
    for module in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[module]


@pytest.fixture
def sgl(monkeypatch):
    """Instrument first, then import the replica: the post-import hooks do the patching."""
    _forget_sglang()
    monkeypatch.syspath_prepend(str(REPLICAS))
    sglang_guard.instrument()
    from sglang.srt.lora import lora_manager, lora_registry, mem_pool

    yield types.SimpleNamespace(manager=lora_manager, registry=lora_registry, pool=mem_pool)
    sglang_guard.uninstrument()
    _forget_sglang()


def write_adapter(path: Path, tensors: dict[str, torch.Tensor], **config) -> Path:
    path.mkdir(parents=True)
    safetensors_torch.save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"],
         **config}))
    return path


def dense(path: Path, r: int = 4, config_r: int | None = None, **config) -> Path:
    config["r"] = config_r or r
    tensors = {}
    for layer in range(LAYERS):
        prefix = f"base_model.model.model.layers.{layer}.self_attn.q_proj"
        tensors[f"{prefix}.lora_A.weight"] = torch.randn(r, HIDDEN)
        tensors[f"{prefix}.lora_B.weight"] = torch.randn(HIDDEN, r)
    return write_adapter(path, tensors, **config)


def moe(path: Path, *, shared_outer: bool) -> Path:
    prefix = "base_model.model.model.layers.0.mlp.experts"
    if shared_outer:
        tensors = {f"{prefix}.gate_up_proj.lora_A": torch.zeros(1, 8, HIDDEN),
                   f"{prefix}.gate_up_proj.lora_B": torch.zeros(4, 128, 4)}
    else:
        tensors = {f"{prefix}.0.gate_proj.lora_A.weight": torch.zeros(4, HIDDEN),
                   f"{prefix}.0.gate_proj.lora_B.weight": torch.zeros(64, 4)}
    return write_adapter(path, tensors, target_modules=["gate_up_proj"])


def manager(sgl, **kwargs):
    kwargs.setdefault("max_lora_rank", 8)
    kwargs.setdefault("target_modules", ["q_proj"])
    return sgl.manager.LoRAManager(torch.nn.Linear(2, 2), BASE, max_loras_per_batch=2,
                                   **kwargs)


def moe_manager(sgl, **kwargs):
    """A server whose pool serves the MoE adapters' projections (--lora-target-modules)."""
    return manager(sgl, target_modules=["q_proj", "gate_up_proj", "down_proj"], **kwargs)


def ref(sgl, name: str, path: Path):
    return sgl.registry.LoRARef(lora_id=name, lora_name=name, lora_path=str(path))


# --- loading ---------------------------------------------------------------------------------

@pytest.mark.lora_guard(expect=["LG101"],
                         reason="sglang's loader turns the refusal into a failed load result")
def test_a_rank_pattern_above_the_max_rank_fails_the_load_with_the_full_message(sgl, tmp_path):
    lora_manager = manager(sgl)
    # r=4 passes sglang's own check; the q_proj tensors really are rank 32
    adapter = dense(tmp_path / "a", r=32, config_r=4, rank_pattern={"q_proj": 32})

    result = lora_manager.load_lora_adapter(ref(sgl, "a", adapter))

    assert result.success is False
    assert result.error_message.startswith("LG101 rank-exceeds-limit: adapter 'a': rank 32")
    assert "max rank 8" in result.error_message
    assert lora_manager.loras == {} and lora_manager.configs == {}


@pytest.mark.lora_guard(expect=["LG107"],
                         reason="sglang's loader turns the refusal into a failed load result")
def test_a_defect_sglang_meets_with_a_bare_assert_gets_a_message(sgl, tmp_path):
    adapter = dense(tmp_path / "empty")
    weights = safetensors_torch.load_file(str(adapter / "adapter_model.safetensors"))
    weights["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"] = torch.zeros(
        0, HIDDEN)
    safetensors_torch.save_file(weights, str(adapter / "adapter_model.safetensors"))

    sglang_guard.uninstrument()
    alone = manager(sgl).load_lora_adapter(ref(sgl, "empty", adapter))
    assert alone.success is False and alone.error_message == ""   # what users got

    sglang_guard.instrument()
    lora_manager = manager(sgl)
    result = lora_manager.load_lora_adapter(ref(sgl, "empty", adapter))
    assert result.success is False
    assert "LG107" in result.error_message and "zero size" in result.error_message
    assert lora_manager.configs == {}   # refused before sglang touched its state


@pytest.mark.lora_guard(expect=["LG201"],
                         reason="the failed load leaves its config behind on purpose")
def test_a_failed_load_that_leaves_its_config_behind_is_reported(sgl, tmp_path):
    adapter = dense(tmp_path / "no-weights")
    os.remove(adapter / "adapter_model.safetensors")
    lora_manager = manager(sgl)

    with lg.recording() as rec:
        result = lora_manager.load_lora_adapter(ref(sgl, "ghost", adapter))

    assert result.success is False
    assert "LG201" in result.error_message and "'ghost' is in LoRAManager.configs" in (
        result.error_message)
    assert result.error_message.splitlines()[0]   # sglang's own reason comes first
    assert rec.codes == ["LG201"]


@pytest.mark.lora_guard(expect=["LG104"],
                         reason="sglang's loader turns the refusal into a failed load result")
def test_weights_for_a_module_the_pool_does_not_serve_fail_the_load_by_name(sgl, tmp_path):
    tensors = {}
    for module in ("q_proj", "o_proj"):
        prefix = f"base_model.model.model.layers.0.self_attn.{module}"
        tensors[f"{prefix}.lora_A.weight"] = torch.randn(4, HIDDEN)
        tensors[f"{prefix}.lora_B.weight"] = torch.randn(HIDDEN, 4)
    adapter = write_adapter(tmp_path / "o", tensors, target_modules=["q_proj", "o_proj"])
    lora_manager = manager(sgl, target_modules=["qkv_proj"])   # sglang's fused name

    result = lora_manager.load_lora_adapter(ref(sgl, "o", adapter))

    assert result.success is False
    assert result.error_message.startswith("LG104 unsupported-target: adapter 'o': module "
                                           "model.layers.0.self_attn.o_proj (o_proj)")
    assert "served: k_proj, q_proj, qkv_proj, v_proj" in result.error_message
    assert lora_manager.configs == {}


@pytest.mark.lora_guard(expect=["LG105"],
                         reason="sglang's validation turns the refusal into a failed result")
def test_validating_outside_a_load_runs_the_same_checks(sgl, tmp_path):
    adapter = dense(tmp_path / "dora", use_dora=True)
    lora_manager = manager(sgl)
    config = sgl.manager.LoRAConfig(str(adapter))
    with pytest.raises(lg.AdapterError) as caught:
        lora_manager.validate_new_adapter(config, ref(sgl, "dora", adapter))
    assert caught.value.code == "LG105" and "uses DoRA" in str(caught.value)

    with lg.recording() as rec:   # inside a load, the load guard reports it once
        result = lora_manager.load_lora_adapter(ref(sgl, "dora", adapter))
    assert result.success is False and rec.codes == ["LG105"]


def test_a_good_adapter_loads_and_serves_without_a_violation(sgl, tmp_path):
    lora_manager = manager(sgl)
    with lg.recording() as rec:
        assert lora_manager.load_lora_adapter(ref(sgl, "a", dense(tmp_path / "a"))).success
        lora_manager.fetch_new_loras({"a", None})
        assert lora_manager.unload_lora_adapter(ref(sgl, "a", tmp_path / "a")).success
    assert rec.violations == []


# --- MoE layouts (seed 001) --------------------------------------------------------------------

@pytest.mark.lora_guard(expect=["LG002"],
                         reason="sglang's loader turns the refusal into a failed load result")
def test_an_adapter_of_another_moe_layout_is_refused_naming_the_pools_owner(sgl, tmp_path):
    lora_manager = moe_manager(sgl)
    assert lora_manager.load_lora_adapter(
        ref(sgl, "math", moe(tmp_path / "math", shared_outer=True))).success

    result = lora_manager.load_lora_adapter(
        ref(sgl, "code", moe(tmp_path / "code", shared_outer=False)))

    assert result.success is False
    assert result.error_message.startswith("LG002 mixed-moe-layout: adapter 'code'")
    assert "shared-outer adapters (set by adapter 'math')" in result.error_message
    assert list(lora_manager.loras) == ["math"]


def test_start_up_adapters_of_mixed_layouts_are_refused_before_loading(sgl, tmp_path):
    paths = [ref(sgl, "math", moe(tmp_path / "math", shared_outer=True)),
             ref(sgl, "code", moe(tmp_path / "code", shared_outer=False))]
    with pytest.raises(lg.MixedMoELayoutError) as caught:
        moe_manager(sgl, lora_paths=paths)
    assert "adapter 'code'" in str(caught.value) and "'math'" in str(caught.value)


def test_unloading_frees_the_pool_layout(sgl, tmp_path):
    lora_manager = moe_manager(sgl)
    math = ref(sgl, "math", moe(tmp_path / "math", shared_outer=True))
    assert lora_manager.load_lora_adapter(math).success
    assert lora_manager.unload_lora_adapter(math).success
    assert lora_manager.load_lora_adapter(
        ref(sgl, "code", moe(tmp_path / "code", shared_outer=False))).success


# --- the memory pool ---------------------------------------------------------------------------

def test_a_batch_with_more_adapters_than_slots_is_refused_before_the_assert(sgl, tmp_path):
    lora_manager = manager(sgl)
    for name in ("a", "b"):
        assert lora_manager.load_lora_adapter(ref(sgl, name, dense(tmp_path / name))).success
    pool = lora_manager.memory_pool

    with pytest.raises(lg.RegistryError) as caught:
        lora_manager.fetch_new_loras({"a", "b", None})

    assert caught.value.code == "LG201"
    assert "3 adapters needed at once, but only 2 slots" in str(caught.value)
    assert pool.uid_to_buffer_id == {}


def test_slot_maps_that_stop_being_inverse_are_reported(sgl, tmp_path):
    lora_manager = manager(sgl)
    assert lora_manager.load_lora_adapter(ref(sgl, "a", dense(tmp_path / "a"))).success
    pool = lora_manager.memory_pool
    pool.buffer_id_to_uid[1] = "evicted-but-not-forgotten"   # one map updated, not the other

    with pytest.raises(lg.RegistryError, match="slot 1 holds 'evicted-but-not-forgotten'"):
        lora_manager.fetch_new_loras({"a"})


def test_a_pinned_cache_hit_of_another_shape_is_refused_before_it_is_served(sgl, tmp_path):
    lora_manager = manager(sgl)
    for name, r in (("r4", 4), ("r8", 8)):
        assert lora_manager.load_lora_adapter(
            ref(sgl, name, dense(tmp_path / name, r=r))).success
    pool = lora_manager.memory_pool
    lora_manager.fetch_new_loras({"r4"})
    cached = dict(pool.pinned_weight_store)

    with pytest.raises(lg.CacheKeyCollisionError) as caught:
        lora_manager.fetch_new_loras({"r8"})

    assert caught.value.code == "LG003" and isinstance(caught.value, ValueError)
    assert "'layers.0.q_proj.A#tp0' holds a tensor of shape (4, 32)" in str(caught.value)
    assert pool.pinned_weight_store == cached


def test_loading_into_a_slot_outside_the_pool_is_refused(sgl, tmp_path):
    lora_manager = manager(sgl)
    assert lora_manager.load_lora_adapter(ref(sgl, "a", dense(tmp_path / "a"))).success
    pool = lora_manager.memory_pool
    with pytest.raises(lg.RegistryError, match="outside 0..1"):
        pool.load_lora_weight_to_buffer("a", 2, lora_manager.loras["a"], [])


# --- set_lora_info (seed 000) ------------------------------------------------------------------

def sink_call(r: int, slots: int = 4, n: int = 2, f: int = 16, hidden: int = 32):
    return (torch.zeros(slots, 1, 2 * r, hidden), torch.zeros(slots, n, 2 * f, r),
            torch.zeros(slots, n, r, f), torch.zeros(slots, 1, hidden, r))


def test_the_shared_sink_refuses_a_rank_change_before_touching_its_pools(sgl):
    from sglang.srt.models.inkling_common.lora import InklingBatchDenseMLPWithLoRA

    sink = InklingBatchDenseMLPWithLoRA()
    first = sink_call(16)
    sink.set_lora_info(*first)
    pool_shape = sink._w1_delta.shape

    with pytest.raises(lg.PoolShapeDriftError) as caught:
        sink.set_lora_info(*sink_call(8))

    assert "dim 'rank' was frozen at 16 by the first call and is now 8" in str(caught.value)
    assert sink.gate_up_lora_a_weights is first[0]   # untouched
    assert sink._w1_delta.shape == pool_shape


def test_without_lora_guard_the_sink_is_left_half_updated(sgl):
    from sglang.srt.models.inkling_common.lora import InklingBatchDenseMLPWithLoRA

    sglang_guard.uninstrument()
    sink = InklingBatchDenseMLPWithLoRA()
    sink.set_lora_info(*sink_call(16))
    second = sink_call(8)
    with pytest.raises(RuntimeError, match="pool shape changed"):
        sink.set_lora_info(*second)
    assert sink.gate_up_lora_a_weights is second[0]   # replaced although the call failed


def test_fused_moe_set_lora_info_refuses_an_outer_dim_that_is_neither_1_nor_experts(sgl):
    from sglang.srt.lora.layers import FusedMoEWithLoRA

    layer = FusedMoEWithLoRA()
    ga, gb, da, db = sink_call(8, n=4)
    with pytest.raises(lg.ShapeContractError, match="where"):
        layer.set_lora_info(ga.expand(4, 3, 16, 32), gb, da, db.expand(4, 3, 32, 8))
    assert layer.set_lora is False
    layer.set_lora_info(ga.expand(4, 4, 16, 32), gb, da, db.expand(4, 4, 32, 8))
    assert lg.frozen_dims(layer) == {"slots": 4, "n": 4, "f": 16, "rank": 8}


# --- instrumenting -----------------------------------------------------------------------------

def run(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPLICAS), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


CHECK = """
        from sglang.srt.lora.mem_pool import LoRAMemoryPool
        print(type(vars(LoRAMemoryPool)['prepare_lora_batch']).__name__)
"""


def test_instrument_before_the_import_patches_on_import():
    assert run("""
        import sys
        from lora_guard.integrations import sglang
        sglang.instrument()
        assert 'sglang' not in sys.modules
    """ + CHECK) == "FunctionWrapper"


def test_instrument_after_the_import_patches_at_once():
    assert run("""
        import sglang.srt.lora.mem_pool
        from lora_guard.integrations import sglang
        sglang.instrument()
    """ + CHECK) == "FunctionWrapper"


def test_a_hook_that_fires_after_uninstrument_does_nothing():
    assert run("""
        from lora_guard.integrations import sglang
        sglang.instrument(); sglang.uninstrument()
    """ + CHECK) == "function"


def test_importing_lora_guard_imports_no_guarded_library():
    assert run("""
        import sys, lora_guard, lora_guard.integrations
        from lora_guard.integrations import peft, sglang, vllm
        print(sorted(m for m in ('peft', 'sglang', 'vllm', 'transformers') if m in sys.modules))
    """) == "[]"


def test_uninstrument_restores_every_original_exactly(sgl):
    from sglang.srt.lora.mem_pool import LoRAMemoryPool

    sglang_guard.uninstrument()
    original = vars(LoRAMemoryPool)["prepare_lora_batch"]
    sglang_guard.instrument()
    sglang_guard.instrument()
    assert vars(LoRAMemoryPool)["prepare_lora_batch"] is not original
    assert "sglang.srt.lora.mem_pool:LoRAMemoryPool.prepare_lora_batch" in (
        sglang_guard.INTEGRATION.patched)
    sglang_guard.uninstrument()
    assert vars(LoRAMemoryPool)["prepare_lora_batch"] is original
    assert sglang_guard.INTEGRATION.patched == []


def test_a_release_older_than_known_is_left_unpatched_with_a_warning(monkeypatch):
    _forget_sglang()
    monkeypatch.syspath_prepend(str(REPLICAS))
    import sglang

    monkeypatch.setattr(sglang, "__version__", "0.4.9")
    try:
        sglang_guard.instrument()
        with pytest.warns(IntegrationWarning, match=r"sglang 0\.4\.9 is not patched"):
            importlib.import_module("sglang.srt.lora.mem_pool")
        assert sglang_guard.INTEGRATION.patched == []
    finally:
        sglang_guard.uninstrument()
        _forget_sglang()
