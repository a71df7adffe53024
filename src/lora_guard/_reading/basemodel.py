"""The dims an adapter must fit, read from a Hugging Face ``config.json`` of the base model."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lora_guard._reading.safetensors import OPEN_FLAGS, json_value_bound

__all__ = ["BaseConfigError", "BaseModelDims", "load_base_config"]

MAX_BASE_CONFIG_BYTES = 10_000_000
MAX_BASE_CONFIG_VALUES = 200_000
"""Most JSON values a base config.json may hold (a real one has a few hundred)."""


class BaseConfigError(ValueError):
    """The base model's config.json cannot be used: unreadable, not JSON, too large, or
    without a hidden size. The message says which file and why."""


def _int(config: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        value = config.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


_TOWER_CONFIGS = {
    "vision": ("vision_config", "visual", "vision_tower_config", "image_config"),
    "audio": ("audio_config", "speech_config", "audio_encoder_config"),
}
"""The config keys that say a model has a non-text tower."""


_BY_PATH = frozenset(("gate_proj", "up_proj", "w1", "w3", "gate_up_proj", "down_proj", "w2",
                      "c_fc", "c_proj"))
"""The module types whose dims `BaseModelDims.expected` reads from the module's path too (the
MLP's size: a shared expert's own; GPT-2's ``c_proj`` in attention or in the MLP)."""


@dataclass(frozen=True)
class BaseModelDims:
    """The module dims of a base model, from its ``config.json``.

    Example:
        >>> from lora_guard._reading.basemodel import BaseModelDims
        >>> dims = BaseModelDims.from_config({
        ...     "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        ...     "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128})
        >>> dims.expected("k_proj", moe=False)
        ((64, 'hidden_size 64'), (32, 'num_key_value_heads 2 x head_dim 16'))
    """

    hidden_size: int
    num_layers: int | None
    num_heads: int | None
    num_kv_heads: int | None
    head_dim: int | None
    intermediate_size: int | None
    vocab_size: int | None
    num_experts: int | None = None
    moe_intermediate_size: int | None = None
    shared_expert_intermediate_size: int | None = None
    intermediate_source: str = "intermediate_size"
    source: str = "config.json"
    model_type: str | None = None
    """The language model's ``model_type`` (``llama``, ``gpt2``), None when not given."""
    towers: frozenset[str] = frozenset()
    """Non-text towers the model has (``vision``, ``audio``), from its ``*_config`` keys."""
    multimodal: bool = False
    """True when the config wraps a language model (``text_config``) or has any tower."""
    architectures: tuple[str, ...] = ()
    """The config's ``architectures`` (``LlamaForCausalLM``), empty when not given."""

    @classmethod
    def from_config(cls, config: Mapping[str, Any], source: str = "config.json") -> BaseModelDims:
        """Dims from a config dict; raises ValueError when it has no hidden size."""
        if not isinstance(config, Mapping):
            raise BaseConfigError(f"base config {source} is not a JSON object")
        towers = frozenset(
            tower for tower, keys in _TOWER_CONFIGS.items()
            if any(isinstance(config.get(k), Mapping) for k in keys))
        text = config.get("text_config")
        multimodal = bool(towers) or isinstance(text, Mapping)
        if isinstance(text, Mapping):  # multimodal wrappers keep the language model inside
            config = {**config, **text}
        model_type = config.get("model_type")
        architectures = config.get("architectures")
        hidden = _int(config, "hidden_size", "n_embd", "d_model", "dim")
        if hidden is None:
            raise BaseConfigError(
                f"base config {source} has no hidden_size (or n_embd/d_model); pass the base "
                "model's Hugging Face config.json"
            )
        heads = _int(config, "num_attention_heads", "n_head", "num_heads")
        kv = _int(config, "num_key_value_heads", "num_kv_heads", "n_head_kv")
        if kv is None and config.get("multi_query"):
            kv = 1
        head_dim = _int(config, "head_dim")
        if head_dim is None and heads and hidden % heads == 0:
            head_dim = hidden // heads
        intermediate = _int(config, "intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size")
        inner_source = "intermediate_size"
        if intermediate is None and "n_embd" in config:  # GPT-2 style: n_inner null is 4 x n_embd
            intermediate, inner_source = 4 * hidden, f"4 x n_embd {hidden} ="
        experts = _int(config, "num_experts", "num_local_experts", "n_routed_experts",
                       "moe_num_experts")
        moe_intermediate = _int(config, "moe_intermediate_size", "expert_intermediate_size")
        shared = _int(config, "shared_expert_intermediate_size")
        n_shared = _int(config, "n_shared_experts")
        if shared is None and n_shared and moe_intermediate:
            shared = n_shared * moe_intermediate
        return cls(
            hidden_size=hidden,
            num_layers=_int(config, "num_hidden_layers", "n_layer", "num_layers"),
            num_heads=heads,
            num_kv_heads=kv or heads,
            head_dim=head_dim,
            intermediate_size=intermediate,
            vocab_size=_int(config, "vocab_size", "padded_vocab_size"),
            num_experts=experts,
            moe_intermediate_size=moe_intermediate or (intermediate if experts else None),
            shared_expert_intermediate_size=shared,
            intermediate_source=inner_source,
            source=source,
            model_type=model_type if isinstance(model_type, str) and model_type else None,
            towers=towers,
            multimodal=multimodal,
            architectures=tuple(a for a in architectures if isinstance(a, str))
            if isinstance(architectures, list) else (),
        )

    def __hash__(self) -> int:
        """The hash of the fields, computed once (a guard's memo of the module pass is looked
        up by the base's dims at every load)."""
        found: int | None = self.__dict__.get("_hash")
        if found is None:
            found = hash(tuple([getattr(self, f.name) for f in dataclasses.fields(self)]))
            object.__setattr__(self, "_hash", found)
        return found

    def __getstate__(self) -> dict[str, Any]:
        """The fields alone: what is remembered of them (a hash of this process's strings,
        the answers of `expected`) is found again where the dims are unpickled."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def _mlp(self, module: str, moe: bool) -> int | None:
        if moe:
            return self.moe_intermediate_size
        if ".shared_expert." in module + "." or ".shared_experts." in module + ".":
            return self.shared_expert_intermediate_size
        return self.intermediate_size

    def expected(
        self, target: str, *, moe: bool, module: str = ""
    ) -> tuple[tuple[int | None, str], tuple[int | None, str]]:
        """((in, source), (out, source)) of a module type on this base model.

        A dim is None where this config does not tell it (an unknown module type). Each
        answer is computed once per base (the checker asks for every module of every
        adapter); the module path matters only for a shared expert and GPT-2's ``c_proj``.
        """
        key: tuple[str, bool] | tuple[str, bool, bool, bool] = (target, moe)
        if moe or target in _BY_PATH:
            tail = module + "."
            key = (target, moe, ".shared_expert." in tail or ".shared_experts." in tail,
                   ".mlp." in tail)
        known: dict[tuple[Any, ...], Any] | None = self.__dict__.get("_known")
        if known is None:
            known = {}
            object.__setattr__(self, "_known", known)
        found = known.get(key)
        if found is None:
            found = known[key] = self._expected(target, moe=moe, module=module)
        result: tuple[tuple[int | None, str], tuple[int | None, str]] = found
        return result

    def _expected(
        self, target: str, *, moe: bool, module: str = ""
    ) -> tuple[tuple[int | None, str], tuple[int | None, str]]:
        h = (self.hidden_size, f"hidden_size {self.hidden_size}")
        q: tuple[int | None, str] = (None, "")
        kv: tuple[int | None, str] = (None, "")
        if self.num_heads and self.head_dim:
            q = (self.num_heads * self.head_dim,
                 f"num_attention_heads {self.num_heads} x head_dim {self.head_dim}")
        if self.num_kv_heads and self.head_dim:
            kv = (self.num_kv_heads * self.head_dim,
                  f"num_key_value_heads {self.num_kv_heads} x head_dim {self.head_dim}")
        size = self._mlp(module, moe)
        name = ("moe_intermediate_size" if moe else
                "shared_expert_intermediate_size"
                if size is not None and size == self.shared_expert_intermediate_size
                and size != self.intermediate_size else self.intermediate_source)
        inter: tuple[int | None, str] = (size, f"{name} {size}")
        gate_up: tuple[int | None, str] = (
            (2 * size, f"2 x {name} {size}") if size else (None, ""))
        qkv: tuple[int | None, str] = (None, "")
        if q[0] and kv[0]:
            qkv = (q[0] + 2 * kv[0], f"({q[1]}) + 2 x ({kv[1]})")
        vocab: tuple[int | None, str] = (self.vocab_size, f"vocab_size {self.vocab_size}")
        table = {
            "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "qkv_proj": (h, qkv),
            "gate_proj": (h, inter), "up_proj": (h, inter), "w1": (h, inter), "w3": (h, inter),
            "gate_up_proj": (h, gate_up), "down_proj": (inter, h), "w2": (inter, h),
            "lm_head": (h, vocab), "embed_tokens": (vocab, h),
            # GPT-2 style Conv1D blocks: fused c_attn, c_fc, and c_proj in attention and MLP
            "c_attn": (h, qkv), "c_fc": (h, inter),
            "c_proj": (inter, h) if ".mlp." in module + "." else (q, h),
        }
        if self.num_experts and target == "gate":  # the router of an MoE block
            table["gate"] = (h, (self.num_experts, f"num_experts {self.num_experts}"))
        unknown: tuple[int | None, str] = (None, "")
        return table.get(target, (unknown, unknown))


def load_base_config(source: str | os.PathLike[str] | Mapping[str, Any]) -> BaseModelDims:
    """`BaseModelDims` from a config.json path (or a folder holding one) or a dict.

    Raises ValueError with the reason when it cannot be read.
    """
    if isinstance(source, Mapping):
        return BaseModelDims.from_config(source, "base_config")
    path = pathlib.Path(source)
    try:
        if path.is_dir():
            path = path / "config.json"
        fd = os.open(path, OPEN_FLAGS)  # never blocks: a FIFO is refused below, not waited on
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise BaseConfigError(
            f"cannot read base config {str(path)[:200]!r}: {reason}; pass the base "
            "model's config.json"
        ) from None
    raw = _read_base(fd, path)
    if json_value_bound(raw) > MAX_BASE_CONFIG_VALUES:
        raise BaseConfigError(f"base config {str(path)!r} holds more than "
                         f"{MAX_BASE_CONFIG_VALUES:,} JSON values (memory bound)")
    try:
        config = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BaseConfigError(f"base config {str(path)!r} is not valid JSON "
                         f"({str(exc)[:200]})") from None
    return BaseModelDims.from_config(config, str(path))


def _read_base(fd: int, path: pathlib.Path) -> bytes:
    """The bytes of the regular file open as ``fd`` (closed after), up to the size cap."""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BaseConfigError(f"base config {str(path)[:200]!r} is not a regular file; pass "
                             "the base model's config.json")
        if info.st_size > MAX_BASE_CONFIG_BYTES:
            raise BaseConfigError(
                f"base config {str(path)!r} is larger than {MAX_BASE_CONFIG_BYTES} bytes")
        raw = b"".join(iter(lambda: os.read(fd, 1 << 20), b""))[: MAX_BASE_CONFIG_BYTES + 1]
    except OSError as exc:
        raise BaseConfigError(f"cannot read base config {str(path)[:200]!r}: "
                         f"{exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_BASE_CONFIG_BYTES:
        raise BaseConfigError(
            f"base config {str(path)!r} is larger than {MAX_BASE_CONFIG_BYTES} bytes")
    return raw


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key[:80]!r}: a loader silently takes "
                                 "the last one")
            seen.add(key)
    return result
