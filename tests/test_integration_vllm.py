"""vLLM instrumented, against the replica under tests/replicas (vLLM has no CPU build)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

import lora_guard as lg  # noqa: E402
from lora_guard.integrations import vllm as vllm_guard  # noqa: E402

REPLICAS = Path(__file__).parent / "replicas"
HIDDEN, VOCAB = 32, 64
SERVED = ("q_proj", "v_proj")


def _forget_vllm() -> None:
    for module in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[module]


@pytest.fixture
def vllm(monkeypatch):
    _forget_vllm()
    monkeypatch.syspath_prepend(str(REPLICAS))
    vllm_guard.instrument()
    from vllm.config.lora import LoRAConfig
    from vllm.lora import lora_model, model_manager, worker_manager

    yield types.SimpleNamespace(LoRAConfig=LoRAConfig, model=lora_model,
                                manager=model_manager, worker=worker_manager)
    vllm_guard.uninstrument()
    _forget_vllm()


def adapter(path: Path, *, r: int = 8, modules=("q_proj",), prefix="model.layers",
            vocab: int | None = None, **config) -> str:
    path.mkdir()
    tensors = {}
    for module in modules:
        key = f"base_model.model.{prefix}.0.self_attn.{module}"
        tensors[f"{key}.lora_A.weight"] = torch.randn(r, HIDDEN)
        tensors[f"{key}.lora_B.weight"] = torch.randn(HIDDEN, r)
    if vocab is not None:
        tensors["base_model.model.model.embed_tokens.lora_embedding_A"] = torch.randn(r, vocab)
        tensors["base_model.model.model.embed_tokens.lora_embedding_B"] = torch.randn(HIDDEN, r)
    safetensors_torch.save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "target_modules": list(modules),
         **config}))
    return str(path)


def worker(vllm, *, max_lora_rank: int = 16, max_loras: int = 2):
    config = vllm.LoRAConfig(max_lora_rank=max_lora_rank, max_loras=max_loras)
    return vllm.worker.LRUCacheWorkerLoRAManager(config, VOCAB, (*SERVED, "embed_tokens"))


def request(vllm, path: str, lora_id: int = 1):
    return vllm.worker.LoRARequest(Path(path).name, lora_id, path)


def test_a_good_adapter_loads_and_activates_without_a_violation(vllm, tmp_path):
    manager = worker(vllm)
    with lg.recording() as rec:
        assert manager.add_adapter(request(vllm, adapter(tmp_path / "good", vocab=VOCAB)))
    assert rec.violations == []
    assert manager._adapter_manager.lora_index_to_id == [1, None]


def test_a_rank_pattern_above_max_lora_rank_is_refused_before_a_tensor_is_read(
        vllm, tmp_path, monkeypatch):
    # a loader path that skips PEFTHelper.validate_legal still meets the engine's max rank
    monkeypatch.setattr(vllm.worker.PEFTHelper, "validate_legal", lambda self, config: None)
    path = adapter(tmp_path / "wide", r=32, rank_pattern={"q_proj": 32})
    manager = worker(vllm, max_lora_rank=16)
    with pytest.raises(lg.AdapterError) as caught:
        manager.add_adapter(request(vllm, path))
    assert caught.value.code == "LG101"
    assert "rank 32 of model.layers.0.self_attn.q_proj is above the served max rank 16" in (
        str(caught.value))
    assert manager._adapter_manager._registered_adapters == {}


def test_weights_for_modules_the_model_does_not_serve_are_refused(vllm, tmp_path):
    path = adapter(tmp_path / "o-proj", modules=("q_proj", "o_proj"))
    with pytest.raises(lg.AdapterError) as caught:
        worker(vllm).add_adapter(request(vllm, path))
    assert caught.value.code == "LG104"
    assert "module model.layers.0.self_attn.o_proj (o_proj) is not served" in str(caught.value)
    assert "served: embed_tokens, q_proj, v_proj" in str(caught.value)


def test_an_embedding_adapter_for_another_vocabulary_is_refused(vllm, tmp_path):
    manager = worker(vllm)
    with pytest.raises(lg.AdapterError) as caught:
        manager.add_adapter(request(vllm, adapter(tmp_path / "vocab", vocab=VOCAB + 8)))
    assert caught.value.code == "LG109"
    assert "vocab dim 72, the base model's vocab is 64" in str(caught.value)
    assert manager._adapter_manager._registered_adapters == {}


def test_features_vllm_does_not_serve_are_refused(vllm, tmp_path):
    path = adapter(tmp_path / "dora", use_dora=True, modules_to_save=["lm_head"])
    with pytest.raises(lg.AdapterError) as caught:
        worker(vllm).add_adapter(request(vllm, path))
    codes = {v.code for v in caught.value.violations}
    assert codes == {"LG105"}
    assert {v.details["allow_name"] for v in caught.value.violations} == {
        "dora", "modules_to_save"}
    assert "uses DoRA (use_dora=True)" in str(caught.value)


def test_an_lru_activation_keeps_the_slot_table_consistent(vllm, tmp_path):
    manager = worker(vllm, max_loras=2)
    with lg.recording() as rec:
        for i in range(1, 5):
            manager.add_adapter(request(vllm, adapter(tmp_path / f"a{i}"), lora_id=i))
    assert rec.violations == []
    assert sorted(manager._adapter_manager.lora_index_to_id) == [3, 4]


def test_a_slot_table_out_of_step_with_the_active_adapters_is_reported(vllm, tmp_path):
    manager = worker(vllm, max_loras=2)
    manager.add_adapter(request(vllm, adapter(tmp_path / "a1"), lora_id=1))
    slots = manager._adapter_manager
    slots.lora_index_to_id[0] = None   # a slot cleared without deactivating its adapter
    with pytest.raises(lg.RegistryError) as caught:
        manager.add_adapter(request(vllm, adapter(tmp_path / "a2"), lora_id=2))
    assert caught.value.code == "LG201" and "adapter 1 maps to slot -1" in str(caught.value)


def test_activating_with_every_slot_taken_is_a_registry_error(vllm, tmp_path):
    base = vllm.manager.LoRAModelManager(vllm.LoRAConfig(max_loras=1))
    for i in (1, 2):
        base.add_adapter(types.SimpleNamespace(id=i))
    base.activate_adapter(1)
    with pytest.raises(lg.RegistryError, match="2 adapters needed at once, but only 1 slots"):
        base.activate_adapter(2)
    assert base.lora_index_to_id == [1]


def test_uninstrument_restores_vllm_exactly(vllm):
    vllm_guard.uninstrument()
    checkpoint = vars(vllm.model.LoRAModel)["from_local_checkpoint"]
    activate = vars(vllm.manager.LoRAModelManager)["activate_adapter"]
    vllm_guard.instrument()
    assert vars(vllm.model.LoRAModel)["from_local_checkpoint"] is not checkpoint
    vllm_guard.uninstrument()
    assert vars(vllm.model.LoRAModel)["from_local_checkpoint"] is checkpoint
    assert vars(vllm.manager.LoRAModelManager)["activate_adapter"] is activate
