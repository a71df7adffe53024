"""Replica of vllm.lora.worker_manager: loading an adapter for a request."""

from vllm.lora.lora_model import LoRAModel
from vllm.lora.model_manager import LRUCacheLoRAModelManager
from vllm.lora.peft_helper import PEFTHelper


class LoRARequest:
    def __init__(self, lora_name: str, lora_int_id: int, lora_path: str) -> None:
        self.lora_name = lora_name
        self.lora_int_id = lora_int_id
        self.lora_path = lora_path


class WorkerLoRAManager:
    def __init__(self, lora_config, vocab_size: int, supported_lora_modules) -> None:
        self.lora_config = lora_config
        self.vocab_size = vocab_size
        self.supported_lora_modules = set(supported_lora_modules)
        self._adapter_manager = LRUCacheLoRAModelManager(lora_config)

    def _load_adapter(self, lora_request: LoRARequest) -> LoRAModel:
        peft_helper = PEFTHelper.from_local_dir(lora_request.lora_path)
        peft_helper.validate_legal(self.lora_config)
        return LoRAModel.from_local_checkpoint(
            lora_request.lora_path, self.supported_lora_modules, peft_helper=peft_helper,
            lora_model_id=lora_request.lora_int_id, device="cpu",
            model_vocab_size=self.vocab_size)

    def add_adapter(self, lora_request: LoRARequest) -> bool:
        lora = self._load_adapter(lora_request)
        self._adapter_manager.add_adapter(lora)
        return self._adapter_manager.activate_adapter(lora.id)


class LRUCacheWorkerLoRAManager(WorkerLoRAManager):
    pass
