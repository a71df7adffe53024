"""Replica of sglang.srt.lora.mem_pool: slot maps, eviction, buffer loading, pinned cache."""


import torch

from sglang.srt.lora.lora import LoRAAdapter
from sglang.srt.lora.lora_registry import LoRARef


class EmptySlot:
    __slots__ = ()

    def __repr__(self):
        return "|EMPTY|"

    def __new__(cls):
        if not hasattr(cls, "_instance"):
            cls._instance = super().__new__(cls)
        return cls._instance


EMPTY_SLOT = EmptySlot()


class LoRAMemoryPool:
    """Dense buffers: A (S, R, hidden), B (S, out, R) per target module and layer."""

    def __init__(self, base_hf_config, max_loras_per_batch: int, dtype: torch.dtype,
                 max_lora_rank: int, target_modules: set[str],
                 enable_lora_overlap_loading: bool = True):
        self.base_hf_config = base_hf_config
        self.num_layer = base_hf_config.num_hidden_layers
        self.max_loras_per_batch = max_loras_per_batch
        self.dtype = dtype
        self.max_lora_rank = max_lora_rank
        self.target_modules = set(target_modules)
        self.enable_lora_overlap_loading = enable_lora_overlap_loading
        self.pin_memory_available = True  # the replica "pins" by copying
        hidden = base_hf_config.hidden_size
        self.A_buffer: dict[str, list[torch.Tensor]] = {
            m: [torch.zeros(max_loras_per_batch, max_lora_rank, hidden, dtype=dtype)
                for _ in range(self.num_layer)] for m in self.target_modules}
        self.B_buffer: dict[str, list[torch.Tensor]] = {
            m: [torch.zeros(max_loras_per_batch, hidden, max_lora_rank, dtype=dtype)
                for _ in range(self.num_layer)] for m in self.target_modules}
        self.uid_to_buffer_id: dict[str | None, int] = {}
        self.buffer_id_to_uid: list[str | EmptySlot | None] = [
            EMPTY_SLOT] * max_loras_per_batch
        self.pinned_weight_store: dict[str, torch.Tensor] = {}

    def can_support(self, config) -> bool:
        return config.r <= self.max_lora_rank

    def _get_maybe_cached_weight_for_transfer(
        self,
        pinned_weight_store: dict[str, torch.Tensor],
        cache_key: str,
        weight: torch.Tensor,
    ) -> torch.Tensor:
        if not self.pin_memory_available or weight.device.type != "cpu":
            return weight
        cached_weight = pinned_weight_store.get(cache_key)
        if cached_weight is None:
            cached_weight = weight.clone()
            pinned_weight_store[cache_key] = cached_weight
        elif cached_weight.shape != weight.shape or cached_weight.dtype != weight.dtype:
            raise ValueError(
                f"LoRA pinned weight cache key collision for {cache_key!r}: "
                f"cached shape={cached_weight.shape}, dtype={cached_weight.dtype}; "
                f"new shape={weight.shape}, dtype={weight.dtype}."
            )
        return cached_weight

    def prepare_lora_batch(
        self,
        cur_uids: set[str | None],
        lora_adapters: dict[str, LoRAAdapter],
        lora_modules: list[dict[str, torch.nn.Module]],
        lora_refs: dict[str, LoRARef],
        lora_embed_tokens_module=None,
        lora_lm_head_module=None,
    ):
        # The release the seed was taken from asserted here: the scheduler died.
        assert len(cur_uids) <= self.max_loras_per_batch
        ordered_uids = sorted(cur_uids, key=lambda uid: (uid is not None, uid or ""))

        def get_available_buffer_slot():
            for buffer_id in range(self.max_loras_per_batch):
                if self.buffer_id_to_uid[buffer_id] == EMPTY_SLOT:
                    return buffer_id
            for buffer_id in range(self.max_loras_per_batch):
                uid = self.buffer_id_to_uid[buffer_id]
                if uid not in cur_uids:
                    self.uid_to_buffer_id.pop(uid, None)
                    self.buffer_id_to_uid[buffer_id] = EMPTY_SLOT
                    return buffer_id
            raise ValueError("No available buffer slots found.")

        for uid in ordered_uids:
            if uid not in self.uid_to_buffer_id:
                buffer_id = get_available_buffer_slot()
                self.load_lora_weight_to_buffer(
                    uid, buffer_id, lora_adapters.get(uid), lora_modules,
                    lora_embed_tokens_module, lora_lm_head_module)
                self.uid_to_buffer_id[uid] = buffer_id
                self.buffer_id_to_uid[buffer_id] = uid

    def load_lora_weight_to_buffer(
        self,
        uid: str,
        buffer_id: int,
        lora_adapter: LoRAAdapter,
        lora_modules: list[dict[str, torch.nn.Module]],
        lora_embed_tokens_module=None,
        lora_lm_head_module=None,
    ):
        if uid is None:
            for buffers in (*self.A_buffer.values(), *self.B_buffer.values()):
                for tensor in buffers:
                    tensor[buffer_id].zero_()
            return
        assert lora_adapter is not None
        rank = lora_adapter.config.r
        for layer_id, layer in enumerate(lora_adapter.layers):
            for name, weight in layer.weights.items():
                module = name.split(".lora_")[0].rsplit(".", 1)[-1]
                if module not in self.target_modules:
                    continue
                # the key omits the adapter and the shape: seed 002's collision
                cache_key = f"layers.{layer_id}.{module}.{'A' if 'lora_A' in name else 'B'}#tp0"
                weight = self._get_maybe_cached_weight_for_transfer(
                    self.pinned_weight_store, cache_key, weight)
                if "lora_A" in name:
                    view = self.A_buffer[module][layer_id][buffer_id, :rank, :]
                else:
                    view = self.B_buffer[module][layer_id][buffer_id, :, :rank]
                assert view.shape == weight.shape
                view.copy_(weight)

    def remove_lora(self, uid: str) -> int | None:
        buffer_id = self.uid_to_buffer_id.pop(uid, None)
        if buffer_id is not None:
            self.buffer_id_to_uid[buffer_id] = EMPTY_SLOT
        return buffer_id
