"""PEFT's key grammar: which tensor of a safetensors header is which half of which LoRA
module (``lora_A/B``, ``lora_embedding_A/B``, DoRA magnitudes, ``lora_B.bias``,
``modules_to_save``, saved embeddings, trainable tokens), each module's record
(`LoRAModuleSpec`), and `Parts`: what a header's tensors say."""

from __future__ import annotations

import re
import types
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from lora_guard._core.frozen import builder
from lora_guard._reading.bounded import Bounded, ValueKey
from lora_guard._reading.config import (
    MATCH_BUDGET,
    FrozenConfig,
    _pattern_cost,
    pattern_value,
)
from lora_guard._reading.malformed import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    Malformed,
)
from lora_guard._reading.moe import MoELayout, moe_layout
from lora_guard._reading.safetensors import (
    TensorInfo,
)

_PREFIX = "base_model.model."


_EMBEDDING_NAMES = ("embed_tokens", "lm_head", "wte", "embed_in", "word_embeddings",
                    "embed_out", "tok_embeddings", "output")


LAYER_INDEX = re.compile(r"(?<![^.])(?:layers|h|blocks|layer|decoder\.layers)\.(\d+)(?![^.])")
"""A module path's layer index: the first whole segment of digits after a ``layers``, ``h``,
``blocks``, ``layer`` or ``decoder.layers`` segment (group 1)."""


def without_layer(module: str) -> str:
    """A module path with its layer index (the one `LoRAModuleSpec.layer` is read from) taken
    out: what the same module of every layer of a model shares. A path that ends in its
    index (the module's name is the index) is kept whole: no other layer's module is that one.

    Example:
        >>> from lora_guard._reading.grammar import without_layer
        >>> without_layer("model.layers.12.self_attn.q_proj"), without_layer("lm_head")
        ('model.layers..self_attn.q_proj', 'lm_head')
        >>> without_layer("model.layers.12")
        'model.layers.12'
    """
    return _template_and_layer(module)[0]


_EXPERT = re.compile(r"\.experts\.(\d+)\.")


MAX_INDEX_DIGITS = 9
"""Most digits of a layer or expert index in a weight's name (a billion layers): a longer one
is refused by name, never handed to ``int`` (which refuses past 4,300 digits in its own
words)."""


def _index(digits: str, module: str, what: str) -> int:
    """A layer or expert index of a module's name, at most `MAX_INDEX_DIGITS` digits."""
    if len(digits) > MAX_INDEX_DIGITS:
        raise Malformed(WEIGHTS_NAME, f"module {module!r} has {what} index of {len(digits):,} "
                        f"digits; no model has that many (at most {MAX_INDEX_DIGITS} digits)")
    return int(digits)


@dataclass(frozen=True, slots=True)
class LoRAModuleSpec:
    """One LoRA module of an adapter: its A and B halves as the safetensors header shows them.

    ``kind`` is ``"linear"``, ``"embedding"``, ``"moe-per-expert"`` (2D weights under
    ``experts.<i>.``), ``"moe-packed"`` (3D under an experts module, dim 0 = experts or 1),
    ``"moe-flat"`` (PEFT ``target_parameters``, rank x experts rows) or ``"conv"`` (a
    convolution's halves: A ``(r, in, *kernel)``, B ``(out, r, *kernel)``). ``rank`` is
    the rank per expert when the expert count is known; a half that is missing has shape
    None (an orphan).

    Example:
        >>> import lora_guard as lg
        >>> m = lg.LoRAModuleSpec(module="model.layers.0.self_attn.q_proj", target="q_proj",
        ...     kind="linear", rank=8, a_shape=(8, 64), b_shape=(64, 8), dtype="float16", layer=0)
        >>> m.in_features, m.out_features
        (64, 64)
    """

    module: str
    """Module path in the base model, e.g. ``model.layers.0.self_attn.q_proj``."""
    target: str
    """The module type servers name it by: ``q_proj``, ``gate_up_proj``, ``embed_tokens``."""
    kind: str
    """``linear``, ``embedding``, ``moe-per-expert``, ``moe-packed``, ``moe-flat`` or ``conv``."""
    rank: int | None
    """Rank (per expert for MoE); None when it cannot be told (empty or missing halves)."""
    a_shape: tuple[int, ...] | None
    """Shape of lora_A (``lora_embedding_A``), None when it is missing."""
    b_shape: tuple[int, ...] | None
    """Shape of lora_B (``lora_embedding_B``), None when it is missing."""
    dtype: str
    """dtype of the halves (the first one's when they differ)."""
    layer: int | None = None
    """Layer index, when the module path has one."""
    expert: int | None = None
    """Expert index for per-expert MoE weights."""
    experts: int | None = None
    """Expert count held by a packed or flat MoE module (None when unknown or dense)."""
    a_key: str | None = None
    """Tensor key of the A half."""
    b_key: str | None = None
    """Tensor key of the B half."""

    @property
    def in_features(self) -> int | None:
        """A's in dim (its last dim; a convolution's in channels); the vocab for an embedding."""
        if self.kind == "conv":
            return self.a_shape[1] if self.a_shape and len(self.a_shape) > 1 else None
        return self.a_shape[-1] if self.a_shape else None

    @property
    def out_features(self) -> int | None:
        """B's out dim (its second to last dim; a convolution's out channels)."""
        if self.kind == "conv":
            return self.b_shape[0] if self.b_shape else None
        return self.b_shape[-2] if self.b_shape and len(self.b_shape) >= 2 else None


_SUFFIX_ROLES = (
    (".lora_A.weight", "A"), (".lora_B.weight", "B"),
    (".lora_embedding_A", "eA"), (".lora_embedding_B", "eB"),
    (".lora_magnitude_vector", "dora"), (".lora_magnitude_vector.weight", "dora"),
    (".lora_B.bias", "lora_bias"),
    (".token_adapter.trainable_tokens_delta", "trainable_tokens"),
    (".lora_A", "A"), (".lora_B", "B"),
)
"""The key suffixes of LoRA grammar and the role of each, in the order they are tried."""


_LORA_ROLES = {
    "A.weight": "A", "B.weight": "B", "embedding_A": "eA", "embedding_B": "eB",
    "magnitude_vector": "dora", "magnitude_vector.weight": "dora", "B.bias": "lora_bias",
    "A": "A", "B": "B",
}
"""What follows a key's last ``.lora_``, for the suffixes `_split_key` knows (no suffix ends
another, so the last ``.lora_`` starts the only one that can match)."""


def _split_key(key: str) -> tuple[str, str] | None:
    """(module, role) for a key in LoRA grammar, role in A/B/eA/eB/dora/lora_bias/...;
    None for any other key."""
    name = key.removeprefix(_PREFIX)
    module, dot, rest = name.rpartition(".lora_")
    role = _LORA_ROLES.get(rest) if dot and module else None
    if role is not None:  # nearly every key: one C call instead of up to ten endswith
        return module, role
    for suffix, role in _SUFFIX_ROLES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)], role
    return None


def _leaf(module: str) -> str:
    return module.rsplit(".", 1)[-1]


def _matches_saved(module: str, saved: list[str]) -> bool:
    return any(module == s or module.endswith("." + s) for s in saved)


def _classify_other(key: str, config: Mapping[str, Any]) -> str | None:
    """What a key outside the A/B grammar is, or None when it is not understood."""
    name = key.removeprefix(_PREFIX)
    saved = config.get("modules_to_save") or []
    if name.endswith(".base_layer.weight"):
        module = name[: -len(".base_layer.weight")]
        if _leaf(module) in _EMBEDDING_NAMES:
            return "embedding-base"
    if name.endswith(".weight") and _leaf(name[: -len(".weight")]) in _EMBEDDING_NAMES and not (
            saved and _matches_saved(name[: -len(".weight")], saved)):
        return "embedding-base"  # save_embedding_layers of an embedding that is no LoRA target
    for suffix in (".weight", ".bias"):
        if name.endswith(suffix):
            module = name[: -len(suffix)]
            module = module.replace(".modules_to_save.default", "")
            if saved and _matches_saved(module, saved):
                return "modules_to_save"
            if suffix == ".bias" and config.get("bias", "none") != "none":
                return "bias"
    return None


def _flat_targets(config: Mapping[str, Any], module: str = "") -> list[str]:
    """Targeted parameter names of a module, innermost wrapper first.

    PEFT stores ``target_parameters`` sorted, but nests one wrapper per parameter in the
    module's registration order, which is gate/up before down in every MoE block in
    transformers; so gate/up-like names come first. A name qualified with a module path
    (``mlp.experts.down_proj``) counts only for a module it names (PEFT's suffix rule: the
    router's ``gate.weight`` is not a parameter of ``mlp.experts``), and a parameter listed
    both bare and qualified (as PEFT writes after converting a transformers v4 MoE config)
    counts once.
    """
    names: list[str] = []
    for entry in config.get("target_parameters") or []:
        if not isinstance(entry, str) or not entry:
            continue
        name = entry.rsplit(".", 1)[-1]
        if module and "." in entry and not (
            f"{module}.{name}" == entry or f"{module}.{name}".endswith("." + entry)):
            continue
        if name not in names:
            names.append(name)
    return sorted(names, key=lambda n: not any(t in n for t in ("gate", "up", "w1", "w3")))


def parameter_key(module: str, target: str, kind: str) -> str:
    """The name PEFT matches ``rank_pattern`` against: the module path, or for a wrapped
    parameter (``target_parameters``) the unwrapped module path and the parameter name.

    Example:
        >>> from lora_guard._reading.adapters import parameter_key
        >>> parameter_key("model.layers.0.mlp.experts.base_layer", "gate_up_proj", "moe-flat")
        'model.layers.0.mlp.experts.gate_up_proj'
        >>> parameter_key("model.layers.0.self_attn.q_proj", "q_proj", "linear")
        'model.layers.0.self_attn.q_proj'
    """
    if kind != "moe-flat":
        return module
    while module.endswith(".base_layer"):
        module = module[: -len(".base_layer")]
    return f"{module}.{target}"


def _target_of(module: str, config: Mapping[str, Any]) -> tuple[str, str, int | None]:
    """(target, kind, expert index) of a module path."""
    if "experts" not in module and not module.endswith(".base_layer"):
        return module.rpartition(".")[2], "linear", None  # what the rules below give it
    expert_match = _EXPERT.search(module + ".")
    if expert_match:
        return _leaf(module), "moe-per-expert", _index(expert_match.group(1), module,
                                                        "an expert")
    stripped = module
    depth = 0
    while stripped.endswith(".base_layer"):
        stripped = stripped[: -len(".base_layer")]
        depth += 1
    if _leaf(stripped) == "experts" or (config.get("target_parameters") and depth):
        names = _flat_targets(config, stripped)
        if names and depth < len(names):
            return names[len(names) - 1 - depth], "moe-flat", None
        return _leaf(stripped), "moe-flat", None
    if ".experts." in module + ".":
        return _leaf(module), "moe-packed", None
    return _leaf(module), "linear", None


def _module_records(
    halves: Mapping[str, Mapping[str, str]],
    tensors: Mapping[str, TensorInfo],
    config: Mapping[str, Any],
) -> tuple[dict[str, LoRAModuleSpec], tuple[int, ...], list[LoRAModuleSpec]]:
    """Each module's record, in module order; for each module the position of the first
    that is the same module of another layer (`Parts.same_as`); and those first ones (what
    holds for them holds for every module: target, rank, dtypes).

    A module's kind is its path but for its layer index (`without_layer`) and its halves'
    shapes and dtypes: a record follows from its kind, its names and its layer. So a record
    is made once per distinct module name, keys, shapes and dtypes (`_RECORDS`), and a
    module of a kind met earlier in the header gets that one's record with its own names and
    layer. Not where the config reads the module's whole path: with ``target_parameters``
    (the wrapped parameters it names) and for a ``moe-flat`` record (its rank read from ``r``
    and ``rank_pattern``), each record is read on its own, never remembered, and its kind
    also holds what the config gave it (target, rank, experts)."""
    modules: dict[str, LoRAModuleSpec] = {}
    flat = bool(config.get("target_parameters"))
    same: list[int] = []
    firsts: dict[tuple[Any, ...], tuple[int, LoRAModuleSpec]] = {}
    distinct: list[LoRAModuleSpec] = []
    for module, parts in sorted(halves.items()):
        a_key = parts.get("A") or parts.get("eA")
        b_key = parts.get("B") or parts.get("eB")
        a = tensors[a_key] if a_key else None
        b = tensors[b_key] if b_key else None
        embedding = "eA" in parts or "eB" in parts
        a_shape, a_dtype = (a.shape, a.dtype) if a else (None, None)
        b_shape, b_dtype = (b.shape, b.dtype) if b else (None, None)
        key = (module, a_key, b_key, embedding, a_shape, b_shape, a_dtype, b_dtype)
        known = None if flat else _RECORDS.get(key)
        if known is None:
            template, layer = _template_and_layer(module)
            kind: tuple[Any, ...] = (template, embedding, a_shape, b_shape, a_dtype, b_dtype)
            first = None if flat else firsts.get(kind)
            if first is None:
                record = _new_record(module, a_key, b_key, a, b, embedding, config, layer)
            else:
                proto = first[1]
                record = _built_module(
                    module, proto.target, proto.kind, proto.rank, proto.a_shape,
                    proto.b_shape, proto.dtype, layer, proto.expert, proto.experts, a_key,
                    b_key)
            if flat or record.kind == "moe-flat":  # the config read by the whole path
                kind = (*kind, record.target, record.rank, record.experts)
                first = firsts.get(kind)
            else:
                _RECORDS.put(key, (record, template))
        else:
            record, template = known
            kind = (template, embedding, a_shape, b_shape, a_dtype, b_dtype)
            first = firsts.get(kind)
        if first is None:
            firsts[kind] = first = (len(same), record)
            distinct.append(record)
        same.append(first[0])
        modules[module] = record
    return modules, tuple(same), distinct


def _template_and_layer(module: str) -> tuple[str, int | None]:
    """A module's path without its layer index (`without_layer`), and the index."""
    found = LAYER_INDEX.search(module)
    if found is None:
        return module, None
    start, end = found.span(1)
    return (module[:start] + module[end:] if end < len(module) else module,
            _index(module[start:end], module, "a layer"))


_RECORDS: Bounded[tuple[Any, ...], tuple[LoRAModuleSpec, str]] = Bounded(
    16_384, "module records (and their paths without the layer index) by module name, keys, "
    "shapes and dtypes: the adapters of one base model and rank repeat them, whatever else "
    "their files hold")


def _new_record(
    module: str, a_key: str | None, b_key: str | None, a: TensorInfo | None,
    b: TensorInfo | None, embedding: bool, config: Mapping[str, Any],
    layer: int | None,
) -> LoRAModuleSpec:
    """A module's record read from its path, halves and layer index."""
    target, kind, expert = _target_of(module, config)
    a_shape = a.shape if a else None
    b_shape = b.shape if b else None
    if embedding:
        kind = "embedding"
    elif (a_shape and len(a_shape) > 2) or (b_shape and len(b_shape) > 2):
        # packed MoE weights are 3D under an experts module; other N-D halves are convolutions
        packed = "experts" in module.split(".") and all(
            len(s) == 3 for s in (a_shape, b_shape) if s and len(s) > 2)
        kind = "moe-packed" if packed else "conv"
    half = a or b
    rank, experts = _rank_and_experts(kind, target, a_shape, b_shape)
    if kind == "moe-flat" and rank:
        r = (pattern_value(config.get("rank_pattern") or {}, parameter_key(module, target, kind))
             or config.get("r"))
        if isinstance(r, int) and r > 0 and rank % r == 0:
            experts = rank // r
            rank = r
    if rank == 0:
        rank = None
    return _built_module(module, target, kind, rank, a_shape, b_shape,
                         half.dtype if half else "", layer, expert, experts, a_key, b_key)


_built_module = builder(LoRAModuleSpec)
"""``LoRAModuleSpec`` of every field in order, built from a header the reader has checked."""


def _rank_and_experts(kind: str, target: str, a_shape: tuple[int, ...] | None,
                      b_shape: tuple[int, ...] | None) -> tuple[int | None, int | None]:
    """The rank the halves show, and the expert count a packed MoE module holds."""
    if kind == "moe-packed":
        rank: int | None = None
        if b_shape and len(b_shape) == 3:
            rank = b_shape[-1]
        elif a_shape and len(a_shape) == 3:
            rank = a_shape[-2] // (2 if "gate_up" in target or "w13" in target else 1)
        experts = max((s[0] for s in (a_shape, b_shape) if s and len(s) == 3), default=None)
        return rank, experts
    if a_shape and len(a_shape) >= 2:  # linear (r, in); conv (r, in, *kernel)
        return a_shape[0], None
    if b_shape and len(b_shape) >= 2:  # linear (out, r); conv (out, r, *kernel)
        return b_shape[1], None
    return None, None


class Parts(NamedTuple):
    """What a header's tensors say, with the few config fields it depends on."""

    tensors: Mapping[str, TensorInfo]
    modules: Mapping[str, LoRAModuleSpec]
    extra: Mapping[str, str]
    unknown: tuple[str, ...]
    layout: MoELayout | None
    targets: tuple[str, ...]
    dtypes: tuple[str, ...]
    rank: int | None
    fields: Mapping[str, Any]
    """The config's `PARTS_FIELDS` (those it has): all the grammar read of the config."""
    key: ValueKey
    """The value the parts were read from: the tensor entries and ``fields`` (equal keys,
    equal parts); adapters whose keys are equal share what is read from their parts alone."""
    same_as: tuple[int, ...]
    """For each module, in ``modules``' order, the position of the first module that is the
    same module of another layer: its record equal but for its names and layer, its path but
    for the layer index (`without_layer`)."""


PARTS_FIELDS = ("r", "rank_pattern", "alpha_pattern", "target_parameters", "modules_to_save",
                "bias")
"""The config fields the key grammar reads (`parts_of` is given these alone)."""


def parts_of(tensors: Mapping[str, TensorInfo], config: FrozenConfig,
             entries_key: Hashable | None = None) -> Parts:
    """What a header's tensors say, read by LoRA's key grammar with the config's
    `PARTS_FIELDS` (``tensors`` is kept, read-only: a caller passes a map of its own, or the
    reader's validated `Entries`). ``entries_key``, when given, stands for ``tensors``: a
    value that only equal maps share (the reader's: the header's bytes; an integration's:
    each loaded tensor's name, shape and dtype, in order), so that the map is not walked to
    make one.

    Made once per distinct tensor entries and fields (`_PARTS`): adapters that differ only
    in what the grammar does not read (a config's ``revision``, a header's
    ``__metadata__``) share their parts."""
    fields = config.fields(PARTS_FIELDS)
    entries = entries_key if entries_key is not None else tuple([  # (hashed as plain values)
        (name, info.shape, info.dtype, info.nbytes, info.offsets)
        for name, info in tensors.items()])
    key = ValueKey((entries, repr(fields)))  # JSON: equal reprs, equal values
    return _PARTS.get(key) or _PARTS.put(key, _read_parts(tensors, fields, key))


_PARTS: Bounded[ValueKey, Parts] = Bounded(
    256, "the parts of a header by its tensor entries and the config fields the grammar "
    "reads: adapters of one recipe but for their names and metadata share them")


def _read_parts(tensors: Mapping[str, TensorInfo], config: dict[str, Any],
                read_from: ValueKey) -> Parts:
    halves: dict[str, dict[str, str]] = {}
    extra: dict[str, str] = {}
    unknown: list[str] = []
    for key in tensors:
        split = _split_key(key)
        if split is not None and split[1] in ("A", "B", "eA", "eB"):
            halves.setdefault(split[0], {})[split[1]] = key
        elif split is not None:
            extra[key] = split[1]
        else:
            other = _classify_other(key, config)
            if other is None:
                unknown.append(key)
            else:
                extra[key] = other
    if _pattern_cost(config, halves) > MATCH_BUDGET:
        raise Malformed(CONFIG_NAME, f"rank_pattern/alpha_pattern would take more than "
                        f"{MATCH_BUDGET:,} regex steps to match against the "
                        f"{len(halves):,} module names (longest "
                        f"{max(map(len, halves), default=0):,} characters); use shorter "
                        "patterns with fewer '.*'", kind="malformed")
    modules, same, distinct = _module_records(halves, tensors, config)
    layout = moe_layout(tensors)
    ranks = [m.rank for m in distinct if m.rank]
    return Parts(
        tensors=types.MappingProxyType(tensors),
        modules=types.MappingProxyType(modules),
        extra=types.MappingProxyType(extra),
        unknown=tuple(sorted(unknown)),
        layout=layout,
        targets=tuple(sorted({m.target for m in distinct})),
        dtypes=tuple(sorted({tensors[k].dtype for m in distinct for k in (m.a_key, m.b_key)
                             if k})),
        rank=max(ranks) if ranks else None,
        fields=FrozenConfig(config),
        key=read_from,
        same_as=same,
    )
