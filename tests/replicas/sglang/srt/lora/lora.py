import os
import re

import torch
from safetensors.torch import load_file


class LoRALayer:
    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}
        self.pinned_weights: dict[str, torch.Tensor] = {}


class LoRAAdapter:
    def __init__(self, uid: str, config, num_layers: int) -> None:
        self.uid = uid
        self.config = config
        self.layers: list[LoRALayer] = [LoRALayer() for _ in range(num_layers)]
        self.embedding_layers: dict[str, torch.Tensor] = {}

    def initialize_weights(self) -> None:
        weights = load_file(os.path.join(self.config.path, "adapter_model.safetensors"))
        for name, tensor in weights.items():
            match = re.search(r"layers\.(\d+)\.", name)
            if match is None:
                self.embedding_layers[name] = tensor
            else:
                self.layers[int(match.group(1))].weights[name] = tensor
