"""The differential corpus: real PEFT adapters, legitimate and broken as the field breaks them.

Each `Case` builds one adapter folder (`build`) for the tier's servers: a tiny Llama (hidden 64,
2 layers, vocab 128), ``--max-lora-rank 16``; sglang with ``--lora-target-modules`` the seven
Llama projections. `SILENT` says, per engine, why a case the engine accepts is one lora_guard
must refuse (the engine would serve garbage or fail later); every other case must get the same
verdict from the engine and from lora_guard.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _harness as h
import torch

DROP = h.DROP
"""A config value that removes its key (`Case.config`)."""
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PREFIX = "base_model.model.model.layers"


@dataclass(frozen=True)
class Case:
    name: str
    what: str
    lora: dict[str, Any] = field(default_factory=dict)
    base: Callable[[], Any] | None = None
    task_type: str | None = None
    edit: Callable[[dict[str, torch.Tensor]], None] | None = None
    config: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    """Other files of the folder, name -> text (a tokenizer save's added_tokens.json)."""

    def build(self, root: Path, keep: dict[str, Any] | None = None) -> Path:
        """The adapter folder; ``keep`` receives the trained model and the base's folder."""
        path = h.peft_adapter(root / self.name, task_type=self.task_type, keep=keep,
                              base=self.base() if self.base else None, **self.lora)
        if self.edit is not None:
            h.edit_weights(path, self.edit)
        if self.config:
            h.edit_config(path, **self.config)
        for name, text in self.files.items():
            (path / name).write_text(text, encoding="utf-8")
        return path


def _drop_lora_b(t: dict[str, torch.Tensor]) -> None:
    del t[f"{PREFIX}.1.self_attn.v_proj.lora_B.weight"]


def _zero_size(t: dict[str, torch.Tensor]) -> None:
    t[f"{PREFIX}.1.self_attn.v_proj.lora_A.weight"] = torch.zeros(0, 64)


def _cast(dtype: torch.dtype) -> Callable[[dict[str, torch.Tensor]], None]:
    def edit(t: dict[str, torch.Tensor]) -> None:
        for key in t:
            t[key] = t[key].to(dtype)
    return edit


def _vision_tower(t: dict[str, torch.Tensor]) -> None:
    prefix = "base_model.model.vision_tower.encoder.layers.0.self_attn.q_proj"
    t[f"{prefix}.lora_A.weight"] = torch.randn(8, 32)
    t[f"{prefix}.lora_B.weight"] = torch.randn(32, 8)


def _experts(t: dict[str, torch.Tensor]) -> None:
    for expert in range(2):
        prefix = f"{PREFIX}.0.mlp.experts.{expert}.gate_proj"
        t[f"{prefix}.lora_A.weight"] = torch.randn(8, 64)
        t[f"{prefix}.lora_B.weight"] = torch.randn(128, 8)


def _layer_beyond_base(t: dict[str, torch.Tensor]) -> None:
    for key in [k for k in t if ".layers.1." in k]:
        t[key.replace(".layers.1.", ".layers.7.")] = t.pop(key)


def _transposed(t: dict[str, torch.Tensor]) -> None:
    key = f"{PREFIX}.0.self_attn.q_proj.lora_A.weight"
    t[key] = t[key].t().contiguous()


def _full_weight(t: dict[str, torch.Tensor]) -> None:
    t[f"{PREFIX}.0.self_attn.q_proj.weight"] = torch.randn(64, 64)


def _saved_embedding_layers(t: dict[str, torch.Tensor]) -> None:
    # what save_pretrained(path, save_embedding_layers=True) adds when the embeddings are no
    # LoRA target: the full weights, keyed by the module itself (not .base_layer)
    t["base_model.model.model.embed_tokens.weight"] = torch.randn(h.VOCAB, 64)
    t["base_model.model.lm_head.weight"] = torch.randn(h.VOCAB, 64)


def _low_rank_tensors(t: dict[str, torch.Tensor]) -> None:
    for key in list(t):  # the config says r=8; the tensors are rank 4
        t[key] = t[key][:4].clone() if "lora_A" in key else t[key][:, :4].clone()


def _bigger_base() -> Any:
    return h.llama_config(hidden_size=128, intermediate_size=256)


def _biased_base() -> Any:
    return h.llama_config(attention_bias=True)


def _bigger_vocab() -> Any:
    return h.llama_config(vocab_size=256)


def _phi3() -> Any:
    from transformers import Phi3Config

    return Phi3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                      pad_token_id=0, tie_word_embeddings=False)


CASES: list[Case] = [
    # --- legitimate ------------------------------------------------------------------------
    Case("good-r8", "rank 8 on q_proj, v_proj", dict(r=8)),
    Case("good-r16", "rank 16, the server's max", dict(r=16)),
    Case("good-r1", "rank 1", dict(r=1)),
    Case("good-attention", "q, k, v, o", dict(target_modules=ALL[:4])),
    Case("good-mlp", "gate, up, down", dict(target_modules=ALL[4:])),
    Case("good-all-linear", 'target_modules="all-linear"', dict(target_modules="all-linear")),
    Case("good-regex", "target_modules as a regex string",
         dict(target_modules=r".*\.(q_proj|v_proj)")),
    Case("good-rslora", "use_rslora", dict(use_rslora=True)),
    Case("good-alpha-pattern", "alpha_pattern", dict(alpha_pattern={"v_proj": 32})),
    Case("good-rank-pattern-lower", "r=16 with rank_pattern q/v 4",
         dict(r=16, rank_pattern={"q_proj": 4, "v_proj": 4})),
    Case("good-layers-to-transform", "layers_to_transform=[0]", dict(layers_to_transform=[0])),
    Case("good-dropout", "lora_dropout=0.1", dict(lora_dropout=0.1)),
    Case("good-fp16", "fp16 weights on an fp32 model (cast)", edit=_cast(torch.float16)),
    Case("good-bf16", "bf16 weights on an fp32 model (cast)", edit=_cast(torch.bfloat16)),
    # --- rank ----------------------------------------------------------------------------
    Case("rank-32", "rank above the server's (32 > 16)", dict(r=32)),
    Case("rank-64", "rank 64 > 16", dict(r=64)),
    Case("rank-pattern-32", "r=8, rank_pattern q/v 32", dict(r=8, rank_pattern={
        "q_proj": 32, "v_proj": 32})),
    Case("rank-pattern-mixed-qkv", "r=8, rank_pattern q 16: ranks differ within q/k/v",
         dict(r=8, rank_pattern={"q_proj": 16})),
    Case("rank-config-lies", "config r=8, tensors rank 4", edit=_low_rank_tensors),
    # --- features --------------------------------------------------------------------------
    Case("dora", "use_dora", dict(use_dora=True)),
    Case("lora-bias", "lora_bias", dict(lora_bias=True)),
    Case("bias-all", 'bias="all" on a base with biases (trained biases saved)',
         dict(bias="all"), base=_biased_base),
    Case("bias-lora-only", 'bias="lora_only" on a base with biases (trained biases saved)',
         dict(bias="lora_only"), base=_biased_base),
    Case("save-lm-head", 'modules_to_save=["lm_head"]', dict(modules_to_save=["lm_head"])),
    Case("save-embed", 'modules_to_save=["embed_tokens"]',
         dict(modules_to_save=["embed_tokens"])),
    Case("pissa", 'init_lora_weights="pissa"', dict(init_lora_weights="pissa")),
    Case("olora", 'init_lora_weights="olora"', dict(init_lora_weights="olora")),
    Case("loftq", 'init_lora_weights="loftq" (config)', config=dict(init_lora_weights="loftq")),
    Case("trainable-tokens", "trainable_token_indices", dict(trainable_token_indices=[0, 1])),
    Case("seq-cls-score", "SEQ_CLS: score in modules_to_save", task_type="SEQ_CLS"),
    Case("added-tokens", "added_tokens.json: 2 tokens past the vocab (ids 128, 129)",
         files={"added_tokens.json": '{"<sql>": 128, "</sql>": 129}'}),
    Case("added-tokens-copied", "added_tokens.json of the base's own tokens (ids 0, 127)",
         files={"added_tokens.json": '{"<pad>": 0, "<eot>": 127}'}),
    # --- targets and names -----------------------------------------------------------------
    Case("packed-qkv", "Phi-3 style packed qkv_proj/gate_up_proj (same dims)",
         dict(target_modules=["qkv_proj", "gate_up_proj"]), base=_phi3),
    Case("vision-tower", "vision tower weights on a text-only base", edit=_vision_tower),
    Case("moe-experts", "per-expert MoE weights on a dense base", edit=_experts),
    Case("layer-beyond-base", "layer 7 on a 2-layer base", edit=_layer_beyond_base),
    Case("full-weight-key", "a full weight outside LoRA key grammar", edit=_full_weight),
    Case("embedding", "LoRA on embed_tokens", dict(target_modules=["embed_tokens", "q_proj"])),
    Case("saved-embedding-layers", "save_embedding_layers: full embed_tokens/lm_head weights",
         edit=_saved_embedding_layers),
    Case("lm-head", "LoRA on lm_head", dict(target_modules=["lm_head", "q_proj"])),
    # --- stacks (found by the field sweep: sglang stacks q/k/v from q_proj, gate/up from
    # gate_proj; vLLM applies each projection on its own) -------------------------------
    Case("q-only", "q_proj only: no v_proj to stack it with", dict(target_modules=["q_proj"])),
    Case("k-v", "k_proj and v_proj, no q_proj", dict(target_modules=["k_proj", "v_proj"])),
    Case("up-no-gate", "up_proj and down_proj, no gate_proj",
         dict(target_modules=["up_proj", "down_proj"])),
    Case("targets-null", "target_modules null in the config (hand-written, converted)",
         config=dict(target_modules=None)),
    # --- peft_type as hand-written or converted configs spell it (vLLM does not read it,
    # sglang takes any case of "lora", lmdeploy's pinned PEFT only "LORA") -----------------
    Case("peft-type-lower", 'peft_type "lora"', config=dict(peft_type="lora")),
    Case("peft-type-padded", 'peft_type "LORA " (a trailing space)',
         config=dict(peft_type="LORA ")),
    Case("peft-type-missing", "no peft_type in the config", config=dict(peft_type=DROP)),
    # --- another base, broken tensors ------------------------------------------------------
    Case("other-base-hidden", "trained on a base of hidden size 128", base=_bigger_base),
    Case("other-base-vocab", "embedding LoRA trained on a vocab of 256",
         dict(target_modules=["embed_tokens"]), base=_bigger_vocab),
    Case("zero-size", "a zero-size lora_A", edit=_zero_size),
    Case("missing-lora-b", "a lora_B missing", edit=_drop_lora_b),
    Case("transposed-a", "a lora_A saved transposed", edit=_transposed),
    # --- what a flag names, and what the files hold ------------------------------------
    Case("bias-all-none-saved", 'bias="all" on a base without biases: no bias tensor saved',
         dict(bias="all")),
]
