"""Regenerate examples/adapters/: tiny real PEFT-format adapters and their base config.

    python examples/make_examples.py

good/ holds a set that serves together on base/config.json; bad/ holds one adapter per
common incompatibility; moe/ holds two MoE adapters that each fit moe-base/config.json but
not one pool together (LG002). Every adapter is a few kilobytes (zero-filled weights).
"""

from __future__ import annotations

import json
import pathlib
import shutil

from lora_guard._testing.adapter_writer import write_adapter

ROOT = pathlib.Path(__file__).resolve().parent / "adapters"

BASE_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 128,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

GOOD = {
    "math": {"rank": 8, "targets": ("q_proj", "v_proj")},
    "code": {"rank": 16, "targets": ("q_proj", "k_proj", "v_proj", "o_proj"),
             "dtype": "bfloat16"},
    "chat": {"rank": 8, "targets": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                    "up_proj", "down_proj"),
             "rank_pattern": {"down_proj": 4}},
}

BAD = {
    "rank-64": {"rank": 64},                                        # LG101 with --max-rank 16
    "config-rank": {"defects": ("config-rank",)},                   # LG102
    "orphan-b": {"defects": ("orphan-b",)},                         # LG103
    "bad-key": {"defects": ("bad-key",)},                           # LG104
    "dora": {"defects": ("dora",)},                                 # LG105
    "mixed-dtype": {"defects": ("mixed-dtype",)},                   # LG106
    "empty-tensor": {"defects": ("empty-tensor",)},                 # LG107
    "pickle-bin": {"defects": ("pickle-bin",)},                     # LG108
    "truncated-header": {"defects": ("truncated-header",)},         # LG108
    "symlink-escape": {"defects": ("symlink-escape",)},             # LG108
    "larger-base": {"hidden_size": 96, "num_heads": 6, "layers": 3,  # LG109
                    "base_model": "tiny-llama-96"},
}


MOE_BASE_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 128,
}

MOE_TARGETS = ("q_proj", "gate_proj", "up_proj", "down_proj")

# Two MoE adapters that each fit the base model but cannot share one fused pool (LG002).
MOE = {
    "math-shared-outer": {"rank": 8, "targets": MOE_TARGETS, "moe_layout": "shared-outer",
                          "experts": 4, "intermediate_size": 32},
    "code-per-expert": {"rank": 8, "targets": MOE_TARGETS, "moe_layout": "packed",
                        "experts": 4, "intermediate_size": 32},
}


def main() -> None:
    if ROOT.exists():
        shutil.rmtree(ROOT)
    (ROOT / "base").mkdir(parents=True)
    (ROOT / "base" / "config.json").write_text(json.dumps(BASE_CONFIG, indent=2) + "\n")
    for name, options in GOOD.items():
        write_adapter(ROOT / "good" / name, **options)  # type: ignore[arg-type]
    for name, options in BAD.items():
        write_adapter(ROOT / "bad" / name, **options)  # type: ignore[arg-type]
    (ROOT / "moe-base").mkdir()
    (ROOT / "moe-base" / "config.json").write_text(json.dumps(MOE_BASE_CONFIG, indent=2) + "\n")
    for name, options in MOE.items():
        write_adapter(ROOT / "moe" / name, **options)  # type: ignore[arg-type]
    print(f"wrote {len(GOOD)} good, {len(BAD)} bad and {len(MOE)} MoE adapters under {ROOT}")


if __name__ == "__main__":
    main()
