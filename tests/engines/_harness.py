"""The real vLLM 0.34.0 and sglang 0.5.23 LoRA modules, set up on a CPU as a server sets them up.

Each engine is prepared once per process (its import, its global server arguments, a gloo
process group of one), then every test builds a fresh server over a fresh tiny model:

- `sglang_server` is a real ``LoRAManager`` over sglang's own ``LlamaForCausalLM`` (hidden
  64, 2 layers), built exactly as ``ModelRunner`` builds it: ``--max-lora-rank``,
  ``--lora-target-modules``, ``--max-loras-per-batch`` and ``--lora-paths`` (start-up
  adapters, loaded inside ``LoRAManager.__init__``).
- `vllm_server` is a real ``LRUCacheWorkerLoRAManager`` with its ``LRUCacheLoRAModelManager``
  over vLLM's own ``LlamaForCausalLM``, as the GPU worker creates it (``--max-lora-rank``,
  ``--max-loras``, ``--max-cpu-loras``).

What a CPU needs and a GPU server does not, and nothing else:

- sglang's LoRA layers allocate small offset tensors with ``pin_memory=True`` (or call
  ``.pin_memory()``), which torch refuses without an accelerator, and sglang imports torchvision
  at module level: ``lora-guard verify``'s own CPU shims (`lora_guard._frontends._verify_cpu`:
  pin_memory dropped, a torchvision stand-in) are used, one copy;
- vLLM's CPU platform refuses to configure itself without triton-cpu (its compiled kernels):
  the platform's ``check_and_update_config`` is skipped; the LoRA code never reaches a kernel
  here (the tier loads, validates, activates and swaps adapters, it does not run forwards).

Adapters are real PEFT adapters, made with `peft_adapter` from tiny transformers configs.
"""

from __future__ import annotations

import functools
import json
import sys
import tempfile
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from lora_guard._frontends._verify_cpu import (
    cpu_shims,
    free_port,
    sglang_one_process,
    vllm_cpu_platform,
)

HERE = Path(__file__).resolve().parent
VOCAB = 128


def llama_config(**overrides: Any) -> Any:
    """The tiny base every server of the tier serves (and every adapter is trained on)."""
    from transformers import LlamaConfig

    values: dict[str, Any] = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2,
                                  vocab_size=VOCAB, tie_word_embeddings=False)
    values.update(overrides)
    return LlamaConfig(**values)


# --- real PEFT adapters -------------------------------------------------------------------------

def peft_adapter(path: Path, *, base: Any = None, task_type: str | None = None,
                 seed: int = 0, keep: dict[str, Any] | None = None, **lora: Any) -> Path:
    """A real PEFT adapter: ``get_peft_model(tiny model, LoraConfig(**lora)).save_pretrained``.

    ``base`` is the transformers config it is trained on (`llama_config` by default);
    ``task_type="SEQ_CLS"`` trains it on a sequence classifier (PEFT saves ``score``).
    Every tensor the adapter trains is trained (moved off its initial value): lora_B, the
    embedding LoRA's A and B, saved module copies, trainable token deltas, trained biases.
    ``keep`` receives the trained ``model`` and the ``base`` folder (the base's weights as
    served, saved before PEFT touched them), for measuring what an engine computes.
    """
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    torch.manual_seed(seed)
    config = base if base is not None else llama_config()
    if task_type == "SEQ_CLS":
        config.num_labels = 2
        model: Any = AutoModelForSequenceClassification.from_config(config)
    else:
        model = AutoModelForCausalLM.from_config(config)
    if keep is not None:
        keep["base"] = path.parent / f"{path.name}-base"
        model.save_pretrained(str(keep["base"]))
    lora.setdefault("target_modules", ["q_proj", "v_proj"])
    lora.setdefault("r", 8)
    if task_type is not None:
        lora["task_type"] = task_type
    peft_model = get_peft_model(model, LoraConfig(**lora))
    with torch.no_grad():  # a trained adapter: B is not zero, nor are its other trained parts
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name or "lora_embedding_" in name:
                parameter.normal_(std=0.02)
            elif parameter.requires_grad and "lora_A" not in name:  # copies, deltas, biases
                parameter.add_(torch.randn_like(parameter), alpha=0.02)
    peft_model.save_pretrained(str(path))
    if keep is not None:
        keep["model"] = peft_model
    return path


def edit_weights(path: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    """Rewrite an adapter's weights as the field breaks them (a key dropped, a tensor emptied)."""
    from safetensors.torch import load_file, save_file

    file = path / "adapter_model.safetensors"
    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file))
    return path


DROP = object()
"""An `edit_config` value that removes the field."""


def edit_config(path: Path, **changes: Any) -> Path:
    """Rewrite fields of an adapter's ``adapter_config.json`` (`DROP` removes one)."""
    file = path / "adapter_config.json"
    config = json.loads(file.read_text())
    config.update({k: v for k, v in changes.items() if v is not DROP})
    for key in [k for k, v in changes.items() if v is DROP]:
        config.pop(key, None)
    file.write_text(json.dumps(config))
    return path


# --- process-wide set-up -------------------------------------------------------------------------

def _alone(engine: str, other: str) -> None:
    """The two engines set process-wide state (platform, attention backends, process groups)
    that the other one then misreads: the tier runs each engine's tests in its own process
    (``-n 2 --dist loadgroup``, the modules' ``xdist_group``)."""
    if any(name == other or name.startswith(other + ".") for name in sys.modules):
        raise RuntimeError(
            f"{other} is already imported in this process; run the engine tier as documented "
            f"(python -m pytest tests/engines -n 2 --dist loadgroup) so {engine} gets a "
            "process of its own")


def cpu_imports() -> None:
    """What both engines' LoRA modules need to import on a CPU: ``lora-guard verify``'s own
    shims (the torchvision stand-in, pin_memory dropped, vLLM's CPU platform), one copy."""
    cpu_shims()


def skip_if_transformers_needs_torchvision() -> None:
    """sglang 0.5.16 to 0.5.19 pin transformers 5.12.1, whose ``AutoImageProcessor`` requires
    torchvision; sglang's configs register image processors with it at import
    (``sglang/srt/configs/utils.py:register_image_processor``). The torchvision wheels do not
    import beside the tier's CPU torch, and the stand-in (`lora_guard._frontends._verify_cpu`)
    is hidden from transformers on purpose: shown to it, transformers imports torchvision's
    image API (``torchvision.io.ImageReadMode``, ``decode_image``, ``transforms.v2``), which
    only the real package has. Those releases' tests skip, naming this."""
    import pytest
    from transformers.models.auto import image_processing_auto

    try:
        image_processing_auto.AutoImageProcessor.register  # noqa: B018 - the backend check
    except ImportError as exc:
        import transformers

        pytest.skip(f"transformers {transformers.__version__} (sglang's pin) requires "
                    f"torchvision for AutoImageProcessor, which sglang's configs use at "
                    "import; torchvision does not install beside the CPU torch "
                    f"({str(exc).strip().splitlines()[0]})")


@functools.cache
def sglang_env() -> types.SimpleNamespace:
    """sglang's LoRA modules, imported and configured for a CPU scheduler process."""
    _alone("sglang", "vllm")
    cpu_imports()
    skip_if_transformers_needs_torchvision()
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    base = Path(tempfile.mkdtemp(prefix="lora-guard-sglang-base-"))
    config = llama_config()
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(str(base))  # the model's config only: no weights are read
    args = ServerArgs(model_path=str(base), device="cpu", enable_lora=True,
                      max_lora_rank=16, lora_target_modules=["q_proj", "v_proj"])
    set_global_server_args_for_scheduler(args)
    sglang_one_process()
    import sglang
    from sglang.srt.lora import layers, lora_manager, lora_registry, mem_pool
    from sglang.srt.models import llama

    return types.SimpleNamespace(
        version=sglang.__version__, args=args, LoadConfig=LoadConfig,
        manager=lora_manager, pool=mem_pool, layers=layers, registry=lora_registry,
        Llama=llama.LlamaForCausalLM)


def sglang_ref(name: str, path: Path | str, *, pinned: bool = False) -> Any:
    """The ``LoRARef`` the tokenizer manager hands the scheduler for ``--lora-paths`` / a load."""
    env = sglang_env()
    return env.registry.LoRARef(lora_id=name, lora_name=name, lora_path=str(path),
                                pinned=pinned)


def sglang_server(*, max_lora_rank: int | None = 16,
                  target_modules: set[str] | None = None,
                  lora_paths: list[Any] | None = None, max_loras_per_batch: int = 2,
                  base: Any = None, dtype: torch.dtype = torch.float32) -> Any:
    """A real sglang ``LoRAManager`` over a fresh tiny Llama, as ``ModelRunner`` builds it."""
    env = sglang_env()
    config = base if base is not None else llama_config()
    model = env.Llama(config, quant_config=None)
    if target_modules is None and lora_paths is None:
        target_modules = {"q_proj", "v_proj"}
    return env.manager.LoRAManager(
        model, config, max_loras_per_batch=max_loras_per_batch, load_config=env.LoadConfig(),
        dtype=dtype, server_args=env.args, lora_backend="torch_native",
        max_lora_rank=max_lora_rank, target_modules=target_modules, lora_paths=lora_paths)


def pool_snapshot(manager: Any) -> dict[str, torch.Tensor]:
    """Every buffer of a sglang memory pool, copied (to compare bitwise later)."""
    pool = manager.memory_pool
    out: dict[str, torch.Tensor] = {}
    for kind, buffers in (("A", pool.A_buffer), ("B", pool.B_buffer)):
        for module, per_layer in buffers.items():
            for layer, tensor in enumerate(per_layer):
                out[f"{kind}:{module}:{layer}"] = tensor.detach().clone()
    return out


@functools.cache
def vllm_env() -> types.SimpleNamespace:
    """vLLM's LoRA modules, imported and configured for a CPU worker process."""
    _alone("vllm", "sglang")
    cpu_imports()
    vllm_cpu_platform()
    import vllm
    from vllm.config import (
        DeviceConfig,
        LoRAConfig,
        ModelConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.lora import lora_model, model_manager, peft_helper, worker_manager
    from vllm.lora.request import LoRARequest

    return types.SimpleNamespace(
        version=vllm.__version__, DeviceConfig=DeviceConfig, LoRAConfig=LoRAConfig,
        ModelConfig=ModelConfig, VllmConfig=VllmConfig, current=set_current_vllm_config,
        lora_model=lora_model, model_manager=model_manager, peft_helper=peft_helper,
        worker_manager=worker_manager, LoRARequest=LoRARequest)


def vllm_base_dir(root: Path, base: Any = None) -> Path:
    """The base model's folder as vLLM reads it (``config.json`` only: no weights needed)."""
    folder = root / "vllm-base"
    if not (folder / "config.json").exists():
        config = base if base is not None else llama_config()
        config.architectures = ["LlamaForCausalLM"]
        config.save_pretrained(str(folder))
    return folder


_VLLM_DIST: list[bool] = []


def vllm_server(base_dir: Path, *, max_lora_rank: int = 16, max_loras: int = 2,
                max_cpu_loras: int | None = None, dtype: str = "float32",
                model_class: Any = None) -> Any:
    """A real vLLM ``LRUCacheWorkerLoRAManager`` (and its model manager) over a tiny Llama
    (or ``model_class``, vLLM's own class of the base's architecture, built from
    ``base_dir``'s config); ``dtype`` is the model's (``--dtype``), and ``--lora-dtype`` is
    auto (the model's)."""
    env = vllm_env()
    lora_config = env.LoRAConfig(max_lora_rank=max_lora_rank, max_loras=max_loras,
                                 max_cpu_loras=max_cpu_loras, lora_dtype=getattr(torch, dtype))
    model_config = env.ModelConfig(model=str(base_dir), tokenizer=None,
                                   skip_tokenizer_init=True, dtype=dtype)
    config = env.VllmConfig(model_config=model_config, lora_config=lora_config,
                            device_config=env.DeviceConfig(device="cpu"))
    with env.current(config):
        if not _VLLM_DIST:
            from vllm.distributed import (
                ensure_model_parallel_initialized,
                init_distributed_environment,
            )
            init_distributed_environment(
                world_size=1, rank=0, local_rank=0, backend="gloo",
                distributed_init_method=f"tcp://127.0.0.1:{free_port()}")
            ensure_model_parallel_initialized(1, 1)
            _VLLM_DIST.append(True)
        from vllm.model_executor.models.llama import LlamaForCausalLM

        _needs_compiled_cpu_ops(env.version)
        model = (model_class or LlamaForCausalLM)(vllm_config=config)
        worker = env.worker_manager.LRUCacheWorkerLoRAManager(
            config, torch.device("cpu"), getattr(model, "embedding_modules", {}))
        worker.create_lora_manager(model, config)
    worker.vllm_config = config
    return worker


def _needs_compiled_cpu_ops(version: str) -> None:
    """vLLM 0.29 and 0.30 cannot build a Llama here: on the CPU platform ``SiluAndMul.__init__``
    looks up ``torch.ops._C.silu_and_mul`` (``model_executor/layers/activation.py``), which
    only vLLM's CPU build compiles; the PyPI wheel is the CUDA build, whose ``_C`` does not
    load without CUDA. vLLM's CustomOp switch (``custom_ops=["-silu_and_mul"]``) picks
    ``forward_native`` at dispatch, after ``__init__`` has already failed, so it cannot help.
    From 0.31 the lookup is made on POWERPC CPUs only. A test that needs a model skips there,
    naming this; the tests that need none (hooks, fingerprints, the loader's own checks) run."""
    import pytest

    from lora_guard._checking.engines import version_key

    if version_key(version) >= (0, 31) or hasattr(torch.ops._C, "silu_and_mul"):
        return
    pytest.skip(f"vLLM {version} on the CPU platform needs its CPU build's compiled "
                "torch.ops._C.silu_and_mul to build any model (SiluAndMul.__init__, "
                "activation.py); the PyPI wheel is the CUDA build")


def vllm_checkpoint_load(worker: Any, path: Path | str) -> Any:
    """A call that loads the adapter at ``path`` as ``worker`` loads one (its ``PEFTHelper``
    read and validated, then ``LoRAModel.from_local_checkpoint`` with the worker's modules,
    weights mapper and limits), for the benchmarks' load rows."""
    env = vllm_env()
    manager, lora_config, model = worker._adapter_manager, worker.lora_config, \
        worker._adapter_manager.model
    expected: set[str] = set()
    for module in manager.supported_lora_modules:
        expected.update(manager.packed_modules_mapping.get(module, [module]))
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    mapper = mapper.get_rename_mapper() if mapper is not None else None
    path = str(path)

    def load() -> Any:
        helper = env.peft_helper.PEFTHelper.from_local_dir(path, worker.max_position_embeddings)
        helper.validate_legal(lora_config)
        return env.lora_model.LoRAModel.from_local_checkpoint(
            path, expected, peft_helper=helper, lora_model_id=99, device="cpu",
            dtype=lora_config.lora_dtype, model_vocab_size=worker.vocab_size,
            weights_mapper=mapper, skip_prefixes=getattr(model, "lora_skip_prefixes", None),
            moe_ep_spec=manager.moe_ep_load_spec,
            unsupported_lora_modules=manager.unsupported_lora_modules)
    return load


def vllm_request(name: str, lora_id: int, path: Path | str) -> Any:
    """The ``LoRARequest`` a vLLM client sends (``--lora-modules name=path``)."""
    return vllm_env().LoRARequest(name, lora_id, str(path))
