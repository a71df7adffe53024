import json
import os


class LoRAConfig:
    def __init__(self, path: str, base_vocab_size=None) -> None:
        self.path = path
        with open(os.path.join(path, "adapter_config.json")) as fh:
            self.hf_config = json.load(fh)
        self.target_modules = self.hf_config["target_modules"]
        self.r = self.hf_config["r"]
        self.lora_alpha = self.hf_config["lora_alpha"]
        self.use_dora = bool(self.hf_config.get("use_dora", False))
        self.lora_added_tokens_size = 0
