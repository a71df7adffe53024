"""Write real PEFT-format adapter folders for tests, examples and benchmarks, without torch.

`write_adapter` writes ``adapter_config.json`` with the fields PEFT 0.21 writes and an
``adapter_model.safetensors`` with PEFT's key grammar and shapes (zero-filled data), for a
Llama-like base model, optionally with MoE expert weights in one of four layouts and with
deliberate defects that `lora_guard.check_adapters` reports (see `DEFECTS`).
"""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import re
import struct
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from lora_guard._reading.safetensors import encode_header, safetensors_code, write_safetensors

__all__ = ["ATTENTION_TARGETS", "DEFECTS", "MLP_TARGETS", "write_adapter"]

DEFECTS: Mapping[str, str] = types.MappingProxyType({
    "orphan-a": "LG103",
    "orphan-b": "LG103",
    "rank-mismatch": "LG102",
    "config-rank": "LG102",
    "empty-tensor": "LG107",
    "mixed-dtype": "LG106",
    "bad-key": "LG104",
    "dora": "LG105",
    "lora-bias": "LG105",
    "modules-to-save": "LG105",
    "bias-all": "LG105",
    "trainable-tokens": "LG105",
    "layer-out-of-range": "LG109",
    "pickle-bin": "LG108",
    "missing-weights": "LG108",
    "missing-config": "LG108",
    "invalid-config-json": "LG108",
    "config-not-lora": "LG117",
    "truncated-header": "LG108",
    "oversized-header": "LG108",
    "invalid-header-json": "LG108",
    "duplicate-key": "LG108",
    "unknown-dtype": "LG108",
    "negative-shape": "LG108",
    "offsets-past-end": "LG108",
    "offsets-overlap": "LG108",
    "trailing-bytes": "LG108",
    "symlink-escape": "LG108",
})
"""Each defect `write_adapter(defects=...)` can write, and the code the checker reports for it.

Example:
    >>> from lora_guard.testing import DEFECTS
    >>> DEFECTS["orphan-b"], DEFECTS["pickle-bin"]
    ('LG103', 'LG108')
"""

ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
_EMBEDDINGS = ("embed_tokens", "lm_head")
_TARGETS = ATTENTION_TARGETS + MLP_TARGETS + _EMBEDDINGS
_MOE_LAYOUTS = ("per-expert", "packed", "shared-outer", "flat")
_DTYPES = ("float16", "bfloat16", "float32")
_PREFIX = "base_model.model."


def _peft_config(
    *,
    rank: int,
    alpha: float,
    target_modules: list[str],
    target_parameters: list[str] | None,
    rank_pattern: Mapping[str, int],
    base_model: str | None,
) -> dict[str, Any]:
    """adapter_config.json as PEFT 0.21 writes it for a LoraConfig of these values."""
    return {
        "alora_invocation_tokens": None,
        "alpha_pattern": {},
        "arrow_config": None,
        "auto_mapping": None,
        "base_model_name_or_path": base_model,
        "bias": "none",
        "corda_config": None,
        "ensure_weight_tying": False,
        "eva_config": None,
        "exclude_modules": None,
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "kasa_config": None,
        "layer_replication": None,
        "layers_pattern": None,
        "layers_to_transform": None,
        "loftq_config": {},
        "lora_alpha": alpha,
        "lora_bias": False,
        "lora_dropout": 0.0,
        "lora_ga_config": None,
        "megatron_config": None,
        "megatron_core": "megatron.core",
        "modules_to_save": None,
        "monteclora_config": None,
        "peft_type": "LORA",
        "peft_version": "0.21.2",
        "qalora_group_size": 16,
        "r": rank,
        "rank_pattern": dict(rank_pattern),
        "revision": None,
        "target_modules": target_modules,
        "target_parameters": target_parameters,
        "task_type": "CAUSAL_LM",
        "trainable_token_indices": None,
        "use_bdlora": None,
        "use_dora": False,
        "use_qalora": False,
        "use_rslora": False,
        "velora_config": None,
    }


def _positive(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"write_adapter({name}=...) must be a positive int, got {value!r}")
    return value


def _validate(
    *,
    rank: int,
    alpha: float | None,
    targets: Iterable[str],
    layers: int,
    hidden_size: int,
    intermediate_size: int,
    num_heads: int,
    num_kv_heads: int,
    vocab_size: int,
    dtype: str,
    moe_layout: str | None,
    experts: int,
    rank_pattern: Mapping[str, int] | None,
    config_overrides: Mapping[str, Any] | None,
    defects: Iterable[str],
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    for name, value in (
        ("rank", rank), ("layers", layers), ("hidden_size", hidden_size),
        ("intermediate_size", intermediate_size), ("num_heads", num_heads),
        ("num_kv_heads", num_kv_heads), ("vocab_size", vocab_size), ("experts", experts),
    ):
        _positive(name, value)
    _validate_heads(hidden_size, num_heads, num_kv_heads)
    if alpha is not None and (
        isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0
    ):
        raise ValueError(f"write_adapter(alpha=...) must be a positive number, got {alpha!r}")
    target_tuple = _validate_targets(targets)
    if dtype not in _DTYPES:
        raise ValueError(f"write_adapter(dtype=...) must be one of {_DTYPES}, got {dtype!r}")
    _validate_moe(moe_layout, target_tuple)
    _validate_rank_pattern(rank_pattern)
    if config_overrides is not None and not isinstance(config_overrides, Mapping):
        raise ValueError(
            "write_adapter(config_overrides=...) must be a mapping of adapter_config.json "
            f"fields, got {type(config_overrides).__name__}"
        )
    return target_tuple, _validate_defects(defects)


def _validate_heads(hidden_size: int, num_heads: int, num_kv_heads: int) -> None:
    if hidden_size % num_heads:
        raise ValueError(
            f"write_adapter: hidden_size {hidden_size} is not a multiple of num_heads "
            f"{num_heads}; pick sizes whose head_dim is whole (e.g. 64 and 4)"
        )
    if num_heads % num_kv_heads:
        raise ValueError(
            f"write_adapter: num_heads {num_heads} is not a multiple of num_kv_heads "
            f"{num_kv_heads}"
        )


def _validate_targets(targets: Iterable[str]) -> tuple[str, ...]:
    if isinstance(targets, str):
        raise ValueError(
            f"write_adapter(targets=...) takes a sequence of module names, got the string "
            f"{targets!r}; write targets=({targets!r},)"
        )
    target_tuple = tuple(targets)
    unknown = [t for t in target_tuple if t not in _TARGETS]
    if not target_tuple or unknown:
        raise ValueError(
            f"write_adapter(targets=...) got {list(target_tuple)}; each target must be one of "
            f"{', '.join(_TARGETS)}"
        )
    if len(set(target_tuple)) != len(target_tuple):
        raise ValueError(f"write_adapter(targets=...) repeats a module: {list(target_tuple)}")
    return target_tuple


def _validate_moe(moe_layout: str | None, target_tuple: tuple[str, ...]) -> None:
    if moe_layout is None:
        return
    if moe_layout not in _MOE_LAYOUTS:
        raise ValueError(
            f"write_adapter(moe_layout=...) must be None or one of {_MOE_LAYOUTS}, "
            f"got {moe_layout!r}"
        )
    if not any(t in MLP_TARGETS for t in target_tuple):
        raise ValueError(
            f"write_adapter(moe_layout={moe_layout!r}) needs an MLP target "
            f"({', '.join(MLP_TARGETS)}) in targets, got {list(target_tuple)}"
        )


def _validate_rank_pattern(rank_pattern: Mapping[str, int] | None) -> None:
    if rank_pattern is None:
        return
    if not isinstance(rank_pattern, Mapping):
        raise ValueError(
            "write_adapter(rank_pattern=...) must map a module-name regex to a rank, "
            f"got {type(rank_pattern).__name__}"
        )
    for key, value in rank_pattern.items():
        _positive(f"rank_pattern[{key!r}]", value)
        try:
            re.compile(key)
        except re.error as exc:
            raise ValueError(
                f"write_adapter(rank_pattern=...) key {key!r} is not a regex: {exc}"
            ) from None


def _validate_defects(defects: Iterable[str]) -> tuple[str, ...]:
    defect_tuple = (defects,) if isinstance(defects, str) else tuple(defects)
    unknown = [d for d in defect_tuple if d not in DEFECTS]
    if unknown:
        raise ValueError(
            f"write_adapter(defects=...) got unknown defect(s) {unknown}; known defects: "
            f"{', '.join(sorted(DEFECTS))}"
        )
    return defect_tuple


def _rank_for(name: str, rank: int, rank_pattern: Mapping[str, int]) -> int:
    """PEFT's first-match rule: ``re.match(rf"(.*\\.)?({key})$", name)``."""
    for key, value in rank_pattern.items():
        if re.match(rf"(.*\.)?({key})$", name):
            return value
    return rank


def write_adapter(
    path: str | os.PathLike[str],
    *,
    rank: int = 8,
    alpha: float | None = None,
    targets: Iterable[str] = ("q_proj", "v_proj"),
    layers: int = 2,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    vocab_size: int = 128,
    dtype: str = "float16",
    moe_layout: str | None = None,
    experts: int = 4,
    rank_pattern: Mapping[str, int] | None = None,
    base_model: str | None = "tiny-llama",
    config_overrides: Mapping[str, Any] | None = None,
    defects: Iterable[str] = (),
) -> pathlib.Path:
    """Write a real PEFT-format LoRA adapter folder (config + safetensors header, zero data).

    The folder holds ``adapter_config.json`` with the fields PEFT 0.21 writes and
    ``adapter_model.safetensors`` with PEFT's keys and shapes for a Llama-like base model of
    the given sizes (``head_dim = hidden_size // num_heads``), as
    ``get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets,
    rank_pattern=rank_pattern)).save_pretrained(path)`` would write them. No torch is needed
    and the tensor data is zeros, so an adapter costs kilobytes.

    Args:
        path: The folder to create (parents too); an existing folder is written into.
        rank: ``r``.
        alpha: ``lora_alpha`` (default: ``rank``).
        targets: Module names among q/k/v/o_proj, gate/up/down_proj, embed_tokens, lm_head.
        layers: The base model's ``num_hidden_layers``.
        hidden_size: The base model's hidden size.
        intermediate_size: The MLP's size (the experts' size when ``moe_layout`` is set).
        num_heads: Attention heads (``head_dim = hidden_size // num_heads``).
        num_kv_heads: Key/value heads.
        vocab_size: The vocabulary, for embedding and lm_head LoRA.
        dtype: ``"float16"``, ``"bfloat16"`` or ``"float32"``.
        moe_layout: None (dense), ``"per-expert"`` (``mlp.experts.<i>.gate_proj`` 2D),
            ``"packed"`` (``mlp.experts.gate_up_proj`` 3D, dim 0 = ``experts``),
            ``"shared-outer"`` (packed, outer weights with dim 0 = 1) or ``"flat"`` (PEFT
            ``target_parameters``: ``mlp.experts[.base_layer].lora_A.weight``, rank x experts).
        experts: Expert count for ``moe_layout``.
        rank_pattern: PEFT ``rank_pattern`` (module-name regex -> rank, first match wins).
        base_model: ``base_model_name_or_path``.
        config_overrides: Fields merged into ``adapter_config.json`` last.
        defects: Names from `DEFECTS`: deliberate problems the checker reports with the code
            `DEFECTS` gives. ``"symlink-escape"`` also writes a file next to the folder.

    Returns:
        The adapter folder.

    Example:
        >>> import json, tempfile, lora_guard as lg
        >>> from lora_guard.testing import write_adapter
        >>> folder = write_adapter(tempfile.mkdtemp() + "/a", rank=16, targets=("q_proj",))
        >>> json.loads((folder / "adapter_config.json").read_text())["r"]
        16
        >>> spec = lg.inspect_adapter(folder)
        >>> spec.rank, spec.modules["model.layers.0.self_attn.q_proj"].a_shape
        (16, (16, 64))
        >>> write_adapter(tempfile.mkdtemp(), defects=("typo",))
        Traceback (most recent call last):
        ...
        ValueError: write_adapter(defects=...) got unknown defect(s) ['typo']; known defects: ...
    """
    target_tuple, defect_tuple = _validate(
        rank=rank, alpha=alpha, targets=targets, layers=layers, hidden_size=hidden_size,
        intermediate_size=intermediate_size, num_heads=num_heads, num_kv_heads=num_kv_heads,
        vocab_size=vocab_size, dtype=dtype, moe_layout=moe_layout, experts=experts,
        rank_pattern=rank_pattern, config_overrides=config_overrides, defects=defects,
    )
    plan = _Plan(
        rank=rank, pattern=dict(rank_pattern or {}), targets=target_tuple, layers=layers,
        hidden_size=hidden_size, intermediate_size=intermediate_size, num_heads=num_heads,
        num_kv_heads=num_kv_heads, vocab_size=vocab_size, dtype=dtype, moe_layout=moe_layout,
        experts=experts,
    )
    tensors, target_parameters = plan.tensors()
    config = _peft_config(
        rank=rank, alpha=rank if alpha is None else alpha, target_modules=plan.target_modules(),
        target_parameters=None if target_parameters is None else sorted(target_parameters),
        rank_pattern=plan.pattern, base_model=base_model,
    )
    _apply_content_defects(defect_tuple, tensors, config, dtype=dtype, rank=rank,
                           layers=layers, hidden_size=hidden_size, vocab_size=vocab_size)
    if config_overrides:
        config.update(config_overrides)

    folder = pathlib.Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    _write_config(folder, config, defect_tuple)
    _write_weights(folder, tensors, defect_tuple)
    return folder


_Tensors = dict[str, tuple[str, tuple[int, ...]]]


@dataclass(frozen=True)
class _Plan:
    """The tensors and target modules of one adapter, from `write_adapter`'s arguments."""

    rank: int
    pattern: dict[str, int]
    targets: tuple[str, ...]
    layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    dtype: str
    moe_layout: str | None
    experts: int

    @property
    def moe_targets(self) -> list[str]:
        return [t for t in self.targets if t in MLP_TARGETS] if self.moe_layout else []

    def dims(self, target: str) -> tuple[int, int]:
        head_dim = self.hidden_size // self.num_heads
        hidden, inner = self.hidden_size, self.intermediate_size
        return {
            "q_proj": (hidden, self.num_heads * head_dim),
            "k_proj": (hidden, self.num_kv_heads * head_dim),
            "v_proj": (hidden, self.num_kv_heads * head_dim),
            "o_proj": (self.num_heads * head_dim, hidden),
            "gate_proj": (hidden, inner),
            "up_proj": (hidden, inner),
            "down_proj": (inner, hidden),
        }[target]

    def tensors(self) -> tuple[_Tensors, list[str] | None]:
        """Every tensor (name -> dtype, shape), and PEFT's ``target_parameters`` (flat MoE)."""
        tensors: _Tensors = {}
        target_parameters: list[str] | None = None
        for layer in range(self.layers):
            self._dense(tensors, layer)
            if self.moe_layout == "per-expert":
                self._per_expert(tensors, layer)
            elif self.moe_layout in ("packed", "shared-outer"):
                self._packed(tensors, layer)
            elif self.moe_layout == "flat":
                target_parameters = self._flat(tensors, layer)
        self._embeddings(tensors)
        return tensors, target_parameters

    def target_modules(self) -> list[str]:
        """``target_modules`` as PEFT saves it for this layout."""
        moe = self.moe_targets
        names = sorted(t for t in self.targets if t not in moe or self.moe_layout != "flat")
        if self.moe_layout not in ("packed", "shared-outer"):
            return names
        fused = {"gate_up_proj"} if {"gate_proj", "up_proj"} & set(moe) else set()
        return sorted({t for t in names if t not in ("gate_proj", "up_proj")} | fused)

    def _pair(self, tensors: _Tensors, module: str, rank: int, in_dim: int,
              out_dim: int) -> None:
        tensors[f"{_PREFIX}{module}.lora_A.weight"] = (self.dtype, (rank, in_dim))
        tensors[f"{_PREFIX}{module}.lora_B.weight"] = (self.dtype, (out_dim, rank))

    def _dense(self, tensors: _Tensors, layer: int) -> None:
        moe = self.moe_targets
        for target in self.targets:
            if target in _EMBEDDINGS or target in moe:
                continue
            block = "self_attn" if target in ATTENTION_TARGETS else "mlp"
            module = f"model.layers.{layer}.{block}.{target}"
            self._pair(tensors, module, _rank_for(module, self.rank, self.pattern),
                       *self.dims(target))

    def _per_expert(self, tensors: _Tensors, layer: int) -> None:
        for expert in range(self.experts):
            for target in self.moe_targets:
                module = f"model.layers.{layer}.mlp.experts.{expert}.{target}"
                self._pair(tensors, module, _rank_for(module, self.rank, self.pattern),
                           *self.dims(target))

    def _packed(self, tensors: _Tensors, layer: int) -> None:
        outer = 1 if self.moe_layout == "shared-outer" else self.experts
        base = f"{_PREFIX}model.layers.{layer}.mlp.experts"
        rank, hidden, inner, dtype = (self.rank, self.hidden_size, self.intermediate_size,
                                      self.dtype)
        if {"gate_proj", "up_proj"} & set(self.moe_targets):
            tensors[f"{base}.gate_up_proj.lora_A.weight"] = (dtype, (outer, 2 * rank, hidden))
            tensors[f"{base}.gate_up_proj.lora_B.weight"] = (
                dtype, (self.experts, 2 * inner, rank))
        if "down_proj" in self.moe_targets:
            tensors[f"{base}.down_proj.lora_A.weight"] = (dtype, (self.experts, rank, inner))
            tensors[f"{base}.down_proj.lora_B.weight"] = (dtype, (outer, hidden, rank))

    def _flat(self, tensors: _Tensors, layer: int) -> list[str]:
        # PEFT nests one ParamWrapper per targeted parameter, in the experts module's
        # registration order (gate_up before down): the first is the innermost.
        target_parameters = []
        if {"gate_proj", "up_proj"} & set(self.moe_targets):
            target_parameters.append("mlp.experts.gate_up_proj")
        if "down_proj" in self.moe_targets:
            target_parameters.append("mlp.experts.down_proj")
        flat_dims = {
            "mlp.experts.gate_up_proj": (self.hidden_size, 2 * self.intermediate_size),
            "mlp.experts.down_proj": (self.intermediate_size, self.hidden_size),
        }
        depth = len(target_parameters)
        for i, parameter in enumerate(target_parameters):
            module = f"model.layers.{layer}.mlp.experts" + ".base_layer" * (depth - 1 - i)
            self._pair(tensors, module, self.rank * self.experts, *flat_dims[parameter])
        return target_parameters

    def _embeddings(self, tensors: _Tensors) -> None:
        vocab, hidden, dtype = self.vocab_size, self.hidden_size, self.dtype
        if "embed_tokens" in self.targets:
            module = f"{_PREFIX}model.embed_tokens"
            rank = _rank_for("model.embed_tokens", self.rank, self.pattern)
            tensors[f"{module}.lora_embedding_A"] = (dtype, (rank, vocab))
            tensors[f"{module}.lora_embedding_B"] = (dtype, (hidden, rank))
            tensors[f"{module}.base_layer.weight"] = (dtype, (vocab, hidden))
        if "lm_head" in self.targets:
            self._pair(tensors, "lm_head", _rank_for("lm_head", self.rank, self.pattern),
                       hidden, vocab)
            tensors[f"{_PREFIX}lm_head.base_layer.weight"] = (dtype, (vocab, hidden))


def _apply_content_defects(
    defects: tuple[str, ...],
    tensors: dict[str, tuple[str, tuple[int, ...]]],
    config: dict[str, Any],
    *,
    dtype: str,
    rank: int,
    layers: int,
    hidden_size: int,
    vocab_size: int,
) -> None:
    lora_a = [k for k in sorted(tensors) if k.endswith(".lora_A.weight")]
    if not lora_a:  # embeddings only: use the embedding pair
        lora_a = [k for k in sorted(tensors) if k.endswith(".lora_embedding_A")]
    breaking = [name for name in _PAIR_DEFECTS if name in defects]
    if len(breaking) > len(lora_a):
        raise ValueError(
            f"write_adapter(defects=...): {', '.join(breaking)} each break a LoRA pair of "
            f"their own, and this adapter has {len(lora_a)}; give it more targets or layers")

    def pair(index: int) -> _Defective:
        first_a = lora_a[index]
        module = first_a.rsplit(".lora_", 1)[0]
        first_b = next(k for k in sorted(tensors) if k.startswith(module + ".lora_")
                       and ("lora_B" in k or "lora_embedding_B" in k))
        return _Defective(tensors, config, dtype, rank, layers, hidden_size, vocab_size,
                          first_a, first_b, module)

    # each defect's pair found before any is broken; moving a layer renames its keys: last
    breaks = [(_CONTENT_DEFECTS[name], pair(breaking.index(name) if name in breaking else 0))
              for name in sorted(defects, key=lambda name: name == "layer-out-of-range")
              if name in _CONTENT_DEFECTS]  # the others: _write_config / _write_weights
    for apply, defective in breaks:
        apply(defective)


_PAIR_DEFECTS = ("orphan-a", "orphan-b", "rank-mismatch", "empty-tensor", "mixed-dtype")
"""The defects that each break one LoRA pair (a half removed, resized or retyped): given
together, each breaks a pair of its own (the first pairs in key order, in this order), so
that every one of them is found; alone, the first pair."""


@dataclass(frozen=True)
class _Defective:
    """An adapter being written, and the first LoRA pair a defect breaks."""

    tensors: _Tensors
    config: dict[str, Any]
    dtype: str
    rank: int
    layers: int
    hidden_size: int
    vocab_size: int
    first_a: str
    first_b: str
    module: str

    def resize(self, key: str, shape: tuple[int, ...]) -> None:
        self.tensors[key] = (self.tensors[key][0], shape)

    def outputs(self) -> list[tuple[str, tuple[int, ...]]]:
        """Each 2D ``lora_B`` key with its shape (out, rank)."""
        return [(k, shape) for k, (_, shape) in list(self.tensors.items())
                if k.endswith(".lora_B.weight") and len(shape) == 2]


def _orphan_b(a: _Defective) -> None:  # lora_B without its lora_A
    del a.tensors[a.first_a]


def _orphan_a(a: _Defective) -> None:
    del a.tensors[a.first_b]


def _rank_mismatch(a: _Defective) -> None:
    shape = a.tensors[a.first_b][1]
    a.resize(a.first_b, (*shape[:-1], shape[-1] + 1))


def _config_rank(a: _Defective) -> None:
    a.config["r"] = a.rank * 2
    a.config["lora_alpha"] = a.config["lora_alpha"] * 2


def _empty_tensor(a: _Defective) -> None:
    shape = a.tensors[a.first_a][1]
    a.resize(a.first_a, (0, *shape[1:]))


def _mixed_dtype(a: _Defective) -> None:
    other = "float32" if a.dtype != "float32" else "bfloat16"
    a.tensors[a.first_b] = (other, a.tensors[a.first_b][1])


def _bad_key(a: _Defective) -> None:
    a.tensors[f"{a.module}.lora_C.weight"] = (a.dtype, (a.rank, a.hidden_size))


def _dora(a: _Defective) -> None:
    a.config["use_dora"] = True
    for key, shape in a.outputs():
        if shape[0]:
            a.tensors[key.replace(".lora_B.weight", ".lora_magnitude_vector")] = (
                a.dtype, (shape[0],))


def _lora_bias(a: _Defective) -> None:
    a.config["lora_bias"] = True
    for key, shape in a.outputs():
        a.tensors[key.replace(".weight", ".bias")] = (a.dtype, (shape[0],))


def _modules_to_save(a: _Defective) -> None:
    a.config["modules_to_save"] = ["lm_head"]
    a.tensors[f"{_PREFIX}lm_head.weight"] = (a.dtype, (a.vocab_size, a.hidden_size))


def _bias_all(a: _Defective) -> None:
    a.config["bias"] = "all"


def _trainable_tokens(a: _Defective) -> None:
    a.config["trainable_token_indices"] = [1, 2]
    a.tensors[f"{_PREFIX}model.embed_tokens.token_adapter.trainable_tokens_delta"] = (
        a.dtype, (2, a.hidden_size))


def _layer_out_of_range(a: _Defective) -> None:
    last, beyond = f".layers.{a.layers - 1}.", f".layers.{a.layers}."
    for key in [k for k in a.tensors if last in k]:
        a.tensors[key.replace(last, beyond)] = a.tensors.pop(key)


def _config_not_lora(a: _Defective) -> None:
    a.config["peft_type"] = "IA3"


_CONTENT_DEFECTS: Mapping[str, Callable[[_Defective], None]] = {
    "orphan-b": _orphan_b,
    "orphan-a": _orphan_a,
    "rank-mismatch": _rank_mismatch,
    "config-rank": _config_rank,
    "empty-tensor": _empty_tensor,
    "mixed-dtype": _mixed_dtype,
    "bad-key": _bad_key,
    "dora": _dora,
    "lora-bias": _lora_bias,
    "modules-to-save": _modules_to_save,
    "bias-all": _bias_all,
    "trainable-tokens": _trainable_tokens,
    "layer-out-of-range": _layer_out_of_range,
    "config-not-lora": _config_not_lora,
}
"""The defects in the adapter's content (config and tensors), by name."""


def _write_config(folder: pathlib.Path, config: Mapping[str, Any], defects: tuple[str, ...]
                  ) -> None:
    target = folder / "adapter_config.json"
    if "missing-config" in defects:
        if target.exists():
            target.unlink()
        return
    if "invalid-config-json" in defects:
        target.write_text('{"r": 8, "target_modules": ["q_proj"', encoding="utf-8")
        return
    target.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _write_weights(
    folder: pathlib.Path,
    tensors: Mapping[str, tuple[str, tuple[int, ...]]],
    defects: tuple[str, ...],
) -> None:
    target = folder / "adapter_model.safetensors"
    if "missing-weights" in defects:
        return
    if "pickle-bin" in defects:
        # A pickle stream like torch.save's; it is refused by name, never unpickled.
        payload = {name: shape for name, (_, shape) in tensors.items()}
        (folder / "adapter_model.bin").write_bytes(pickle.dumps(payload, protocol=2))
        return
    header, data_size = encode_header(
        [(name, safetensors_code(dt), shape) for name, (dt, shape) in tensors.items()],
        {"format": "pt"},
    )
    draft = _Header(header, [k for k in header if k != "__metadata__"], data_size)
    for defect, apply in _HEADER_DEFECTS.items():  # in the table's order, each once
        if defect in defects:
            apply(draft)
    out = target
    if "symlink-escape" in defects:
        out = folder.parent / f"{folder.name}.outside.safetensors"
    write_safetensors(out, draft.raw if draft.raw is not None else draft.header,
                      draft.data_size, length=draft.length)
    if "truncated-header" in defects:
        _truncate_header(out)
    if out != target:
        if target.exists() or target.is_symlink():
            target.unlink()
        target.symlink_to(os.path.relpath(out, folder))


@dataclass
class _Header:
    """A safetensors header about to be written, and what the defects change in it."""

    header: dict[str, Any]
    names: list[str]
    data_size: int
    raw: bytes | None = None
    length: int | None = None


def _unknown_dtype(h: _Header) -> None:
    h.header[h.names[0]]["dtype"] = "F13"


def _negative_shape(h: _Header) -> None:
    h.header[h.names[0]]["shape"] = [-1, *h.header[h.names[0]]["shape"][1:]]


def _offsets_past_end(h: _Header) -> None:  # the header promises more data than the file holds
    h.data_size -= min(h.data_size, 16)


def _offsets_overlap(h: _Header) -> None:
    if len(h.names) < 2:
        return
    second = sorted(h.names, key=lambda n: h.header[n]["data_offsets"][0])[1]
    begin, end = h.header[second]["data_offsets"]
    shift = min(begin, 2)
    h.header[second]["data_offsets"] = [begin - shift, end - shift]


def _trailing_bytes(h: _Header) -> None:
    h.data_size += 16


def _padded(raw: bytes) -> bytes:
    return raw + b" " * (-len(raw) % 8)


def _invalid_header_json(h: _Header) -> None:
    h.raw = _padded(b'{"__metadata__": {"format": "pt"}, "x": {')


def _duplicate_key(h: _Header) -> None:
    text = json.dumps(h.header, separators=(",", ":"))
    first = json.dumps({h.names[0]: h.header[h.names[0]]}, separators=(",", ":"))[1:-1]
    h.raw = _padded((text[:-1] + "," + first + "}").encode())


def _oversized_header(h: _Header) -> None:
    h.length = 2**40


# In this order: a later defect sees what an earlier one wrote (a duplicate key repeats the
# dtype an unknown-dtype defect set).
_HEADER_DEFECTS: Mapping[str, Callable[[_Header], None]] = {
    "unknown-dtype": _unknown_dtype,
    "negative-shape": _negative_shape,
    "offsets-past-end": _offsets_past_end,
    "offsets-overlap": _offsets_overlap,
    "trailing-bytes": _trailing_bytes,
    "invalid-header-json": _invalid_header_json,
    "duplicate-key": _duplicate_key,
    "oversized-header": _oversized_header,
}


def _truncate_header(out: pathlib.Path) -> None:
    size = out.stat().st_size
    with open(out, "r+b") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        f.truncate(min(size, 8 + header_len // 2))
