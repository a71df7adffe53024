"""Whole-model serving equivalence on a GPU: real vLLM and sglang servers against PEFT.

A tiny Llama (saved with its weights, no tokenizer: prompts are token ids) and three trained
PEFT adapters (plain LoRA on every projection, rsLoRA, alpha_pattern) are served by the real
engine (``vllm.LLM`` / ``sglang.Engine``, eager, one process per engine); for each adapter and
prompt the engine's log-probabilities of its top tokens at the next position are compared with
PEFT's (``PeftModel`` on the same base, same dtype). Each adapter is then *as trained* (every
compared log-probability within ``--atol``) or *differs*; the expected verdicts are the CPU
equivalence tier's (sglang serves rsLoRA at alpha/r and ignores alpha_pattern: they differ).

    python tests/gpu/equivalence_gpu.py --engine vllm      # or sglang; both: no --engine

Exit 0 when every verdict is the expected one, 1 otherwise, 77 when there is no GPU or the
engine is not installed (skipped). Budget: under 8 minutes for both engines (start-up
dominates). `tests/gpu/test_gpu_equivalence.py` runs it under pytest, skipped without a GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SKIP = 77
ADAPTERS: dict[str, dict[str, Any]] = {
    "plain": {"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                 "up_proj", "down_proj"]},
    "rslora": {"use_rslora": True},
    "alpha-pattern": {"alpha_pattern": {"v_proj": 32}},
}
EXPECTED = {  # what the CPU equivalence tier measures, module by module
    "vllm": {"plain": "as trained", "rslora": "as trained", "alpha-pattern": "as trained"},
    "sglang": {"plain": "as trained", "rslora": "differs", "alpha-pattern": "differs"},
}
PROMPTS = [[1, 17, 42, 99, 7, 250, 3, 12], [5, 6, 7, 8], [300, 2, 2, 2, 9, 400]]
TOP = 20
COMPARED = 5
"""PEFT's top 5 next tokens are looked up among the engine's top 20 (ties at the edge of a
top-k list would otherwise swap tokens in and out)."""


def build(root: Path, dtype: str) -> tuple[Path, dict[str, Path]]:
    """The base (weights saved) and the trained adapters."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                         max_position_embeddings=256, tie_word_embeddings=False,
                         initializer_range=0.2,  # logits far from uniform: clear top tokens
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    base_dir = root / "base"
    model: Any = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    model.to(getattr(torch, dtype)).save_pretrained(str(base_dir))
    adapters = {}
    for seed, (name, options) in enumerate(ADAPTERS.items(), start=1):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
        options = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], **options}
        peft_model = get_peft_model(model, LoraConfig(**options))
        with torch.no_grad():
            for pname, param in peft_model.named_parameters():
                if "lora_B" in pname:
                    param.normal_(std=0.2)
        adapters[name] = root / name
        peft_model.save_pretrained(str(adapters[name]))
    return base_dir, adapters


def peft_top(base_dir: Path, adapter: Path, dtype: str,
             device: str = "cuda") -> list[dict[int, float]]:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base: Any = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=getattr(torch, dtype))
    model = PeftModel.from_pretrained(base, str(adapter)).to(device).eval()
    out = []
    with torch.no_grad():
        for prompt in PROMPTS:
            logits = model(torch.tensor([prompt], device=device)).logits[0, -1].float()
            logprobs = torch.log_softmax(logits, dim=-1)
            values, ids = logprobs.topk(TOP)
            out.append(dict(zip(ids.tolist(), values.tolist(), strict=True)))
    return out


def engine_top(engine: str, base_dir: Path, adapters: dict[str, Path],
               dtype: str) -> dict[str, list[dict[int, float]]]:
    """In this process: the engine serving every adapter; top log-probabilities per prompt."""
    found: dict[str, list[dict[int, float]]] = {}
    if engine == "vllm":
        from vllm import LLM, SamplingParams
        from vllm.lora.request import LoRARequest

        llm = LLM(model=str(base_dir), enable_lora=True, max_lora_rank=16, max_loras=3,
                  skip_tokenizer_init=True, dtype=dtype, enforce_eager=True,
                  gpu_memory_utilization=0.3, max_model_len=256)
        params = SamplingParams(max_tokens=1, logprobs=TOP, temperature=0.0, detokenize=False)
        for i, (name, path) in enumerate(adapters.items(), start=1):
            outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params,
                                   lora_request=LoRARequest(name, i, str(path)))
            found[name] = [{int(t): float(lp.logprob) for t, lp in o.outputs[0].logprobs[0]
                            .items()} for o in outputs]
    else:
        import sglang

        llm = sglang.Engine(model_path=str(base_dir), enable_lora=True, max_lora_rank=16,
                            lora_paths=[f"{n}={p}" for n, p in adapters.items()],
                            max_loras_per_batch=3, skip_tokenizer_init=True, dtype=dtype,
                            disable_cuda_graph=True, mem_fraction_static=0.3,
                            context_length=256)
        for name in adapters:
            outputs = llm.generate(input_ids=PROMPTS, lora_path=[name] * len(PROMPTS),
                                   sampling_params={"max_new_tokens": 1, "temperature": 0.0},
                                   return_logprob=True, top_logprobs_num=TOP)
            found[name] = [{int(t): float(lp) for lp, t, *_ in
                            o["meta_info"]["output_top_logprobs"][0]} for o in outputs]
        llm.shutdown()
    return found


def compare(peft: list[dict[int, float]], served: list[dict[int, float]],
            atol: float) -> tuple[str, float]:
    worst = 0.0
    for want, got in zip(peft, served, strict=True):
        for token, value in sorted(want.items(), key=lambda kv: -kv[1])[:COMPARED]:
            if token not in got:  # a top token of PEFT's the engine does not rank
                return "differs", float("inf")
            worst = max(worst, abs(got[token] - value))
    return ("as trained" if worst <= atol else "differs"), worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("vllm", "sglang"))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--atol", type=float, default=0.05)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("equivalence_gpu: no GPU here: skipped")
        return SKIP
    if args.child:  # one engine, in its own process
        spec = json.loads(args.child)
        found = engine_top(spec["engine"], Path(spec["base"]),
                           {k: Path(v) for k, v in spec["adapters"].items()}, args.dtype)
        Path(spec["out"]).write_text(json.dumps(found))
        return 0
    engines = [args.engine] if args.engine else ["vllm", "sglang"]
    engines = [e for e in engines if importlib.util.find_spec(e) is not None]
    if not engines:
        print("equivalence_gpu: neither engine is installed: skipped")
        return SKIP
    start = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="lora-guard-gpu-"))
    base_dir, adapters = build(root, args.dtype)
    peft = {name: peft_top(base_dir, path, args.dtype) for name, path in adapters.items()}
    failures = 0
    for engine in engines:
        out = root / f"{engine}.json"
        child = json.dumps({"engine": engine, "base": str(base_dir), "out": str(out),
                            "adapters": {k: str(v) for k, v in adapters.items()}})
        subprocess.run([sys.executable, __file__, "--child", child, "--dtype", args.dtype],
                       check=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        served = {k: [{int(t): v for t, v in d.items()} for d in lst]
                  for k, lst in json.loads(out.read_text()).items()}
        for name in adapters:
            verdict, worst = compare(peft[name], served[name], args.atol)
            expected = EXPECTED[engine][name]
            ok = verdict == expected
            failures += not ok
            print(f"{engine:7} {name:14} {verdict:11} (max |logprob diff| {worst:.4g}; "
                  f"expected {expected}) {'ok' if ok else 'UNEXPECTED'}")
    print(f"equivalence_gpu: {time.monotonic() - start:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
