"""``lora-guard verify``'s time and peak memory on a base far larger than the tier's.

Writes a Llama base of the given shape (default: TinyLlama-1.1B's: hidden 2048, 22 layers,
intermediate 5632, vocab 32000; bf16, sharded per layer with model.safetensors.index.json,
random weights written tensor by tensor) and a PEFT-format rsLoRA adapter (r=16 on q/k/v/o,
written directly), then runs ``lora-guard verify`` on it in a fresh process per engine and
prints wall time and peak RSS (``ru_maxrss`` of that process). Needs the engine environment
(``tests/engines/run`` builds it)::

    python bench/bench_verify.py [--layers 22] [--hidden 2048] [--engine sglang --engine vllm]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = """
import resource, sys, time
from lora_guard._frontends.cli import main
start = time.monotonic()
code = main(["verify", sys.argv[1], "--engine", sys.argv[2], "--base", sys.argv[3],
             "--no-progress"])
took = time.monotonic() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"RESULT exit={code} seconds={took:.1f} peak_rss_mb={peak:.0f}")
"""


def write_base(folder: Path, *, hidden: int, layers: int, inter: int, vocab: int,
               heads: int, kv_heads: int) -> int:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    head_dim = hidden // heads
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "vocab_size": vocab, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16", "rope_theta": 10000.0,
              "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2}
    (folder / "config.json").write_text(json.dumps(config))
    weight_map: dict[str, str] = {}
    total = 0
    generator = torch.Generator().manual_seed(0)

    def shard(name: str, tensors: dict[str, torch.Tensor]) -> None:
        nonlocal total
        save_file(tensors, str(folder / name))
        weight_map.update(dict.fromkeys(tensors, name))
        total += sum(t.numel() * t.element_size() for t in tensors.values())

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * 0.02).to(torch.bfloat16)

    shard("embed.safetensors", {"model.embed_tokens.weight": rand(vocab, hidden)})
    for i in range(layers):
        p = f"model.layers.{i}"
        shard(f"layer-{i:03d}.safetensors", {
            f"{p}.self_attn.q_proj.weight": rand(hidden, hidden),
            f"{p}.self_attn.k_proj.weight": rand(kv_heads * head_dim, hidden),
            f"{p}.self_attn.v_proj.weight": rand(kv_heads * head_dim, hidden),
            f"{p}.self_attn.o_proj.weight": rand(hidden, hidden),
            f"{p}.mlp.gate_proj.weight": rand(inter, hidden),
            f"{p}.mlp.up_proj.weight": rand(inter, hidden),
            f"{p}.mlp.down_proj.weight": rand(hidden, inter),
            f"{p}.input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
            f"{p}.post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16)})
    shard("head.safetensors", {"lm_head.weight": rand(vocab, hidden),
                               "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16)})
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}))
    return total


def write_adapter(folder: Path, *, hidden: int, layers: int, kv: int, rank: int) -> None:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    outs = {"q_proj": hidden, "k_proj": kv, "v_proj": kv, "o_proj": hidden}
    generator = torch.Generator().manual_seed(1)
    tensors = {}
    for i in range(layers):
        for module, out in outs.items():
            p = f"base_model.model.model.layers.{i}.self_attn.{module}"
            tensors[f"{p}.lora_A.weight"] = torch.randn(rank, hidden, generator=generator) * .02
            tensors[f"{p}.lora_B.weight"] = torch.randn(out, rank, generator=generator) * .02
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 32,
        "target_modules": list(outs), "use_rslora": True, "lora_dropout": 0.0,
        "bias": "none", "base_model_name_or_path": None, "fan_in_fan_out": False,
        "init_lora_weights": True, "modules_to_save": None}))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--inter", type=int, default=5632)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--engine", action="append", choices=("sglang", "vllm"))
    args = parser.parse_args()
    heads, kv_heads = max(args.hidden // 64, 1), max(args.hidden // 256, 1)
    with tempfile.TemporaryDirectory(prefix="lora-guard-bench-verify-") as folder:
        _measure(Path(folder), args, heads, kv_heads)  # the 2 GiB base goes with the folder
    return 0


def _measure(root: Path, args: argparse.Namespace, heads: int, kv_heads: int) -> None:
    start = time.monotonic()
    size = write_base(root / "base", hidden=args.hidden, layers=args.layers, inter=args.inter,
                      vocab=args.vocab, heads=heads, kv_heads=kv_heads)
    write_adapter(root / "adapter", hidden=args.hidden, layers=args.layers,
                  kv=kv_heads * (args.hidden // heads), rank=16)
    params = size // 2
    print(f"base: {params / 1e9:.2f} B parameters, {size / 2**30:.2f} GiB bf16 on disk "
          f"(written in {time.monotonic() - start:.0f} s)")
    for engine in args.engine or ["sglang", "vllm"]:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(root / "adapter"), engine, str(root / "base")],
            capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        result = [x for x in done.stdout.splitlines() if x.startswith("RESULT")]
        verdict = [x for x in done.stdout.splitlines() if x.startswith("verdict")]
        print(f"{engine}: {result[0] if result else done.stderr[-2000:]} "
              f"{verdict[0] if verdict else ''}")


if __name__ == "__main__":
    sys.exit(main())
