"""Real PEFT adapters for the checker's tests: tiny models built from configs, no download.

Import the helpers from a test module (``from conftest_adapters import ...``); the models are
built once per process and reused. The per-code test files (``tests/test_lgNNN_<slug>.py``)
save their adapters with `llama` and `save` and check them with `check`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import pathlib
import warnings
from collections.abc import Iterator
from typing import Any

import lora_guard as lg

TINY_LLAMA: dict[str, Any] = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
}
LARGER_LLAMA: dict[str, Any] = {
    "hidden_size": 96, "intermediate_size": 192, "num_hidden_layers": 3,
    "num_attention_heads": 6, "num_key_value_heads": 2, "vocab_size": 160,
}
TINY_QWEN3_MOE: dict[str, Any] = {
    "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "vocab_size": 128, "num_experts": 4, "num_experts_per_tok": 2,
}
MODELS: dict[str, dict[str, Any]] = {
    "llama": TINY_LLAMA, "llama-larger": LARGER_LLAMA, "qwen3moe": TINY_QWEN3_MOE}


@functools.cache
def _model_state(model: str) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    if model == "qwen3moe":
        return Qwen3MoeForCausalLM(Qwen3MoeConfig(**TINY_QWEN3_MOE)).state_dict()
    return LlamaForCausalLM(LlamaConfig(**MODELS[model])).state_dict()


def build_model(model: str) -> Any:
    """A fresh tiny transformers model (weights copied from a cached one: fast)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    instance: Any
    if model == "qwen3moe":
        instance = Qwen3MoeForCausalLM(Qwen3MoeConfig(**TINY_QWEN3_MOE))
    else:
        instance = LlamaForCausalLM(LlamaConfig(**MODELS[model]))
    instance.load_state_dict(_model_state(model))
    return instance


def llama(**overrides: Any) -> Any:
    """A fresh tiny Llama (seeded), with config overrides such as ``num_hidden_layers=4``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**{**TINY_LLAMA, **overrides}))


def save(model: Any, config: Any, folder: pathlib.Path, **save_kwargs: Any) -> pathlib.Path:
    """``get_peft_model(model, config).save_pretrained(folder, **save_kwargs)``."""
    from peft import get_peft_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        get_peft_model(model, config).save_pretrained(str(folder), **save_kwargs)
    return folder


@contextlib.contextmanager
def peft_alone() -> Iterator[None]:
    """PEFT without the integration's guards, whatever the session instruments
    (``--lora-guard-instrument=peft``): for a test that measures what PEFT alone does."""
    from lora_guard.integrations import peft as peft_guard

    was = peft_guard.INTEGRATION.instrumented
    peft_guard.uninstrument()
    try:
        yield
    finally:
        if was:
            peft_guard.instrument()


def check(folder: pathlib.Path, **limits: Any) -> lg.Report:
    """``lg.check_adapters([folder], lg.ServingLimits(**limits))``: the Report."""
    return lg.check_adapters([folder], lg.ServingLimits(**limits))


def messages(report: lg.Report) -> str:
    """A report's messages, one a line."""
    return "\n".join(v.message for v in report.violations)


def peft_adapter(
    folder: pathlib.Path, *, model: str = "llama", dtype: str = "float32", **lora: Any
) -> pathlib.Path:
    """``get_peft_model(tiny model, LoraConfig(**lora)).save_pretrained(folder)``."""
    import torch
    from peft import LoraConfig, get_peft_model

    lora.setdefault("task_type", "CAUSAL_LM")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model = get_peft_model(build_model(model), LoraConfig(**lora))
        peft_model = peft_model.to(getattr(torch, dtype))
        peft_model.save_pretrained(str(folder))
    return folder


def write_base_config(folder: pathlib.Path, model: str = "llama") -> pathlib.Path:
    """A Hugging Face config.json of the tiny model, as the base model's config."""
    from transformers import LlamaConfig, Qwen3MoeConfig

    config = (Qwen3MoeConfig(**TINY_QWEN3_MOE) if model == "qwen3moe"
              else LlamaConfig(**MODELS[model]))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(config.to_dict(), indent=2, default=str))
    return path


ZOO: dict[str, dict[str, Any]] = {
    "r8-qv": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]},
    "r16-all-bf16": {"r": 16, "lora_alpha": 16, "dtype": "bfloat16",
                     "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                        "up_proj", "down_proj"]},
    "rank-pattern-fp16": {"r": 4, "lora_alpha": 8, "dtype": "float16",
                          "target_modules": ["q_proj", "k_proj"],
                          "rank_pattern": {"k_proj": 2, "layers.1.self_attn.q_proj": 6}},
    "dora": {"r": 4, "lora_alpha": 4, "target_modules": ["q_proj", "down_proj"],
             "use_dora": True},
    "lora-bias": {"r": 4, "lora_alpha": 4, "target_modules": ["q_proj"], "lora_bias": True},
    "modules-to-save": {"r": 4, "lora_alpha": 4, "target_modules": ["q_proj"],
                        "modules_to_save": ["lm_head"]},
    "trainable-tokens": {"r": 4, "lora_alpha": 4, "target_modules": ["q_proj"],
                         "trainable_token_indices": [1, 2]},
    "embedding-fp16": {"r": 4, "lora_alpha": 4, "dtype": "float16",
                       "target_modules": ["embed_tokens", "lm_head"]},
    "moe-flat": {"model": "qwen3moe", "r": 4, "lora_alpha": 4, "target_modules": ["q_proj"],
                 "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]},
    "larger-base": {"model": "llama-larger", "r": 8, "lora_alpha": 8,
                    "target_modules": ["q_proj", "v_proj", "down_proj"]},
}
"""Real PEFT adapters the checker's tests share, by name -> peft_adapter() options."""


@functools.cache
def peft_zoo() -> dict[str, pathlib.Path]:
    """Every adapter of `ZOO`, saved by PEFT once per process into a temporary folder."""
    import atexit
    import shutil
    import tempfile

    root = pathlib.Path(tempfile.mkdtemp(prefix="lora-guard-zoo-"))
    atexit.register(shutil.rmtree, root, True)
    for name, options in ZOO.items():
        peft_adapter(root / "adapters" / name, **options)
    write_base_config(root / "llama")
    write_base_config(root / "qwen3moe", "qwen3moe")
    return {name: root / "adapters" / name for name in ZOO} | {
        "base-llama": root / "llama" / "config.json",
        "base-qwen3moe": root / "qwen3moe" / "config.json",
    }
