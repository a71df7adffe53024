"""The installed engine's own model and LoRA layers on the CPU, as ``lora-guard verify`` drives
them: `SglangEngine` (``LoRAManager(lora_backend="torch_native")``), `VllmEngine`
(``LRUCacheWorkerLoRAManager``, its CPU punica wrapper), each module of each as an
`EngineModule`."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lora_guard._frontends._verify_cpu import (
    cpu_shims,
    free_port,
    sglang_one_process,
    vllm_cpu_platform,
)

__all__ = ["ENGINE_CLASSES", "EngineModule", "Refused", "SglangEngine", "VllmEngine",
           "release_module"]


class Refused(Exception):
    """The engine's loader refused the adapter (its own message)."""


@dataclass
class EngineModule:
    name: str
    kind: str  # "linear", "embedding", "lm_head"
    parts: tuple[tuple[str, int], ...]
    """PEFT's modules in the engine module's output, in order, with their output sizes."""
    module: Any


def release_module(module: Any) -> None:
    """Drop a module's base weights (loaded for one measurement) to keep memory bounded."""
    for param in module.parameters(recurse=True):
        if param.numel() and param.dtype.is_floating_point and param.dim() >= 1:
            param.data = torch.empty(0, dtype=param.dtype)


_PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
"""The engines' stacked modules of the Llama family, where a model class does not say."""


def _packed(model: Any) -> dict[str, list[str]]:
    mapping = getattr(model, "packed_modules_mapping", None) or _PACKED
    return {k: list(v) for k, v in mapping.items()}


def _parts(name: str, module: Any, packed: dict[str, list[str]],
           sizes: Callable[[str], int]) -> tuple[tuple[str, int], ...]:
    head, _, leaf = name.rpartition(".")
    members = [leaf]
    if leaf in packed:
        try:
            sizes(name)  # the transformers model has the packed module itself (Phi-3)
        except AttributeError:
            members = packed[leaf]
    return tuple((f"{head}.{m}" if head else m, sizes(f"{head}.{m}" if head else m))
                 for m in members)


# --- sglang -----------------------------------------------------------------------------------


class SglangEngine:
    """sglang's model and ``LoRAManager(lora_backend="torch_native")`` on the CPU."""

    name = "sglang"

    def __init__(self, base: Path, config: Any, adapter: Path, *, max_rank: int,
                 dtype: torch.dtype, target_modules: set[str] | None = None) -> None:
        """``target_modules``: ``--lora-target-modules``; None: sglang's default, inferred
        from the adapter given at start-up (``--lora-paths``)."""
        cpu_shims()
        import sglang
        from sglang.srt.configs.load_config import LoadConfig
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

        self.version = sglang.__version__
        args = ServerArgs(model_path=str(base), device="cpu", enable_lora=True,
                          max_lora_rank=max_rank, lora_target_modules=["all"],
                          lora_backend="torch_native")
        from sglang.srt.runtime_context import get_server_args

        current = None
        with contextlib.suppress(Exception):
            current = get_server_args()
        if current is None or not getattr(current, "enable_lora", False):
            set_global_server_args_for_scheduler(args)  # a scheduler's process-wide args
        sglang_one_process()
        from sglang.srt.lora import lora_manager, lora_registry

        cls = _sglang_model_class(config)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            self.model = cls(config, quant_config=None)
        finally:
            torch.set_default_dtype(previous)
        self.uid = "verify"
        ref = lora_registry.LoRARef(lora_id=self.uid, lora_name=self.uid,
                                    lora_path=str(adapter), pinned=False)
        try:
            self.manager = lora_manager.LoRAManager(
                self.model, config, max_loras_per_batch=2, load_config=LoadConfig(),
                dtype=dtype, server_args=args, lora_backend="torch_native",
                max_lora_rank=max_rank, target_modules=target_modules,
                lora_paths=[ref] if target_modules is None else None)
            if target_modules is not None:
                result = self.manager.load_lora_adapter(ref)
                if not result.success:
                    raise Refused(result.error_message or "(an empty error message)")
            self.manager.fetch_new_loras({self.uid, None})  # the memory pool admits it
        except Refused:
            raise
        except Exception as exc:
            raise Refused(f"{type(exc).__name__}: {exc}") from exc

    def modules(self, sizes: Callable[[str], int]) -> list[EngineModule]:
        packed = _packed(self.model)
        out = []
        # the embeddings and lm_head run wrapped or not: an adapter that trains them (saved
        # copies, token deltas) is served by them either way
        embed = self.manager.embed_tokens_module or self.model.get_input_embeddings()
        name = _find(self.model, embed)
        out.append(EngineModule(name, "embedding", ((name, 0),), embed))
        for layer in self.manager.lora_modules:
            for name, module in layer.items():
                out.append(EngineModule(name, "linear", _parts(name, module, packed, sizes),
                                        module))
        head = self.manager.lm_head_module or getattr(self.model, "lm_head", None)
        if head is not None:
            name = _find(self.model, head)
            out.append(EngineModule(name, "lm_head", ((name, 0),), head))
        return out

    def load(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        self.model.load_weights(iter(weights))

    def run(self, module: EngineModule, x: torch.Tensor, phase: str, adapter: bool) -> Any:
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        n = x.shape[0]
        uid = self.uid if adapter else None
        if phase == "prefill":  # one request of n tokens
            ids, mode, lens = [uid], ForwardMode.EXTEND, [n]
        else:  # n requests of one token each
            ids, mode, lens = [uid] * n, ForwardMode.DECODE, [1] * n
        batch = types.SimpleNamespace(
            lora_ids=ids, forward_mode=mode, batch_size=len(ids),
            extend_seq_lens=torch.tensor(lens, dtype=torch.int32), extend_seq_lens_cpu=lens,
            extend_num_tokens=n, can_run_decode_cuda_graph=False, spec_info=None)
        self.manager.prepare_lora_batch(batch)
        if module.kind == "lm_head" and not hasattr(module.module, "lora_backend"):
            return torch.nn.functional.linear(x, module.module.weight)  # as the logits do
        out = module.module(x)
        return out[0] if isinstance(out, tuple) else out


def _sglang_model_class(config: Any) -> Any:
    """sglang's class for the base's architecture: its module by ``model_type`` first (the
    registry imports every model sglang has, which takes minutes on a CPU)."""
    import importlib

    wanted = list(getattr(config, "architectures", None) or [])
    with contextlib.suppress(ImportError):
        module = importlib.import_module(f"sglang.srt.models.{config.model_type}")
        entries = getattr(module, "EntryClass", [])
        for entry in entries if isinstance(entries, list) else [entries]:
            if entry.__name__ in wanted:
                return entry
    from sglang.srt.models.registry import ModelRegistry

    return ModelRegistry.resolve_model_cls(wanted)[0]


def _find(model: Any, target: Any) -> str:
    for name, module in model.named_modules():
        if module is target:
            return str(name)
    raise LookupError("module not found")


# --- vLLM -------------------------------------------------------------------------------------


class VllmEngine:
    """vLLM's model and ``LRUCacheWorkerLoRAManager`` on the CPU (its CPU punica wrapper)."""

    name = "vllm"
    _distributed = False

    def __init__(self, base: Path, config: Any, adapter: Path, *, max_rank: int,
                 dtype: torch.dtype) -> None:
        cpu_shims()
        vllm_cpu_platform()
        import vllm
        from vllm.config import (
            DeviceConfig,
            LoRAConfig,
            ModelConfig,
            VllmConfig,
            set_current_vllm_config,
        )
        from vllm.lora import worker_manager
        from vllm.lora.request import LoRARequest

        self.version = vllm.__version__
        lora_config = LoRAConfig(max_lora_rank=max_rank, max_loras=1, lora_dtype=dtype)
        model_config = ModelConfig(model=str(base), tokenizer=None, skip_tokenizer_init=True,
                                   dtype=dtype)
        self.config = VllmConfig(model_config=model_config, lora_config=lora_config,
                                 device_config=DeviceConfig(device="cpu"))
        self._current = set_current_vllm_config
        with set_current_vllm_config(self.config):
            if not VllmEngine._distributed:
                from vllm.distributed import (
                    ensure_model_parallel_initialized,
                    init_distributed_environment,
                    model_parallel_is_initialized,
                )
                if not model_parallel_is_initialized():
                    init_distributed_environment(
                        world_size=1, rank=0, local_rank=0, backend="gloo",
                        distributed_init_method=f"tcp://127.0.0.1:{free_port()}")
                    ensure_model_parallel_initialized(1, 1)
                VllmEngine._distributed = True
            from vllm.model_executor.models import ModelRegistry

            cls, _ = ModelRegistry.resolve_model_cls(config.architectures, model_config)
            previous = torch.get_default_dtype()
            torch.set_default_dtype(dtype)
            try:
                self.model = cls(vllm_config=self.config)
            finally:
                torch.set_default_dtype(previous)
            for module in self.model.modules():  # the base GEMM hook (set with vllm._C)
                if hasattr(module, "quant_method") and not hasattr(module, "cpu_linear"):
                    module.cpu_linear = torch.nn.functional.linear
            self.worker = worker_manager.LRUCacheWorkerLoRAManager(
                self.config, torch.device("cpu"), getattr(self.model, "embedding_modules", {}))
            self.worker.create_lora_manager(self.model, self.config)
            try:
                self.worker.add_adapter(LoRARequest("verify", 1, str(adapter)))
            except Exception as exc:
                raise Refused(f"{type(exc).__name__}: {exc}") from exc
        self.lora_id = 1

    def modules(self, sizes: Callable[[str], int]) -> list[EngineModule]:
        from vllm.lora.layers import BaseLayerWithLoRA, LogitsProcessorWithLoRA

        packed = _packed(self.model)
        out = []
        for name, module in self.model.named_modules():
            if isinstance(module, LogitsProcessorWithLoRA):
                head = name.rpartition(".")[0]
                lm = f"{head}.lm_head" if head else "lm_head"
                out.append(EngineModule(lm, "lm_head", ((lm, 0),), module))
            elif isinstance(module, BaseLayerWithLoRA):
                kind = "embedding" if "embed" in name else "linear"
                parts = ((name, 0),) if kind == "embedding" else _parts(name, module, packed,
                                                                          sizes)
                out.append(EngineModule(name, kind, parts, module))
        order = {"embedding": 0, "linear": 1, "lm_head": 2}
        return sorted(out, key=lambda m: order[m.kind])

    def load(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        with self._current(self.config):
            self.model.load_weights(iter(weights))

    def run(self, module: EngineModule, x: torch.Tensor, phase: str, adapter: bool) -> Any:
        from vllm.lora.layers import LoRAMapping

        n = x.shape[0]
        index = self.lora_id if adapter else 0
        prompts = 1 if phase == "prefill" else n
        mapping = LoRAMapping((index,) * n, (index,) * prompts, is_prefill=phase == "prefill")
        with self._current(self.config):
            if adapter:
                self.worker._adapter_manager.activate_adapter(self.lora_id)
            self.worker._adapter_manager.set_adapter_mapping(mapping)
            if module.kind == "lm_head":
                lm_head = self.model.get_submodule(module.name)
                return module.module(lm_head, x)
            out = module.module(x)
        return out[0] if isinstance(out, tuple) else out


ENGINE_CLASSES: dict[str, Callable[..., Any]] = {"sglang": SglangEngine, "vllm": VllmEngine}
"""``--engine`` -> the class that builds that engine's LoRA layers."""
