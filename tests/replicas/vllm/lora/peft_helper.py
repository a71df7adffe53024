import json
import os
from dataclasses import dataclass, field


@dataclass
class PEFTHelper:
    r: int
    lora_alpha: int
    target_modules: list
    bias: str = "none"
    modules_to_save: list | None = None
    use_rslora: bool = False
    use_dora: bool = False
    rank_pattern: dict = field(default_factory=dict)

    @classmethod
    def from_local_dir(cls, lora_path: str, max_position_embeddings=None, **kwargs):
        with open(os.path.join(lora_path, "adapter_config.json")) as fh:
            config = json.load(fh)
        known = {k: v for k, v in config.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def validate_legal(self, lora_config) -> None:
        max_r = max([self.r, *self.rank_pattern.values()])
        if max_r > lora_config.max_lora_rank:
            raise ValueError(f"LoRA rank {max_r} is greater than max_lora_rank "
                             f"{lora_config.max_lora_rank}.")
        if self.bias != "none":
            raise ValueError("Adapter bias is not supported.")
