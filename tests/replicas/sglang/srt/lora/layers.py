"""Replica of sglang.srt.lora.layers.FusedMoEWithLoRA.set_lora_info."""

import torch


class BaseLayerWithLoRA(torch.nn.Module):
    def __init__(self, base_layer=None, lora_backend=None):
        super().__init__()
        self.base_layer = base_layer
        self.lora_backend = lora_backend
        self.set_lora = False


class FusedMoEWithLoRA(BaseLayerWithLoRA):
    def set_lora_info(
        self,
        gate_up_lora_a_weights: torch.Tensor,  # [S, E|1, 2R, H]
        gate_up_lora_b_weights: torch.Tensor,  # [S, E, 2I, R]
        down_lora_a_weights: torch.Tensor,  # [S, E, R, I]
        down_lora_b_weights: torch.Tensor,  # [S, E|1, H, R]
    ):
        self.set_lora = True
        self.gate_up_lora_a_weights = gate_up_lora_a_weights
        self.gate_up_lora_b_weights = gate_up_lora_b_weights
        self.down_lora_a_weights = down_lora_a_weights
        self.down_lora_b_weights = down_lora_b_weights
