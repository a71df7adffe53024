"""``lora-guard verify``: what the installed engine computes with an adapter, module by module.

The checker reads headers and predicts; ``verify`` measures. It builds the installed engine's own
model and LoRA layers on the CPU (vLLM's CPU punica wrapper, sglang's ``torch_native`` backend),
loads the adapter through the engine's own loader, and runs every LoRA-wrapped module of the
engine (every layer's projections, the embeddings, lm_head) on the same inputs as PEFT's own
LoRA layers reloaded from the adapter's files, in prefill and in decode. Each module is then
*as trained* (within `TOLERANCE` of PEFT), *base* (the engine ignores the adapter there), or
*differs*, with how (scaled by x, an offset such as a dropped bias, other).

The base model's weights are read lazily from its safetensors files, one engine module at a
time, and released after it (the engine's and PEFT's models are built without their weights),
so the memory it needs is about one module's weights, the embedding and lm_head being the
largest, plus the adapter.

Example (needs the engine installed; see docs/guides/verify.md)::

    lora-guard verify ./adapters/math --engine sglang --base ./models/llama-3-8b

    >>> from lora_guard._frontends.verify import classify
    >>> import torch
    >>> base = torch.zeros(2, 3); peft = torch.ones(2, 3)
    >>> classify(peft * 0.5, peft, base)
    ('differs', 'scaled by 0.5')
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import importlib.util
import json
import math
import os
import socket
import sys
import time
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

TOLERANCE = 1e-4
"""A module serves *as trained* when the largest difference from PEFT's output is at most this
fraction of the adapter's effect there (the largest ``|PEFT - base|``), or of the output's
magnitude where the adapter changes nothing (fp32 on both sides: the rest is summation order)."""

ENGINES = ("vllm", "sglang")
VALIDATED_RELEASES: dict[str, tuple[str, ...] | None] = {"vllm": ("0.34.0",), "sglang": None}
"""The releases whose LoRA layers verify's driver was measured against, per engine (None: any
supported release). vLLM 0.31.0's CPU decode path, driven the same way, left every module at
the base: until that is understood, verify refuses vLLM releases it has not been measured on
rather than report what may be its own driver's fault."""
PHASES = ("prefill", "decode")
_TOKENS = 8
_SEED = 0


class Refused(Exception):
    """The engine's loader refused the adapter (its own message)."""


class VerifyError(Exception):
    """``verify`` cannot run: ``code`` names why, the message says what to do (exit 2)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"[{code}] {message}")
        self.code = code


# --- results --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModuleResult:
    """One PEFT module inside one engine module, in one phase."""

    module: str
    """The engine's module, e.g. ``model.layers.0.self_attn.qkv_proj``."""
    part: str
    """PEFT's module whose output slice this is, e.g. ``model.layers.0.self_attn.q_proj``."""
    phase: str
    verdict: str
    """``as trained``, ``base`` (the engine ignores the adapter here) or ``differs``."""
    how: str
    """For ``differs``: ``scaled by X``, ``offset (a bias) differs by X``, ``max diff X``."""
    effect: float
    """The adapter's effect here: the largest ``|PEFT - base|``."""
    diff: float
    """The largest ``|engine - PEFT|``."""


@dataclass(frozen=True)
class Report:
    engine: str
    version: str
    adapter: str
    results: tuple[ModuleResult, ...]
    refused: str = ""
    """The engine's own refusal to load the adapter (then ``results`` is empty)."""
    unloadable: str = ""
    """PEFT's own refusal to load the adapter's files (then ``results`` is empty)."""

    @property
    def verdict(self) -> str:
        """``refused`` (by the engine), ``unloadable`` (by PEFT), ``as trained`` (every
        module), ``base`` (every module the adapter changes is served as the base) or
        ``differs``."""
        if self.refused:
            return "refused"
        if self.unloadable:
            return "unloadable"
        off = [r for r in self.results if r.verdict != "as trained"]
        if not off:
            return "as trained"
        changed = {r.part for r in self.results if r.effect > 0}
        if all(r.verdict == "base" for r in off) and changed <= {r.part for r in off}:
            return "base"
        return "differs"


def _close(a: torch.Tensor, b: torch.Tensor, scale: float) -> bool:
    return float((a - b).abs().max()) <= TOLERANCE * max(scale, 1e-6)


def classify(engine: torch.Tensor, peft: torch.Tensor, base: torch.Tensor,
             scales: dict[str, float] | None = None) -> tuple[str, str]:
    """``(verdict, how)`` for one output: the engine's, PEFT's and the base's (no adapter).

    ``scales`` names the strengths an engine could serve instead of PEFT's (e.g. ``{"rsLoRA
    ignored (alpha/r)": 0.354}``): a scaled delta that matches one is named by it.
    """
    engine, peft, base = (t.detach().double() for t in (engine, peft, base))
    effect = float((peft - base).abs().max())
    magnitude = float(peft.abs().max())
    if _close(engine, peft, effect if effect > 0 else magnitude):
        return "as trained", ""
    if _close(engine, base, effect):
        return "base", "the adapter is not applied"
    served, trained = engine - base, peft - base
    norm = float((trained * trained).sum())
    if norm > 0:
        scale = float((served * trained).sum()) / norm
        if _close(served, trained * scale, effect * max(abs(scale), 1.0)):
            named = [name for name, value in (scales or {}).items()
                     if abs(value - scale) <= 1e-3 * max(abs(value), 1e-6)]
            return "differs", f"scaled by {scale:.4g}" + (f": {named[0]}" if named else "")
    offset = engine - peft
    if offset.dim() >= 2 and offset.shape[0] > 1 and _close(offset, offset[:1].expand_as(offset),
                                                            effect):
        return "differs", (f"offset (a bias) differs by up to "
                           f"{float(offset[0].abs().max()):.3g}")
    return "differs", f"max diff {float(offset.abs().max()):.3g} (effect {effect:.3g})"


# --- the base's weights, read lazily ---------------------------------------------------------


class BaseWeights:
    """A base model folder's tensors by name, read one at a time from its safetensors files."""

    def __init__(self, folder: Path) -> None:
        from safetensors import safe_open

        self.folder = folder
        self._open = safe_open
        index = folder / "model.safetensors.index.json"
        self.where: dict[str, Path] = {}
        if index.is_file():
            mapping = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
            self.where = {name: folder / file for name, file in mapping.items()}
        else:
            for file in sorted(folder.glob("*.safetensors")):
                with safe_open(str(file), framework="pt") as f:
                    self.where.update(dict.fromkeys(f.keys(), file))

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def get(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        with self._open(str(self.where[name]), framework="pt") as f:
            tensor: torch.Tensor = f.get_tensor(name).to(dtype)
            return tensor


def _check_base_files(base: Path) -> None:
    if not (base / "config.json").is_file():
        raise VerifyError("base-missing", f"{base} has no config.json: --base takes the base "
                          "model's folder (config.json and *.safetensors), as the engine serves "
                          "it; download it first, e.g. huggingface-cli download MODEL --local-dir "
                          "DIR")
    if not any(base.glob("*.safetensors")):
        raise VerifyError("base-weights-missing", f"{base} has no *.safetensors weights: verify "
                          "runs the base's modules and needs its weights (.bin checkpoints: "
                          "convert them to safetensors first)")


# --- CPU set-up shared by both engines ----------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cpu_shims() -> None:
    """What the engines' LoRA modules need on a CPU, and nothing on a GPU machine.

    sglang pins small host tensors (``pin_memory=True``, ``.pin_memory()``), which torch refuses
    without an accelerator: the flag is dropped (pinning changes where a host tensor lives,
    never its values). sglang imports ``torchvision.transforms.InterpolationMode`` at module
    level: where torchvision is absent, a stand-in with that enum only is registered, after
    transformers has recorded torchvision as absent.
    """
    if torch.cuda.is_available():
        return
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    if importlib.util.find_spec("torchvision") is None and "torchvision" not in sys.modules:
        from transformers.utils import import_utils

        import_utils.is_torchvision_available()
        vision = types.ModuleType("torchvision")
        transforms = types.ModuleType("torchvision.transforms")

        functional = types.ModuleType("torchvision.transforms.functional")

        class InterpolationMode(enum.Enum):
            NEAREST = "nearest"
            NEAREST_EXACT = "nearest-exact"
            BILINEAR = "bilinear"
            BICUBIC = "bicubic"
            BOX = "box"
            HAMMING = "hamming"
            LANCZOS = "lanczos"

        functional.InterpolationMode = InterpolationMode  # type: ignore[attr-defined]
        transforms.InterpolationMode = InterpolationMode  # type: ignore[attr-defined]
        transforms.functional = functional  # type: ignore[attr-defined]
        vision.transforms = transforms  # type: ignore[attr-defined]
        vision.__version__ = "0.0.0+lora-guard-stand-in"  # type: ignore[attr-defined]
        for module in (vision, transforms):
            module.__path__ = []  # a package
        sys.modules.update({"torchvision": vision, "torchvision.transforms": transforms,
                            "torchvision.transforms.functional": functional})
    if getattr(torch, "_lora_guard_tier_no_pin", False):
        return

    def no_pin(factory: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(factory)
        def make(*args: Any, **kwargs: Any) -> Any:
            kwargs.pop("pin_memory", None)
            return factory(*args, **kwargs)
        return make

    for name in ("tensor", "arange", "zeros", "empty", "ones", "full"):
        setattr(torch, name, no_pin(getattr(torch, name)))
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    torch._lora_guard_tier_no_pin = True  # type: ignore[attr-defined]


@dataclass
class EngineModule:
    name: str
    kind: str  # "linear", "embedding", "lm_head"
    parts: tuple[tuple[str, int], ...]
    """PEFT's modules in the engine module's output, in order, with their output sizes."""
    module: Any


def _release(module: Any) -> None:
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
        _cpu_shims()
        import sglang
        from sglang.srt.configs.load_config import LoadConfig
        from sglang.srt.distributed import parallel_state
        from sglang.srt.runtime_context import get_parallel
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
        get_parallel().override_permanently(
            tp_rank=0, pp_rank=0, attn_cp_rank=0, moe_dp_rank=0, moe_ep_rank=0, moe_tp_rank=0,
            attn_tp_rank=0, attn_dp_rank=0)
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.init_distributed_environment(
                world_size=1, rank=0, local_rank=0, backend="gloo",
                distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
            parallel_state.initialize_model_parallel(backend="gloo")
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
        _cpu_shims()
        from vllm.platforms import current_platform

        # vLLM's CPU platform refuses to configure itself without its compiled kernels; the
        # LoRA path used here runs on torch ops (vllm/lora/ops/torch_ops).
        type(current_platform).check_and_update_config = classmethod(
            lambda cls, config: None)
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
                        distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
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


# --- PEFT, from the adapter's files, on a model without weights ------------------------------


class PeftReference:
    """PEFT's LoRA layers reloaded from the adapter's files (``PeftModel.from_pretrained``)
    over the base model built without its weights (allocated, never written: no memory is
    used until a module's weights are set). `materialise` sets one module's base weights from
    the base's files; `release` drops them again. ``model``: a PEFT model in memory instead
    (PEFT as trained), whose weights are all there."""

    def __init__(self, adapter: Path, config: Any, dtype: torch.dtype,
                 model: Any = None) -> None:
        self.adapter_config = json.loads(
            (adapter / "adapter_config.json").read_text(encoding="utf-8"))
        self.lazy = model is None
        self.from_adapter: set[str] = set()
        if model is None:
            from peft import PeftConfig, PeftModel
            from transformers import AutoModelForCausalLM

            with torch.device("meta"):
                base = AutoModelForCausalLM.from_config(config, dtype=dtype)  # type: ignore[no-untyped-call]
            base.to_empty(device="cpu")
            peft_config = PeftConfig.from_pretrained(str(adapter))
            if isinstance(getattr(peft_config, "init_lora_weights", True), str):
                # PiSSA, OLoRA, LoftQ: their init rewrites the base in training; what the
                # files hold is served on the base given, as PEFT loads them there
                peft_config.init_lora_weights = True
            model = PeftModel.from_pretrained(base, str(adapter), config=peft_config)
        self.model = model.eval()
        self.inner = model.get_base_model()
        if self.lazy:  # base parameters PEFT set from the adapter's files (bias="all", ...)
            from safetensors import safe_open

            params = {_base_key("", n).lstrip("."): p for n, p in
                      self.inner.named_parameters()}
            for file in adapter.glob("adapter_model.safetensors"):
                with safe_open(str(file), framework="pt") as f:
                    for k in f.keys():  # noqa: SIM118 - a safetensors file, no __iter__
                        key = k.removeprefix("base_model.model.")
                        param = params.get(key)
                        if param is not None and param.shape == f.get_slice(k).get_shape() \
                                and torch.equal(param.detach(), f.get_tensor(k).to(param.dtype)):
                            self.from_adapter.add(key)

    def module(self, name: str) -> Any:
        return self.inner.get_submodule(name)

    def out_size(self, name: str) -> int:
        module = self.module(name)
        base = getattr(module, "base_layer", module)
        return int(getattr(base, "out_features", 0) or getattr(base, "embedding_dim", 0))

    def _base_params(self, name: str) -> Iterator[tuple[str, Any]]:
        for pname, param in self.module(name).named_parameters():
            key = _base_key(name, pname)
            if key and key not in self.from_adapter:
                yield key, param

    def materialise(self, names: Sequence[str], weights: BaseWeights,
                    dtype: torch.dtype) -> list[tuple[str, torch.Tensor]]:
        """Set the base parameters of ``names`` from the base's files (where the adapter does
        not hold them); returns the base tensors read (for the engine)."""
        read: list[tuple[str, torch.Tensor]] = []
        for name in names:
            for key, param in self._base_params(name):
                if key not in weights:
                    continue
                tensor = weights.get(key, dtype)
                read.append((key, tensor))
                if self.lazy:  # the read tensor itself: the unwritten allocation is freed
                    param.data = tensor.to(param.dtype)
        return read

    def release(self, names: Sequence[str]) -> None:
        """Free the base weights `materialise` set (to nothing: freed memory reused for an
        unwritten placeholder would stay resident, module after module)."""
        if not self.lazy:
            return
        for name in names:
            for _, param in self._base_params(name):
                param.data = torch.empty(0, dtype=param.dtype)

    def run(self, name: str, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            out = self.module(name)(x)
        result: torch.Tensor = out[0] if isinstance(out, tuple) else out
        return result


def _base_key(module: str, pname: str) -> str:
    """The base checkpoint's name of a PEFT module's base parameter (``base_layer.weight`` ->
    ``module.weight``), or ``""`` for the adapter's own parameters."""
    if any(s in pname for s in ("lora_", "modules_to_save", "trainable_tokens")):
        return ""
    parts = [p for p in pname.split(".")
             if p not in ("base_layer", "original_module", "token_adapter")]
    return ".".join([module, *parts]) if module else ".".join(parts)


# --- the measurement --------------------------------------------------------------------------


def _inputs(kind: str, width: int, vocab: int, dtype: torch.dtype,
            tokens: Sequence[int]) -> torch.Tensor:
    generator = torch.Generator().manual_seed(_SEED)
    if kind == "embedding":
        picked = list(dict.fromkeys([*tokens, *torch.randint(
            0, vocab, (_TOKENS,), generator=generator).tolist()]))
        return torch.tensor([t for t in picked if 0 <= t < vocab], dtype=torch.long)
    return torch.randn(_TOKENS, width, generator=generator).to(dtype)


def _in_width(module: EngineModule, config: Any) -> int:
    base = getattr(module.module, "base_layer", module.module)
    for attr in ("input_size", "in_features", "embedding_dim"):
        value = getattr(base, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return int(config.hidden_size)


def _key_names(module: EngineModule, peft: PeftReference) -> list[str]:
    names = [p for p, _ in module.parts]
    if module.kind == "lm_head" and getattr(peft.inner.config, "tie_word_embeddings", False):
        names.append(names[0].replace("lm_head", "model.embed_tokens"))
    return names


def measure(engine: Any, peft: PeftReference, weights: BaseWeights, config: Any, *,
            dtype: torch.dtype, tokens: Sequence[int] = (),
            references: Sequence[tuple[str, PeftReference]] = (),
            progress: Callable[[int, int, str], None] | None = None,
            ) -> dict[str, list[ModuleResult]]:
    """Every engine module of ``engine`` against ``peft`` (and any other ``references``, e.g.
    PEFT as trained): ``{reference name: results}``, ``"files"`` for ``peft``."""
    everyone = [("files", peft), *references]
    adapter_config = peft.adapter_config
    modules = engine.modules(peft.out_size)
    found: dict[str, list[ModuleResult]] = {label: [] for label, _ in everyone}
    vocab = int(config.vocab_size)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    for count, module in enumerate(modules):
        if progress is not None:
            progress(count, len(modules), module.name)
        names = [p for p, _ in module.parts]
        read = peft.materialise(_key_names(module, peft), weights, dtype)
        for _, ref in references:
            ref.materialise(names, weights, dtype)
        engine.load(read)
        width = _in_width(module, config)
        x = _inputs(module.kind, width, vocab, dtype, tokens)
        for phase in PHASES:
            with torch.no_grad():
                served = engine.run(module, x, phase, True).float()
                plain = engine.run(module, x, phase, False).float()
            for label, ref in everyone:
                outputs = [ref.run(name, x).float() for name in names]
                trained = torch.cat(outputs, dim=-1) if len(outputs) > 1 else outputs[0]
                trained = trained[..., : served.shape[-1]]
                start = 0
                for (name, _), out in zip(module.parts, outputs, strict=True):
                    size = out.shape[-1]
                    cut = slice(start, start + size)
                    start += size
                    verdict, how = classify(served[..., cut], trained[..., cut],
                                            plain[..., cut], alternatives(adapter_config, name))
                    found[label].append(ModuleResult(
                        module=module.name, part=name, phase=phase, verdict=verdict, how=how,
                        effect=float((trained[..., cut] - plain[..., cut]).abs().max()),
                        diff=float((served[..., cut] - trained[..., cut]).abs().max())))
        if not (module.kind == "embedding" and tied):  # a tied lm_head reads it again
            _release(module.module)
        peft.release(_key_names(module, peft))
    if progress is not None:
        progress(len(modules), len(modules), "")
    return found


def alternatives(adapter_config: dict[str, Any], part: str) -> dict[str, float]:
    """The strengths, relative to PEFT's, that an engine serving ``part`` by another rule would
    apply: rsLoRA read as plain LoRA, ``alpha_pattern`` or ``rank_pattern`` not read."""
    def pick(pattern: dict[str, Any], default: float) -> float:
        for key, value in (pattern or {}).items():
            if part == key or part.endswith("." + key) or part.split(".")[-1] == key:
                return float(value)
        return default

    r = pick(adapter_config.get("rank_pattern") or {}, float(adapter_config.get("r") or 8))
    alpha = pick(adapter_config.get("alpha_pattern") or {},
                 float(adapter_config.get("lora_alpha") or 8))
    rs = bool(adapter_config.get("use_rslora"))

    def strength(r_: float, alpha_: float, rs_: bool) -> float:
        return alpha_ / (math.sqrt(r_) if rs_ else r_)

    peft = strength(r, alpha, rs)
    out = {}
    if rs:
        out["rsLoRA ignored (alpha/r)"] = strength(r, alpha, False) / peft
    base_r = float(adapter_config.get("r") or 8)
    base_alpha = float(adapter_config.get("lora_alpha") or 8)
    if alpha != base_alpha:
        out["alpha_pattern ignored"] = strength(r, base_alpha, rs) / peft
    if r != base_r:
        out["rank_pattern ignored (alpha/r of the config's r)"] = strength(base_r, alpha,
                                                                          rs) / peft
    return out


_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
"""``--max-lora-rank`` values vLLM takes (sglang takes any)."""


def _max_rank(adapter: Path) -> int:
    """The server's max rank for this adapter alone: its largest rank, rounded up to a value
    vLLM takes (the rank is not what verify tests: the checker does that)."""
    config = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    largest = max([int(config.get("r") or 8), *(int(r) for r in
                                                (config.get("rank_pattern") or {}).values())])
    return next((r for r in _RANKS if r >= largest), largest)


_ENGINE_CLASSES: dict[str, Callable[..., Any]] = {"sglang": SglangEngine, "vllm": VllmEngine}


def check_can_run(adapter: Path, engine: str, base: Path) -> Any:
    """Refuse early, before anything heavy is imported: a missing adapter, base or engine."""
    if engine not in ENGINES:
        raise VerifyError("engine-unknown", f"--engine takes one of {', '.join(ENGINES)}, "
                          f"not {engine!r}")
    if not (adapter / "adapter_config.json").is_file():
        raise VerifyError("adapter-missing", f"{adapter} has no adapter_config.json: give the "
                          "adapter's folder (PEFT's save_pretrained output)")
    _check_base_files(base)
    for needed in ("peft", "transformers", "safetensors", engine):
        if importlib.util.find_spec(needed) is None:
            extra = (f"pip install {engine} (the release you serve)" if needed == engine
                     else f"pip install {needed}")
            raise VerifyError("engine-missing" if needed == engine else "peft-missing",
                              f"verify runs {engine}'s own LoRA layers and PEFT's, and "
                              f"{needed} is not installed in this environment: {extra}, or run "
                              "verify where the server runs")
    validated = VALIDATED_RELEASES[engine]
    if validated is not None and _version(engine) not in validated:
        raise VerifyError("engine-release-unverified",
                          f"verify drives {engine}'s LoRA layers the way {engine} "
                          f"{', '.join(validated)} runs them and has not been measured on "
                          f"{engine} {_version(engine)}: run it in an environment with "
                          f"{engine}=={validated[-1]}, or check the adapter with "
                          f"lora-guard check --engine {engine}=={_version(engine)}")
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(base))


def verify(adapter: Path, *, engine: str, base: Path, dtype: torch.dtype = torch.float32,
           progress: Callable[[int, int, str], None] | None = None) -> Report:
    """Run ``engine``'s own LoRA layers with ``adapter`` on ``base`` and PEFT's, module by
    module (see the module docstring); raises `VerifyError` when it cannot run."""
    config = check_can_run(adapter, engine, base)
    torch.manual_seed(_SEED)
    # PEFT's model first: built on the meta device, which the engines' CPU shims (tensor
    # factories without pin_memory) would turn into a full allocation of the base
    peft: PeftReference | None = None
    unloadable = ""
    try:
        peft = PeftReference(adapter, config, dtype)
    except Exception as exc:  # PEFT itself cannot load these files on this base
        unloadable = f"{type(exc).__name__}: {exc}"
    try:
        served = _ENGINE_CLASSES[engine](base, config, adapter, max_rank=_max_rank(adapter),
                                         dtype=dtype)
    except Refused as exc:  # the engine's own refusal of the adapter
        return Report(engine, _version(engine), str(adapter), (), str(exc))
    except Exception as exc:  # the engine cannot build this base on the CPU
        raise VerifyError("engine-setup", f"{engine} {_version(engine)} could not build "
                          f"{', '.join(getattr(config, 'architectures', None) or ['the base'])}"
                          f" on the CPU ({type(exc).__name__}: {exc}); verify supports the "
                          "architectures both the engine and transformers implement (Llama, "
                          "Qwen2, Mistral, ...): run it on a GPU server's environment, or "
                          "report the base") from exc
    if peft is None:
        return Report(engine, served.version, str(adapter), (), unloadable=unloadable)
    found = measure(served, peft, BaseWeights(base), config, dtype=dtype,
                    tokens=_adapter_tokens(adapter), progress=progress)
    return Report(engine, served.version, str(adapter), tuple(found["files"]))


def _version(engine: str) -> str:
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        return version(engine)
    return "?"


def _adapter_tokens(adapter: Path) -> list[int]:
    """Token ids the adapter trains (trainable tokens), to be among the embedding's inputs."""
    config = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    indices = config.get("trainable_token_indices") or []
    if isinstance(indices, dict):
        return sorted({int(i) for v in indices.values() for i in v})
    return [int(i) for i in indices]


# --- the command ------------------------------------------------------------------------------


def summarise(report: Report) -> list[str]:
    """The report as lines: one per module that is not as trained, then the verdict."""
    lines = [f"lora-guard verify: {report.adapter} on {report.engine} {report.version}"]
    if report.refused:
        lines.append(f"  the engine refuses to load it: {report.refused}")
        lines.append("verdict: refused (the engine does not serve it)")
        return lines
    if report.unloadable:
        lines.append(f"  PEFT cannot load its files on this base: {report.unloadable}")
        lines.append("verdict: unloadable (nothing to compare the engine with)")
        return lines
    off: dict[str, list[ModuleResult]] = {}
    for r in report.results:
        if r.verdict != "as trained":
            off.setdefault(r.part, []).append(r)
    for part, found in off.items():  # the first phase speaks for both when they agree
        phases = ", ".join(sorted({r.phase for r in found}))
        how = f": {found[0].how}" if found[0].how else ""
        lines.append(f"  {part:<48} {found[0].verdict}{how} ({phases})")
    good = len({r.part for r in report.results if r.verdict == "as trained"} -
               {r.part for r in report.results if r.verdict != "as trained"})
    total = len({r.part for r in report.results})
    lines.append(f"verdict: {report.verdict} ({good} of {total} modules as trained, prefill "
                 f"and decode; tolerance {TOLERANCE:g} of the adapter's effect)")
    return lines


def _bar(stream: TextIO) -> Callable[[int, int, str], None]:
    start = time.monotonic()
    tty = stream.isatty()

    def show(done: int, total: int, name: str) -> None:
        if not tty and done not in (0, total):
            return
        filled = int(30 * done / max(total, 1))
        text = (f"\r[{'#' * filled}{'.' * (30 - filled)}] {done}/{total} modules "
                f"{time.monotonic() - start:5.1f}s {name[:40]:<40}")
        stream.write(text if tty else text.strip("\r") + "\n")
        if done == total and tty:
            stream.write("\n")
        stream.flush()
    return show


def run(adapter: str, *, engine: str, base: str, out: TextIO, err: TextIO,
        progress: bool = True, as_json: bool = False) -> int:
    """``lora-guard verify``: 0 as trained, 1 differs/base/refused; `VerifyError` -> exit 2."""
    report = verify(Path(adapter), engine=engine, base=Path(base),
                    progress=_bar(err) if progress else None)
    if as_json:
        out.write(json.dumps({
            "adapter": report.adapter, "engine": report.engine, "version": report.version,
            "verdict": report.verdict, "refused": report.refused, "tolerance": TOLERANCE,
            "unloadable": report.unloadable,
            "modules": [dataclasses.asdict(r) for r in report.results]}, indent=1) + "\n")
    else:
        out.write("\n".join(summarise(report)) + "\n")
    return 0 if report.verdict == "as trained" else 1
