"""What the engines' LoRA modules need on a CPU, and nothing on a GPU machine: shared by
``lora-guard verify`` and the engine tier (tests/engines/_harness.py imports it), one copy."""

from __future__ import annotations

import enum
import functools
import importlib.machinery
import importlib.util
import os
import socket
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["cpu_shims", "drop_pin_memory", "free_port", "sglang_one_process",
           "torchvision_stand_in", "vllm_cpu_platform"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_shims() -> None:
    """What the engines' LoRA modules need on a CPU, and nothing on a GPU machine.

    sglang pins small host tensors (``pin_memory=True``, ``.pin_memory()``), which torch refuses
    without an accelerator: the flag is dropped (pinning changes where a host tensor lives,
    never its values or shape). vLLM's platform is set to the CPU. sglang imports torchvision at
    module level (``transforms.InterpolationMode``; ``io.decode_jpeg`` in 0.5.16 to 0.5.20,
    ``sglang/srt/utils/common.py``), and the torchvision wheels would pull a CUDA torch: where
    torchvision is absent, `torchvision_stand_in` is registered.
    """
    if torch.cuda.is_available():
        return
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    torchvision_stand_in()
    drop_pin_memory()


def torchvision_stand_in() -> None:
    """Where torchvision is not installed: a stand-in with the names sglang imports at module
    level (``InterpolationMode``, ``decode_jpeg``), registered after transformers has recorded
    torchvision as absent (so transformers never takes it for the real one). Nothing in the
    LoRA code calls it; ``decode_jpeg`` says so if anything does."""
    # sys.modules first: find_spec raises ValueError on a registered module without __spec__
    # (another stand-in; this one has a spec, so importlib finds it like a package)
    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is not None:
        return
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()  # cached as False before the stand-in appears
    vision = types.ModuleType("torchvision")
    transforms = types.ModuleType("torchvision.transforms")
    functional = types.ModuleType("torchvision.transforms.functional")
    io = types.ModuleType("torchvision.io")

    class InterpolationMode(enum.Enum):
        NEAREST = "nearest"
        NEAREST_EXACT = "nearest-exact"
        BILINEAR = "bilinear"
        BICUBIC = "bicubic"
        BOX = "box"
        HAMMING = "hamming"
        LANCZOS = "lanczos"

    def decode_jpeg(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("lora_guard's torchvision stand-in decodes no images: "
                                  "install torchvision to serve images")

    functional.InterpolationMode = InterpolationMode  # type: ignore[attr-defined]
    transforms.InterpolationMode = InterpolationMode  # type: ignore[attr-defined]
    transforms.functional = functional  # type: ignore[attr-defined]
    io.decode_jpeg = decode_jpeg  # type: ignore[attr-defined]
    vision.transforms = transforms  # type: ignore[attr-defined]
    vision.io = io  # type: ignore[attr-defined]
    vision.__version__ = "0.0.0+lora-guard-stand-in"  # type: ignore[attr-defined]
    for module in (vision, transforms, functional, io):  # found by importlib like a package
        package = module in (vision, transforms)
        module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None,
                                                         is_package=package)
        if package:
            module.__path__ = []
    sys.modules.update({"torchvision": vision, "torchvision.transforms": transforms,
                        "torchvision.transforms.functional": functional, "torchvision.io": io})


def drop_pin_memory() -> None:
    """Tensor factories without ``pin_memory`` and ``Tensor.pin_memory`` the identity, once."""
    if getattr(torch, "_lora_guard_tier_no_pin", False) or torch.cuda.is_available():
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


def sglang_one_process() -> None:
    """sglang's parallel state for one CPU process, as a scheduler of ``--tp-size 1`` has it:
    every parallel rank 0, a gloo group of one (set up once per process)."""
    from sglang.srt.distributed import parallel_state
    from sglang.srt.runtime_context import get_parallel

    get_parallel().override_permanently(
        tp_rank=0, pp_rank=0, attn_cp_rank=0, moe_dp_rank=0, moe_ep_rank=0, moe_tp_rank=0,
        attn_tp_rank=0, attn_dp_rank=0)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.init_distributed_environment(
            world_size=1, rank=0, local_rank=0, backend="gloo",
            distributed_init_method=f"tcp://127.0.0.1:{free_port()}")
        parallel_state.initialize_model_parallel(backend="gloo")


def vllm_cpu_platform() -> None:
    """vLLM's CPU platform, configured without its compiled kernels, which it otherwise
    refuses to do; the LoRA path used here runs on torch ops (``vllm/lora/ops/torch_ops``)."""
    from vllm.platforms import current_platform

    type(current_platform).check_and_update_config = classmethod(
        lambda cls, config: None)
