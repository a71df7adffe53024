"""What ``lora-guard verify`` compares the engine with: PEFT's own LoRA layers reloaded from the
adapter's files (`PeftReference`), over the base's weights read lazily (`BaseWeights`)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = ["BaseWeights", "PeftReference"]


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
