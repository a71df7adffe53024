from dataclasses import dataclass


@dataclass
class LoRAConfig:
    max_lora_rank: int = 16
    max_loras: int = 1
    max_cpu_loras: int = 2
