"""Replica of the Inkling shared-sink LoRA layer (seed 000): pools fixed at first call."""

import torch


class InklingBatchDenseMLPWithLoRA(torch.nn.Module):
    is_shared_fused_moe = True

    def __init__(self, n_shared_experts: int = 2):
        super().__init__()
        self.n_shared_experts = n_shared_experts
        self.set_lora = False
        self.experts_shared_outer_loras = False
        self._w1_delta = None
        self._a_cat = None

    def set_lora_info(
        self,
        gate_up_lora_a_weights: torch.Tensor,
        gate_up_lora_b_weights: torch.Tensor,
        down_lora_a_weights: torch.Tensor,
        down_lora_b_weights: torch.Tensor,
    ) -> None:
        gate_outer = gate_up_lora_a_weights.shape[1]
        # the real layer assigns first and checks the pools after: a refused call is half done
        self.set_lora = True
        self.gate_up_lora_a_weights = gate_up_lora_a_weights
        self.gate_up_lora_b_weights = gate_up_lora_b_weights
        self.down_lora_a_weights = down_lora_a_weights
        self.down_lora_b_weights = down_lora_b_weights
        self.experts_shared_outer_loras = gate_outer == 1
        self._allocate_lora_operands()

    def _allocate_lora_operands(self) -> None:
        if not self.experts_shared_outer_loras:
            self._w1_delta = None
            self._a_cat = None
            return
        slots, n, two_f, rank = self.gate_up_lora_b_weights.shape
        _, _, _, f = self.down_lora_a_weights.shape
        expected_gate_up = (slots, n * two_f, 2 * rank)
        expected_down = (slots, rank, n * f)
        if self._w1_delta is None:
            self._w1_delta = self.gate_up_lora_b_weights.new_empty(expected_gate_up)
            self._a_cat = self.down_lora_a_weights.new_empty(expected_down)
            return
        if (tuple(self._w1_delta.shape) != expected_gate_up
                or tuple(self._a_cat.shape) != expected_down):
            raise RuntimeError(
                "Shared-sink LoRA pool shape changed after initialization: "
                f"gate-up {tuple(self._w1_delta.shape)} -> {expected_gate_up}, "
                f"down-A {tuple(self._a_cat.shape)} -> {expected_down}")
