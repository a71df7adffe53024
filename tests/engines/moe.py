"""The tier's MoE cases: a tiny Qwen2-MoE base (hidden 64, 2 layers, 4 routed experts of
intermediate 32 and a shared expert), and MoE adapters in the per-expert layout PEFT saves for
MoE models whose experts are a ModuleList (``experts.<i>.gate_proj`` ..., 2-D halves), as the
field has them, each with the release behaviour it exercises.

transformers 5 fuses the experts of Qwen2-MoE into 3-D parameters, so PEFT can no longer train
these per-expert halves on it: the cases are written tensor by tensor in PEFT's key names and
``adapter_config.json`` (``rank_pattern`` where the experts' ranks differ), not trained.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

PREFIX = "base_model.model.model.layers"
EXPERTS = 4
RANK = 8
ALPHA = 16
SIZES = {"gate_proj": (64, 32), "up_proj": (64, 32), "down_proj": (32, 64)}
"""(in, out) of each expert projection."""


def qwen2_moe_config() -> Any:
    """The tiny MoE base: sglang's own Qwen2MoeForCausalLM builds it on a CPU. Every size
    of an MLP is 32 (sglang 0.5.20 sizes its gate_up_proj buffer from ``intermediate_size``,
    which the shared expert's LoRA layer must then match)."""
    from transformers import Qwen2MoeConfig

    config = Qwen2MoeConfig(
        hidden_size=64, intermediate_size=32, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, num_experts=EXPERTS, num_experts_per_tok=2,
        tie_word_embeddings=False, decoder_sparse_step=1, mlp_only_layers=[])
    config.architectures = ["Qwen2MoeForCausalLM"]
    return config


@dataclass(frozen=True)
class MoECase:
    name: str
    what: str
    ranks: dict[int, int] = field(default_factory=dict)
    """expert -> its rank where it is not `RANK` (with the matching ``rank_pattern``)."""
    shared: bool = False
    """Indexed shared-expert weights (``shared_experts.0.*``) beside the routed experts'."""
    rslora: bool = False

    def build(self, root: Path, seed: int = 0) -> Path:
        """The adapter folder, and its tensors by key in ``tensors.pt`` beside it."""
        path = root / self.name
        path.mkdir(parents=True, exist_ok=True)
        from safetensors.torch import save_file

        generator = torch.Generator().manual_seed(seed)
        tensors: dict[str, torch.Tensor] = {}
        pattern: dict[str, int] = {}
        for layer in range(2):
            groups = [("experts", e) for e in range(EXPERTS)]
            groups += [("shared_experts", 0)] if self.shared else []
            for kind, index in groups:
                rank = self.ranks.get(index, RANK) if kind == "experts" else RANK
                for proj, (n_in, n_out) in SIZES.items():
                    module = f"model.layers.{layer}.mlp.{kind}.{index}.{proj}"
                    if rank != RANK:
                        pattern[module] = rank
                    key = f"base_model.model.{module}"
                    tensors[f"{key}.lora_A.weight"] = torch.randn(rank, n_in,
                                                                  generator=generator)
                    tensors[f"{key}.lora_B.weight"] = torch.randn(n_out, rank,
                                                                  generator=generator)
        save_file(tensors, str(path / "adapter_model.safetensors"))
        (path / "adapter_config.json").write_text(json.dumps({
            "peft_type": "LORA", "r": RANK, "lora_alpha": ALPHA, "use_rslora": self.rslora,
            "rank_pattern": pattern, "alpha_pattern": {}, "bias": "none",
            "target_modules": sorted(SIZES), "base_model_name_or_path": "tiny-qwen2-moe"}))
        return path


CASES = (
    MoECase("moe-plain", "per-expert LoRA on every expert projection"),
    MoECase("moe-expert-ranks", "expert 1 at rank 4 (rank_pattern), the others at 8",
            ranks={1: 4}),
    MoECase("moe-rslora", "per-expert LoRA with use_rslora", rslora=True),
    MoECase("moe-shared-indexed", "indexed shared-expert weights (shared_experts.0.*)",
            shared=True),
)
BY_NAME = {case.name: case for case in CASES}
