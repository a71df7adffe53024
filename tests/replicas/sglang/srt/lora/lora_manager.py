"""Replica of sglang.srt.lora.lora_manager.LoRAManager (the load/validate/batch paths)."""

import re
from collections.abc import Iterable

import torch

from sglang.srt.lora.lora import LoRAAdapter
from sglang.srt.lora.lora_config import LoRAConfig
from sglang.srt.lora.lora_registry import LoRARef
from sglang.srt.lora.mem_pool import LoRAMemoryPool
from sglang.srt.managers.io_struct import LoRAUpdateOutput


class LoRAManager:
    def __init__(self, base_model: torch.nn.Module, base_hf_config, max_loras_per_batch: int,
                 dtype: torch.dtype = torch.float32, max_lora_rank: int | None = None,
                 target_modules: Iterable[str] | None = None,
                 lora_paths: list[LoRARef] | None = None):
        self.base_model = base_model
        self.base_hf_config = base_hf_config
        self.max_loras_per_batch = max_loras_per_batch
        self.dtype = dtype
        self.init_state(max_lora_rank=max_lora_rank, target_modules=target_modules,
                        lora_paths=lora_paths)

    def init_state(self, max_lora_rank: int | None = None,
                   target_modules: Iterable[str] | None = None,
                   lora_paths: list[LoRARef] | None = None):
        self.max_lora_rank = max_lora_rank or 16
        self.target_modules = set(target_modules or ())
        self.configs: dict[str, LoRAConfig] = {}
        self.loras: dict[str, LoRAAdapter] = {}
        self.lora_refs: dict[str, LoRARef] = {}
        self.num_pinned_loras = 0
        for lora_ref in lora_paths or ():
            result = self.load_lora_adapter(lora_ref)
            if not result.success:
                raise RuntimeError(result.error_message)
        self._detect_shared_outer_loras()
        self.memory_pool = LoRAMemoryPool(
            self.base_hf_config, self.max_loras_per_batch, self.dtype, self.max_lora_rank,
            self.target_modules)
        self.lora_modules: list[dict[str, torch.nn.Module]] = [
            {} for _ in range(self.base_hf_config.num_hidden_layers)]

    def _detect_shared_outer_loras(self) -> bool:
        shared_outer = None
        for adapter_id, adapter in self.loras.items():
            for layer in adapter.layers:
                for name, weight in layer.weights.items():
                    if "gate_up_proj" not in name or "lora_A" not in name:
                        continue
                    if weight.dim() == 3:
                        is_shared = weight.shape[0] == 1
                    elif re.search(r"experts\.\d+\.", name):
                        is_shared = False
                    else:
                        continue
                    if shared_outer is None:
                        shared_outer = is_shared
                    elif shared_outer != is_shared:
                        raise RuntimeError(
                            "Mixed shared-outer LoRA formats detected across loaded adapters "
                            f"(conflict in adapter '{adapter_id}').")
        return bool(shared_outer)

    def create_lora_update_result(self, success: bool, error_message: str = ""):
        return LoRAUpdateOutput(
            success=success, error_message=error_message,
            loaded_adapters={r.lora_name: r.lora_path for r in self.lora_refs.values()})

    def load_lora_adapter(self, lora_ref: LoRARef) -> LoRAUpdateOutput:
        assert lora_ref.lora_name is not None and lora_ref.lora_path is not None
        try:
            new_adapter = LoRAConfig(lora_ref.lora_path)
            self.validate_new_adapter(new_adapter, lora_ref)
            self.configs[lora_ref.lora_id] = new_adapter  # stays behind if the load fails
            self.load_lora_weights(lora_ref)
            self.lora_refs[lora_ref.lora_id] = lora_ref
        except Exception as e:
            return self.create_lora_update_result(success=False, error_message=str(e))
        return self.create_lora_update_result(success=True)

    def validate_new_adapter(self, lora_config: LoRAConfig, lora_ref: LoRARef):
        if lora_config.use_dora:
            raise ValueError(f"Failed to load {lora_ref.lora_name}: DoRA is not supported")
        for existing in self.lora_refs.values():
            if existing.lora_name == lora_ref.lora_name:
                raise ValueError(f"Failed to load LoRA adapter {lora_ref.lora_name} because "
                                 "it is already loaded")
        memory_pool = getattr(self, "memory_pool", None)
        if memory_pool is not None and not memory_pool.can_support(lora_config):
            raise ValueError(f"LoRA adapter {lora_ref.lora_name} with rank {lora_config.r} "
                             "is incompatible with the current LoRA memory pool")

    def load_lora_weights(self, lora_ref: LoRARef):
        adapter = LoRAAdapter(lora_ref.lora_id, self.configs[lora_ref.lora_id],
                              self.base_hf_config.num_hidden_layers)
        adapter.initialize_weights()
        for layer in adapter.layers:
            for _name, weight in layer.weights.items():
                assert weight.numel() > 0  # a bare assert: sglang reports an empty message
        self.loras[lora_ref.lora_id] = adapter

    def unload_lora_adapter(self, lora_ref: LoRARef) -> LoRAUpdateOutput:
        self.memory_pool.remove_lora(lora_ref.lora_id)
        del self.configs[lora_ref.lora_id]
        del self.loras[lora_ref.lora_id]
        del self.lora_refs[lora_ref.lora_id]
        return self.create_lora_update_result(success=True)

    def fetch_new_loras(self, new_loras, running_loras=frozenset()):
        cur_uids = set(new_loras) | set(running_loras)
        self.memory_pool.prepare_lora_batch(
            cur_uids=cur_uids, lora_adapters=self.loras, lora_modules=self.lora_modules,
            lora_refs=self.lora_refs.copy(), lora_embed_tokens_module=None,
            lora_lm_head_module=None)
