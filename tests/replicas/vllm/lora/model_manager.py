"""Replica of vllm.lora.model_manager: GPU slots for registered adapters."""



class LoRAModelManager:
    def __init__(self, lora_config) -> None:
        self.lora_config = lora_config
        self.lora_index_to_id: list[int | None] = [None] * lora_config.max_loras
        self._registered_adapters: dict = {}
        self._active_adapters: dict = {}

    @property
    def lora_slots(self) -> int:
        return self.lora_config.max_loras

    def add_adapter(self, adapter) -> bool:
        if adapter.id in self._registered_adapters:
            return False
        self._registered_adapters[adapter.id] = adapter
        return True

    def activate_adapter(self, lora_id: int) -> bool:
        if lora_id in self._active_adapters:
            return False
        first_free_slot = next(
            ((i, lora_id) for i, lora_id in enumerate(self.lora_index_to_id) if lora_id is None),
            None)
        if first_free_slot is None:
            raise ValueError("No free lora slots")
        index, _ = first_free_slot
        self._active_adapters[lora_id] = None
        self.lora_index_to_id[index] = self._registered_adapters[lora_id].id
        return True

    def _deactivate_adapter(self, lora_id: int) -> None:
        try:
            index = self.lora_index_to_id.index(lora_id)
            self.lora_index_to_id[index] = None
        except ValueError:
            pass

    def deactivate_adapter(self, adapter_id: int) -> bool:
        if adapter_id not in self._active_adapters:
            return False
        self._deactivate_adapter(adapter_id)
        self._active_adapters.pop(adapter_id, None)
        return True


class LRUCacheLoRAModelManager(LoRAModelManager):
    def activate_adapter(self, lora_id: int) -> bool:
        if lora_id not in self._active_adapters and len(
                self._active_adapters) >= self.lora_slots:
            oldest = next(iter(self._active_adapters))
            self.deactivate_adapter(oldest)
        result = super().activate_adapter(lora_id)
        self._active_adapters[lora_id] = self._active_adapters.pop(lora_id)  # touch
        return result
