"""The real lmdeploy 0.18.0 PyTorch engine's adapter loading, on a CPU.

`lmdeploy_model` is lmdeploy's own ``LlamaForCausalLM`` (``lmdeploy.pytorch.models.llama``),
built by ``build_patched_model`` from the tier's tiny Llama config (hidden 64, 2 layers, vocab
128) exactly as ``BaseModelAgent._build_model`` builds it, in float32 on the CPU. `load` then
calls ``lmdeploy.pytorch.engine.model_agent.agent.add_adapters`` (looked up on the agent module
at call time, as ``_build_model`` does, so an integration's patch is in the path) with the
``{name: path}`` of ``--adapters name=path``.

What a CPU needs and a GPU server does not: nothing on the adapter path (lmdeploy's CUDA ops
backend builds the layers; its import needs the real triton wheel, installed). The engine's
LoRA forward is a Triton kernel (``lmdeploy/pytorch/kernels/cuda/fused_lora.py``, called by
``backends/cuda/lora.py:TritonLoRAImpl.forward``): `lora_delta` runs the model's own ``LoRA``
module forward, that kernel included, in Triton's interpreter on the CPU
(``TRITON_INTERPRET=1``), with the first of lmdeploy's own autotune configs (the autotuner's
benchmark needs a GPU driver) and a step context that routes every token to one adapter.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# lmdeploy's LoRA kernel is Triton: on a CPU it runs in Triton's interpreter, which must be on
# before any kernel module is imported (JITFunction reads it when the kernel is defined)
os.environ.setdefault("TRITON_INTERPRET", "1")

import torch


@functools.cache
def lmdeploy_env() -> types.SimpleNamespace:
    import lmdeploy
    from lmdeploy.pytorch.config import ModelConfig
    from lmdeploy.pytorch.engine.model_agent import agent
    from lmdeploy.pytorch.models import patch
    from lmdeploy.pytorch.nn.linear.lora import LoRA

    return types.SimpleNamespace(version=lmdeploy.__version__, ModelConfig=ModelConfig,
                                 agent=agent, patch=patch, LoRA=LoRA)


def lmdeploy_model(**overrides: Any) -> Any:
    """lmdeploy's own tiny Llama, as the model agent builds it (float32, on the CPU)."""
    import _harness as h

    env = lmdeploy_env()
    config = h.llama_config(**overrides)
    config.architectures = ["LlamaForCausalLM"]
    model_config = env.ModelConfig.from_hf_config(config, None, dtype="float32",
                                                  device_type="cuda")
    return env.patch.build_patched_model(model_config, device=torch.device("cpu"),
                                         build_model_ctx=env.patch.BuildModelContext())


def load(model: Any, adapters: dict[str, Path | str]) -> Any:
    """``--adapters name=path ...``: the model agent's ``add_adapters`` call, on the CPU."""
    env = lmdeploy_env()
    return env.agent.add_adapters(model, {k: str(v) for k, v in adapters.items()},
                                  dtype=torch.float32, device=torch.device("cpu"))


def loaded(model: Any) -> dict[str, Any]:
    """Each LoRA module the engine added (``<packed module>.lora_adapters.<target>``) -> its
    adapter info (ranks, scalings per adapter id; id 0 is "no adapter")."""
    env = lmdeploy_env()
    return {name: module for name, module in model.named_modules()
            if isinstance(module, env.LoRA)}


# --- the corpus, built by a Python with a current PEFT ------------------------------------------

def corpus_root() -> Path:
    """The corpus folder ``tests/engines/build_corpus.py`` wrote (``LORA_GUARD_CORPUS``; the
    run script builds it with ``LORA_GUARD_CORPUS_PYTHON`` before the lmdeploy tier runs)."""
    import os

    root = os.environ.get("LORA_GUARD_CORPUS")
    if not root or not (Path(root) / "adapters").is_dir():
        raise RuntimeError(
            "LORA_GUARD_CORPUS does not name a built corpus: run the lmdeploy tier with "
            "tests/engines/run --lmdeploy 0.18.0 (it builds the corpus with a current PEFT "
            "first), or python tests/engines/build_corpus.py ROOT and set it")
    return Path(root)


def base_config_path(root: Path) -> Path:
    """The tiny Llama's config.json, the base every corpus adapter is checked against."""
    return root / "checker-base" / "vllm-base" / "config.json"


def in_peft_0_14_form(source: Path, dest: Path) -> Path:
    """A copy of the adapter whose config holds only the keys PEFT 0.14 knows (each newer
    key dropped), as lmdeploy's users re-save a current PEFT's adapter for it."""
    import json
    import shutil

    from lora_guard._checking.engines.lmdeploy import PEFT_0_14_LORA_KEYS

    shutil.copytree(source, dest)
    config = json.loads((dest / "adapter_config.json").read_text())
    (dest / "adapter_config.json").write_text(json.dumps(
        {k: v for k, v in config.items() if k in PEFT_0_14_LORA_KEYS}))
    return dest


# --- the engine's LoRA forward, on the CPU --------------------------------------------------

@contextlib.contextmanager
def uninitialised_as_nan() -> Iterator[None]:
    """``torch.empty`` inside ``add_adapters`` returns NaN-filled tensors: memory lmdeploy
    allocates and never writes (a slot without weights) shows as NaN in what it serves,
    instead of whatever the allocator had there (zeros on a fresh CPU page, stale data on a
    GPU's caching allocator)."""
    empty = torch.empty

    def poisoned(*args: Any, **kwargs: Any) -> torch.Tensor:
        found = empty(*args, **kwargs)
        if found.is_floating_point():
            found.fill_(math.nan)
        return found

    torch.empty = poisoned  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.empty = empty  # type: ignore[assignment]


@functools.cache
def _kernel_on_cpu() -> None:
    from lmdeploy.pytorch.kernels.cuda import fused_lora

    kernel = fused_lora._fused_lora_kernel
    kernel.configs = kernel.configs[:1]  # lmdeploy's own first config, no GPU benchmark


def lora_delta(module: Any, x: torch.Tensor, adapter_id: int = 1) -> torch.Tensor:
    """What lmdeploy's ``LoRA`` module adds to its layer's output for ``x`` (tokens, in), every
    token routed to ``adapter_id``: its ``forward`` on a zero base output, through
    ``TritonLoRAImpl`` and the fused_lora kernel; the part of the packed output it writes."""
    _kernel_on_cpu()
    tokens = x.shape[0]
    context = types.SimpleNamespace(
        q_start_loc=torch.tensor([0]), q_seqlens=torch.tensor([tokens]),
        local_adapter_ids=torch.tensor([adapter_id]), is_decoding=False)
    kept = module.ctx_mgr
    module.ctx_mgr = types.SimpleNamespace(current_context=lambda: context)
    try:
        width = module.adapter_info.base_slice.stop
        out = module.forward(x, base_output=torch.zeros(tokens, width, dtype=x.dtype))
    finally:
        module.ctx_mgr = kept
    return out[:, module.adapter_info.base_slice]
