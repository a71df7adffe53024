"""LG109's check: an adapter that does not fit its base model (dims, layers, experts, vocab,
module names of another architecture, modules of another tower), compared with the base's
config (``limits.base``), the live model's dims (a guard's ``module_dims``) or its vocab
alone (``vocab_size``)."""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from lora_guard._checking.registry import adapter_check, module_rule
from lora_guard._checking.rules.context import AdapterContext, ModuleContext
from lora_guard._checking.rules.shared import Expected, Grouped, more
from lora_guard._core.catalogue import INVARIANTS
from lora_guard._core.errors import Violation, make_violation
from lora_guard._reading.adapters import AdapterSpec, LoRAModuleSpec
from lora_guard._reading.architectures import ARCHITECTURE_NAMES
from lora_guard._reading.basemodel import BaseModelDims
from lora_guard._reading.bounded import Bounded

__all__ = ["base_model_mismatch", "fits_base"]

_SHOWN_DIMS = 3
"""Mismatched dims named in an LG109 ``dims`` message (the rest are counted)."""
_UNNAMED_BASE_FIX = 4
"""The LG109 fix for an adapter whose config does not name its base model."""


def base_model_hint(spec: AdapterSpec, variant: str) -> str | None:
    """The LG109 fix for an adapter whose config leaves ``base_model_name_or_path`` empty,
    where the variant's own fix points there (dims, layers, experts, vocab); None: the fix
    of the message's variant."""
    named = spec.config.get("base_model_name_or_path")
    entry = INVARIANTS["LG109"]
    if (isinstance(named, str) and named.strip()) or entry.variant_fixes.get(variant, 0):
        return None
    return entry.fixes[_UNNAMED_BASE_FIX]


def dims_violation(subject: str, dims: list[tuple[str, int, dict[str, Any]]],
                   hint: str | None) -> Violation:
    """LG109 ``dims``: the weights of one adapter that do not fit the base model's dims, said
    once with their count and the first mismatches (an adapter trained on another base model
    misses every module's dims; one line each said the same thing many times)."""
    shown = [f"{d['module_kind']} {d['which']} dim {d['got']} where the base has "
             f"{d['expected']} ({d['source']})" for _, _, d in dims[:_SHOWN_DIMS]]
    rest = len(dims) - len(shown)
    name, count, _ = dims[0]
    return make_violation(
        "LG109", "dims", subject, count=sum(count for _, count, _ in dims), kinds=len(dims),
        examples="; ".join(shown), rest=f"; and {rest} more" if rest else "",
        key=more(name, count),
        mismatches=[{"key": name, "count": count, **details}
                    for name, count, details in dims], hint=hint)


# Towers of a multimodal model have their own dims (vision_config, audio_config) that the
# language model's config does not give: their modules are not compared with it.
_OTHER_TOWERS = {
    "vision": ("vision", "visual", "image", "multi_modal", "mm_projector"),
    "audio": ("audio",),
}


_ANY_TOWER = re.compile("|".join(re.escape(mark) for marks in _OTHER_TOWERS.values()
                                 for mark in marks))


def _tower(module: str) -> str | None:
    """``vision`` or ``audio`` for a module of a non-text tower, else None."""
    if _ANY_TOWER.search(module) is None:  # one scan for every mark (most modules)
        return None
    for tower, marks in _OTHER_TOWERS.items():
        if any(mark in module for mark in marks):
            return tower
    return None


_TYPICAL_TARGETS = (
    "q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "gate_proj", "up_proj", "down_proj",
    "gate_up_proj", "c_attn", "c_proj", "c_fc", "query_key_value", "dense", "Wqkv", "out_proj",
    "fc1", "fc2", "w1", "w2", "w3", "wqkv", "wo", "query", "key", "value",
)
_HEADS = frozenset(("score", "classifier", "qa_outputs", "lm_head", "embed_tokens"))
_FUSED = {"gate_up_proj": ("gate_proj", "up_proj"), "qkv_proj": ("q_proj", "k_proj", "v_proj"),
          "w13": ("w1", "w3")}
_FOREIGN = "foreign"


def _placement(path: str, model_type: str, fused_ok: bool) -> str:
    """Where a module path stands on a base of ``model_type``: its non-text tower
    (`_tower`), `_FOREIGN` (`_foreign_path`), or ``""`` (the language model's own module).
    Asked for every module of every adapter: remembered (`_PLACEMENTS`, looked up first)."""
    return _PLACEMENTS.put((path, model_type, fused_ok), _tower(path) or (
        _FOREIGN if _foreign_path(path, model_type, fused_ok) else ""))


_PLACEMENTS: Bounded[tuple[str, str, bool], str] = Bounded(
    4096, "where a module path stands on a base model's architecture (its tower, foreign, or "
    "its own: a model's module paths)")


def _foreign_path(path: str, model_type: str, fused_ok: bool) -> bool:
    """A module whose name the base model's architecture does not have (GPT-2's ``c_attn`` on
    a Llama base), when the architecture is known. Per-expert paths are not compared: their
    names changed between transformers releases (``block_sparse_moe.experts.0.w1``). A packed
    name whose parts the base has (``qkv_proj`` on Llama) is the base's unless the engine
    loads only the base's own names (``packed-names-native``: ``fused_ok`` False)."""
    names = ARCHITECTURE_NAMES.get(model_type)
    if names is None or ".experts." in path + ".":
        return False
    while path.endswith(".base_layer"):
        path = path[: -len(".base_layer")]
    leaf = path.rsplit(".", 1)[-1]
    if leaf in names or leaf in _HEADS:
        return False
    return not (fused_ok and leaf in _FUSED and all(part in names for part in _FUSED[leaf]))


def _misplaced(module: LoRAModuleSpec, base: BaseModelDims, placed: str,
               grouped: Grouped) -> None:
    """A module of a non-text tower (compared with the tower's own config, which the base's
    does not give) or of another architecture."""
    if placed is not _FOREIGN:
        if base.multimodal and (placed in base.towers or not base.towers):
            return  # its dims are in the tower's own config
        grouped.add(("LG109", "tower", placed), module.a_key or module.b_key or module.module,
                    {"tower": placed, "source": base.source})
        return
    names = ARCHITECTURE_NAMES[base.model_type or ""]
    grouped.add(("LG109", "architecture", base.model_type), module.module, {
        "model_type": base.model_type,
        "example": ", ".join([n for n in _TYPICAL_TARGETS if n in names][:4]
                             or sorted(names)[:4])})


def _check_base(module: LoRAModuleSpec, base: BaseModelDims,
                grouped: Grouped, rules: Collection[str] = frozenset()) -> None:
    path, model_type, fused_ok = module.module, base.model_type or "", (
        "packed-names-native" not in rules)
    placed = _PLACEMENTS.get((path, model_type, fused_ok))
    if placed is None:
        placed = _placement(path, model_type, fused_ok)
    if placed:
        _misplaced(module, base, placed, grouped)
        return
    key = module.a_key or module.b_key or module.module
    if module.layer is not None and base.num_layers is not None and (
            module.layer >= base.num_layers):
        grouped.add(("LG109", "layer", module.layer), key,
                    {"layer": module.layer, "layers": base.num_layers})
        return
    moe = module.kind.startswith("moe")
    if moe and base.num_experts is not None:
        if module.expert is not None and module.expert >= base.num_experts:
            grouped.add(("LG109", "expert", module.expert), key,
                        {"expert": module.expert, "experts": base.num_experts})
            return
        if module.experts is not None and module.experts != base.num_experts and (
                module.experts != 1 or module.kind != "moe-packed"):
            grouped.add(("LG109", "dim", module.target, "expert-count", module.experts),
                        key, {"which": "expert", "got": module.experts,
                              "module_kind": f"{module.target} experts",
                              "expected": base.num_experts,
                              "source": f"num_experts {base.num_experts}"})
            return
    if moe and base.num_experts is None:
        grouped.add(("LG109", "dim", module.target, "experts"), key, {
            "which": "expert", "got": module.experts or "some",
            "module_kind": f"{module.target} experts", "expected": 0,
            "source": "the base config has no experts"})
        return
    if module.kind == "embedding":
        _check_fit(module, *base.expected("embed_tokens", moe=False), grouped,
                   module_kind="embed_tokens")
        return
    _check_fit(module, *base.expected(module.target, moe=moe, module=module.module), grouped)



def _check_fit(module: LoRAModuleSpec, expected_in: Expected, expected_out: Expected,
               grouped: Grouped, module_kind: str | None = None) -> None:
    """LG109: A's in dim and B's out dim against the module's dims on the base model
    (an embedding's in dim and lm_head's out dim are the vocab)."""
    got_in, got_out = module.in_features, module.out_features
    if (got_in is None or expected_in[0] is None or got_in == expected_in[0]) and (
            got_out is None or expected_out[0] is None or got_out == expected_out[0]):
        return  # both dims fit (most modules)
    key = module.a_key or module.b_key or module.module
    kind_name = module_kind or module.target
    sides = (("in", module.in_features, expected_in, module.a_key, module.kind == "embedding"),
             ("out", module.out_features, expected_out, module.b_key,
              module.target == "lm_head"))
    for which, got, (expected, source), tensor_key, is_vocab in sides:
        if got is None or expected is None or got == expected:
            continue
        if is_vocab:
            grouped.add(("LG109", "vocab", got), tensor_key or key,
                        {"got": got, "expected": expected})
        else:
            grouped.add(("LG109", "dim", kind_name, which, got), tensor_key or key, {
                "which": which, "got": got, "module_kind": kind_name, "expected": expected,
                "source": source})


def _check_vocab(module: LoRAModuleSpec, vocab: int, grouped: Grouped) -> None:
    """LG109 against the vocab alone: an embedding's A and lm_head's B."""
    known: Expected = (vocab, f"vocab_size {vocab}")
    unknown: Expected = (None, "")
    if module.kind == "embedding":
        _check_fit(module, known, unknown, grouped)
    elif module.target == "lm_head":
        _check_fit(module, unknown, known, grouped)


def _saved_embeddings(spec: AdapterSpec, base: BaseModelDims, grouped: Grouped) -> None:
    """Embedding and head weights saved in full, against the base's vocab."""
    for key, what in spec.extra_keys.items():
        if what not in ("embedding-base", "modules_to_save"):
            continue
        shape = spec.tensors[key].shape
        leaf = key.removesuffix(".weight").removesuffix(".base_layer").rsplit(".", 1)[-1]
        if leaf not in ("embed_tokens", "lm_head") or len(shape) != 2 or not base.vocab_size:
            continue
        if shape[0] != base.vocab_size:
            grouped.add(("LG109", "vocab", shape[0]), key,
                        {"got": shape[0], "expected": base.vocab_size})


@module_rule("LG109")
def fits_base(ctx: ModuleContext, module: LoRAModuleSpec, grouped: Grouped,
              found: list[Violation]) -> None:
    """One module against the base model (its live modules, its config, or its vocab alone)."""
    module_dims = ctx.module_dims
    if module_dims is not None and module.module in module_dims:
        _check_fit(module, *module_dims[module.module], grouped)
    elif ctx.base is not None:
        _check_base(module, ctx.base, grouped, ctx.engine_rules)
    elif ctx.vocab_size is not None:
        _check_vocab(module, ctx.vocab_size, grouped)


@adapter_check("LG109", position=130)
def base_model_mismatch(ctx: AdapterContext) -> list[Violation]:
    """The module pass's findings, then the saved embeddings': one violation per kind, the
    dims of an adapter trained on another base model said once (``dims``)."""
    spec, limits = ctx.spec, ctx.limits
    found_by_pass = ctx.modules.grouped.items
    if not found_by_pass and (limits.base is None or not spec.extra_keys):
        return []
    grouped = Grouped()
    for group, (name, count, details) in found_by_pass.items():
        if group[0] == "LG109":
            grouped.items[group] = [name, count, details]
    if limits.base is not None and spec.extra_keys:
        _saved_embeddings(spec, limits.base, grouped)
    if not grouped.items:
        return []
    found: list[Violation] = []
    dims = [(name, count, details) for (_, variant, *_), (name, count, details)
            in grouped.items.items() if variant == "dim"]
    for (_, variant, *_), (name, count, details) in grouped.items.items():
        hint = base_model_hint(spec, variant)
        if variant == "dim" and len(dims) > 1:
            if name == dims[0][0]:
                found.append(dims_violation(ctx.subject, dims, hint))
            continue
        found.append(make_violation("LG109", variant, ctx.subject, **{
            **details, "key": more(name, count)}, hint=hint))
    return found
