"""Replica of vllm.lora.lora_model.LoRAModel (loading from a local checkpoint)."""

import os

import safetensors

_next_id = [0]


def get_lora_id():
    _next_id[0] += 1
    return _next_id[0]


class LoRAModel:
    def __init__(self, lora_model_id: int, rank: int, loras: dict) -> None:
        assert lora_model_id > 0
        self.id = lora_model_id
        self.rank = rank
        self.loras = loras

    @classmethod
    def from_lora_tensors(cls, lora_model_id, tensors, peft_helper, device="cuda", dtype=None,
                          model_vocab_size=None, weights_mapper=None, skip_prefixes=None):
        loras = {}
        for name, tensor in tensors.items():
            module, kind = name.split(".lora_", 1)
            module = module.removeprefix("base_model.model.")
            if kind.startswith("embedding_A") and model_vocab_size not in (None,
                                                                         tensor.shape[1]):
                raise RuntimeError("The embedding LoRA size must be consistent with the "
                                   "base model's vocabulary size.")
            loras.setdefault(module, {})[kind[0]] = tensor.to(device=device, dtype=dtype)
        return cls(lora_model_id, peft_helper.r, loras)

    @classmethod
    def from_local_checkpoint(
        cls,
        lora_dir: str,
        expected_lora_modules: set,
        peft_helper,
        *,
        lora_model_id=None,
        device: str = "cuda",
        dtype=None,
        model_vocab_size=None,
        weights_mapper=None,
        tensorizer_config_dict=None,
        skip_prefixes=None,
        moe_ep_spec=None,
    ) -> "LoRAModel":
        path = os.path.join(lora_dir, "adapter_model.safetensors")
        if not os.path.isfile(path):
            raise ValueError(f"{lora_dir} doesn't contain tensors")
        tensors = {}
        unexpected = []
        with safetensors.safe_open(path, framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is not iterable
                module = key.split(".lora_", 1)[0]
                if module.rsplit(".", 1)[-1] not in expected_lora_modules:
                    unexpected.append(module)
            if unexpected:
                raise ValueError(f"While loading {lora_dir}, expected target modules in "
                                 f"{expected_lora_modules} but received {unexpected}.")
            for key in f.keys():  # noqa: SIM118 - safe_open is not iterable
                tensors[key] = f.get_tensor(key)
        return cls.from_lora_tensors(
            get_lora_id() if lora_model_id is None else lora_model_id, tensors, peft_helper,
            device=device, dtype=dtype, model_vocab_size=model_vocab_size)
