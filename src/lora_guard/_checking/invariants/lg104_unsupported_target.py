"""LG104's check, the one place LG104 is decided: weight keys outside PEFT's grammar, modules
the server does not serve (``limits.target_modules``), and full embedding weights saved under
a name the engine does not read (``plain-embeddings-refused``), LoRA on an embedding the
base's model class does not serve (``embeddings-by-architecture``), weights of a module
the config does not select (``peft-selects-modules``: PEFT), LoRA on an embedding the config
does not name (``embeddings-by-config``: sglang), and, across a set, modules outside the union
of the set's ``target_modules`` (``targets-from-set``: sglang's pool without
``--lora-target-modules``, `outside_set_pool`)."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from lora_guard._checking.engines.sglang import EMBEDDING_NAMES, config_names
from lora_guard._checking.engines.vllm import EMBEDDINGS, embedding_lora
from lora_guard._checking.engines.vllm import ENGINE as VLLM
from lora_guard._checking.limits import ServingLimits
from lora_guard._checking.registry import adapter_check, module_rule
from lora_guard._checking.rules.context import AdapterContext, ModuleContext, grouped_violations
from lora_guard._checking.rules.peft_selection import peft_selection
from lora_guard._checking.rules.shared import MAX_PER_KIND, PACKED, PART_OF, Grouped, more
from lora_guard._core.errors import Violation, make_violation
from lora_guard._reading.adapters import AdapterSpec, LoRAModuleSpec
from lora_guard._reading.moe import MoELayout

__all__ = ["is_served", "names_not_served", "not_selected", "outside_set_pool",
           "unsupported_target"]


def is_served(module: LoRAModuleSpec, served: Collection[str], slices: bool = False) -> bool:
    """Whether a server that serves the modules ``served`` applies ``module``'s LoRA
    (``slices``: the engine wraps a whole packed module when any part is targeted)."""
    if module.target in served or any(
        module.module == s or module.module.endswith("." + s) for s in served
    ):
        return True
    # A packed target whose parts are all served, and a part whose packed module is served
    # (an engine that packs q/k/v applies LoRA to qkv_proj whichever names the adapter uses).
    if module.target in PACKED and PACKED[module.target].issubset(served):
        return True
    if PART_OF.get(module.target) in served:
        return True
    if slices:  # the engine wraps the whole packed module when any part is targeted
        packed = module.target if module.target in PACKED else PART_OF.get(module.target)
        if packed is not None and not PACKED[packed].isdisjoint(served):
            return True
    return module.kind in ("moe-flat", "moe-packed") and "experts" in served


@module_rule("LG104")
def served_module(ctx: ModuleContext, module: LoRAModuleSpec, grouped: Grouped,
                  found: list[Violation]) -> None:
    served = ctx.target_modules
    if served is not None and not is_served(module, served, "packed-slices" in ctx.engine_rules):
        grouped.add(("LG104", "module", module.target), module.module,
                    {"target": module.target, "served": ", ".join(sorted(served))})


@adapter_check("LG104", position=50)
def unsupported_target(ctx: AdapterContext) -> list[Violation]:
    spec, subject = ctx.spec, ctx.subject
    rules = ctx.limits.engine_rules
    plain = "plain-embeddings-refused" in rules and bool(spec.extra_keys)  # (saved weights)
    saved = "saved-embeddings-refused" in rules and bool(spec.extra_keys)
    shared = [(rule, variant) for rule, variant in _INDEXED_SHARED if rule in rules]
    embeddings = "embeddings-by-architecture" in rules and ctx.limits.base is not None
    stacked = "stacked-from-first" in rules
    selects = "peft-selects-modules" in rules
    dropped = _embeddings_not_named(ctx) if "embeddings-by-config" in rules else []
    flat = _flat_experts(ctx) if "flat-experts-unmatched" in rules else []
    # most adapters: served modules only
    if not (spec.unknown_keys or plain or saved or shared or embeddings or stacked or selects
            or dropped or flat):
        return _not_served(ctx, [], [])
    found = [make_violation("LG104", "grammar", subject, key=key)  # outside the grammar
             for key in spec.unknown_keys[:MAX_PER_KIND]] if spec.unknown_keys else []
    if len(spec.unknown_keys) > MAX_PER_KIND:
        rest = len(spec.unknown_keys) - MAX_PER_KIND
        found.append(make_violation("LG104", "grammar", subject,
                                    key=f"... and {rest} more keys"))
    if plain:
        found += _plain_embeddings(ctx)
    if saved:
        found += _plain_embeddings(ctx, any_form=True)
    for _rule, variant in shared:
        found += _indexed_shared(ctx, variant)
    if embeddings:
        found += _embeddings_not_served(ctx)
    if stacked:
        found += _stack_incomplete(ctx)
    if selects:
        found += not_selected(spec, subject, ctx.limits.engine or "the server")
    return found + dropped + flat + _not_served(ctx, dropped, flat)


def _not_served(ctx: AdapterContext, dropped: list[Violation],
                flat: list[Violation]) -> list[Violation]:
    """The modules the server does not serve (the module pass's), but those another finding
    of the adapter already says: embeddings dropped as the adapter is read (they never reach
    the server's modules), flat experts (said by what the engine does with their names)."""
    if "pool-by-config" not in ctx.limits.engine_rules:
        return grouped_violations(ctx, "LG104", "module")
    items = [(name, count, details) for (code, variant, *_), (name, count, details)
             in ctx.modules.grouped.items.items() if code == "LG104" and variant == "module"]
    if items and dropped:
        gone = {v.details["target"] for v in dropped}
        items = [item for item in items if item[2]["target"] not in gone]
    if items and flat:
        said = {str(v.details["module"]).split(" (and ", 1)[0] for v in flat}
        items = [item for item in items if item[0] not in said]
    return _pool_violations(ctx.spec, ctx.subject, items, ctx.limits)


def _flat_experts(ctx: AdapterContext) -> list[Violation]:
    """MoE expert LoRA saved by PEFT's ``target_parameters`` (``mlp.experts.base_layer.lora_A``
    for gate_up, ``mlp.experts.lora_A`` for down): sglang finds a weight's pool module by a
    module name inside the weight's name, and no pool module (``gate_up_proj``, ``down_proj``,
    ...) is in these names; it loads the adapter, skips them with a warning and fails the
    first batch that uses it (``LoRAMemoryPool.load_lora_weight_to_buffer``), whatever
    ``--lora-target-modules`` says (measured on 0.5.23 and 0.5.20)."""
    if ctx.spec.moe_layout is not MoELayout.FLAT:  # a dense adapter: no pass
        return []
    grouped = Grouped()
    for m in ctx.spec.modules.values():
        if m.kind == "moe-flat":
            grouped.add((m.target,), m.module, {"target": m.target})
    engine = ctx.limits.engine or "the server"
    return [make_violation("LG104", "flat-experts", ctx.subject, module=more(name, n),
                           engine=engine, **details)
            for name, n, details in grouped.items.values()]


# sglang's packed names of a config's target_modules (get_normalized_target_modules)
_SGLANG_PACKED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
                  "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}


def _pool_violations(spec: AdapterSpec, subject: str,
                     items: list[tuple[str, int, Mapping[str, Any]]], limits: ServingLimits,
                     pool: Collection[str] | None = None,
                     source: str | None = None) -> list[Violation]:
    """LG104 ``pool`` for each module type outside the pool (``pool``, else the limits'
    ``target_modules``; first module, count, details),
    saying what sglang does (``pool-by-config``): it refuses an adapter whose config names a
    module outside its pool (``LoRAMemoryPool.can_support``; at start-up
    ``LoRAManager.init_lora_shapes``), and loads any other, skips the weights outside the
    pool with a warning and fails the first batch that uses it
    (``LoRAMemoryPool.load_lora_weight_to_buffer``)."""
    if not items:
        return []
    packed = {_SGLANG_PACKED.get(t, t) for t in (pool or limits.target_modules or ())}
    named = config_names(spec.config) or frozenset()
    outside = sorted(t for t in named if _SGLANG_PACKED.get(t, t) not in packed)
    engine = limits.engine or "the server"
    outcome = (f"its config names {', '.join(outside)}, so {engine} refuses the load (at "
               "start-up the server does not start)" if outside else
               f"its config does not list it, so {engine} loads the adapter, skips these "
               "weights with a warning and fails the first batch that uses it (the "
               "scheduler stops)")
    options = limits.engine_options
    source = source or ("--lora-target-modules" if options.get("lora_target_modules") else
                        _FROM_START_UP if options.get("lora_paths") else
                        "the running server's pool")
    return [make_violation("LG104", "pool", subject, module=more(name, count),
                           target=details["target"], served=details["served"],
                           engine=engine, outcome=outcome, source=source)
            for name, count, details in items]


_LAYER = re.compile(r"layers\.\d+\.")


def _embedding_of(module: LoRAModuleSpec) -> str | None:
    """``embed_tokens`` or ``lm_head`` where sglang reads the module's weights as that
    embedding's (a name holding it, outside the decoder layers), else None."""
    name = module.module.replace("unembed_tokens", "lm_head")
    if _LAYER.search(name + "."):
        return None
    return "embed_tokens" if "embed_tokens" in name else "lm_head" if "lm_head" in name else None


def _embeddings_not_named(ctx: AdapterContext) -> list[Violation]:
    """LoRA weights of embed_tokens / lm_head whose module the adapter's own
    ``target_modules`` list does not name: sglang drops them as it reads the adapter, with a
    debug log line (``LoRAAdapter._process_weight``), and serves the base module."""
    spec = ctx.spec
    if not any(t in EMBEDDING_NAMES for t in spec.target_modules):
        return []
    named = config_names(spec.config)
    if named is None:
        return []
    engine = ctx.limits.engine or "the server"
    found = []
    for m in spec.modules.values():
        embedding = _embedding_of(m)
        if embedding is not None and embedding not in named:
            found.append(make_violation(
                "LG104", "not-selected", ctx.subject, module=m.module, engine=engine,
                target=m.target,
                why=f"its target_modules does not name {embedding}, and {engine} reads LoRA "
                    "on embed_tokens and lm_head only for a module the adapter's config names",
                outcome=f"its weights are dropped without a word and the base {embedding} "
                        "is served"))
    return found[:MAX_PER_KIND]


def outside_set_pool(spec: AdapterSpec, pool: frozenset[str], subject: str,
                     limits: ServingLimits) -> list[Violation]:
    """LG104 for the modules of ``spec`` outside ``pool`` (`set_pool`), grouped by module type
    as the module pass groups them: sglang loads their weights, skips them with a warning and
    fails the first batch that uses the adapter (``LoRAMemoryPool.load_lora_weight_to_buffer``).
    An embedding the config does not name is left out: it is dropped as the adapter is read
    (`_embeddings_not_named` says so)."""
    slices = "packed-slices" in limits.engine_rules
    if all(t in pool or PART_OF.get(t) in pool or (slices and t in PART_OF and not PACKED[
            PART_OF[t]].isdisjoint(pool)) for t in spec.target_modules):
        return []
    named = config_names(spec.config)
    grouped = Grouped()
    served = ", ".join(sorted(pool))
    for m in spec.modules.values():
        if is_served(m, pool, slices):
            continue
        embedding = _embedding_of(m)
        if embedding is not None and named is not None and embedding not in named:
            continue
        if m.kind == "moe-flat" and "flat-experts-unmatched" in limits.engine_rules:
            continue  # `_flat_experts` says what the engine does with them
        grouped.add(("LG104", "module", m.target), m.module, {"target": m.target,
                                                              "served": served})
    items = [(name, count, details) for name, count, details in grouped.items.values()]
    if "pool-by-config" not in limits.engine_rules:
        return [make_violation("LG104", "module", subject, **{**details, "module": more(n, c)})
                for n, c, details in items]
    return _pool_violations(spec, subject, items, limits, pool, _FROM_START_UP)


_FROM_START_UP = "no --lora-target-modules: the start-up adapters' target_modules"


# sglang's indexed shared experts: written over routed experts before 0.5.23, refused from it
_INDEXED_SHARED = (("indexed-shared-overwrites", "shared-experts-overwritten"),
                   ("indexed-shared-refused", "shared-experts-refused"))


_SHARED = re.compile(r"(?:^|\.)shared_experts\.(?P<index>\d+)\.")


def _indexed_shared(ctx: AdapterContext, variant: str) -> list[Violation]:
    """Weights under ``shared_experts.<i>.``, which sglang's memory pool takes for routed expert
    ``<i>`` (``LoRAMemoryPool.load_lora_weight_to_buffer``: written over it before 0.5.23,
    refused from 0.5.23)."""
    hits = [(m.module, hit) for m in ctx.spec.modules.values()  # (the text first: cheaper)
            if "shared_experts." in m.module and (hit := _SHARED.search(m.module)) is not None]
    engine = ctx.limits.engine or "the server"
    return [make_violation("LG104", variant, ctx.subject, module=name, index=hit["index"],
                           engine=engine)
            for name, hit in hits[:MAX_PER_KIND]]


# (parts in stacking order, the packed module, the parts the stack is built from)
_STACKS = ((("q_proj", "k_proj", "v_proj"), "qkv_proj", ("q_proj", "v_proj")),
           (("gate_proj", "up_proj"), "gate_up_proj", ("gate_proj",)))
_STACK_OF = {part: index for index, (parts, _, _) in enumerate(_STACKS) for part in parts}
"""Each stacked part -> its stack's position in `_STACKS`."""


def _stack_incomplete(ctx: AdapterContext) -> list[Violation]:
    """sglang stacks q/k/v into qkv_proj starting from each q_proj weight, reading v_proj
    (k_proj zero-filled), and gate/up into gate_up_proj from gate_proj (up_proj zero-filled):
    a layer with q_proj but no v_proj fails there, and k_proj, v_proj or up_proj without
    their first part stay unstacked and find no module of the pool
    (``LoRAAdapter.normalize_qkv_proj``, ``normalize_gate_up_proj``)."""
    by_parent: dict[tuple[str, int], dict[str, str]] = {}
    for m in ctx.spec.modules.values():
        index = _STACK_OF.get(m.target)
        if index is not None and m.kind == "linear":
            by_parent.setdefault((m.module.removesuffix(m.target), index), {})[
                m.target] = m.module
    engine = ctx.limits.engine or "the server"
    found: list[Violation] = []
    for (parent, index), present in sorted(by_parent.items()):
        parts, packed, needed = _STACKS[index]
        missing = [p for p in needed if p not in present]
        if not missing:
            continue
        found.append(make_violation(
            "LG104", "stack-incomplete", ctx.subject, module=parent.rstrip(".") or packed,
            present=", ".join(p for p in parts if p in present), missing=", ".join(missing),
            engine=engine, parts="/".join(parts), packed=packed, first=parts[0]))
        if len(found) == MAX_PER_KIND:
            break
    return found


def not_selected(spec: AdapterSpec, subject: str, engine: str) -> list[Violation]:
    """Modules with weights that the config does not select (``target_modules``,
    ``exclude_modules``, ``modules_to_save``, ``layers_to_transform``): PEFT puts no LoRA on
    them and drops their weights without a word, or fails the load when it selects none
    (``check_target_module_exists``); the first `MAX_PER_KIND`. MoE experts (targeted by
    ``target_parameters``) get no verdict here."""
    selection = peft_selection(spec.config)
    if selection is None:
        return []
    modules = [m.module for m in spec.modules.values() if m.kind not in ("moe-flat", "moe-packed")]
    left_out = [(m, why) for m in modules if (why := selection.left_out(m)) is not None]
    outcome = ("no module of the adapter is selected and the load fails"
               if len(left_out) == len(spec.modules) else
               "its weights are dropped without a word")
    return [make_violation("LG104", "not-selected", subject, module=module, engine=engine,
                           why=why, outcome=outcome)
            for module, why in left_out[:MAX_PER_KIND]]


def _embeddings_not_served(ctx: AdapterContext) -> list[Violation]:
    """LoRA on an embedding (``embed_tokens``, ``lm_head``) that the base's vLLM model class
    does not list in its ``embedding_modules``, which vLLM refuses at load; no verdict for an
    architecture vLLM's table does not hold."""
    base = ctx.limits.base
    on_embeddings = {m.target: m.module for m in ctx.spec.modules.values()
                     if m.target in EMBEDDINGS}
    if base is None or not on_embeddings:  # (most adapters: no LoRA on an embedding)
        return []
    _, _, version = (ctx.limits.engine or "").partition("==")
    table = embedding_lora(version or VLLM.releases[0])  # the release's own table
    arch = next((a for a in base.architectures if a in table), None)
    if arch is None:
        return []
    served = table[arch]
    engine = ctx.limits.engine or "the server"
    hits = {target: module for target, module in on_embeddings.items() if target not in served}
    return [make_violation("LG104", "embedding-architecture", ctx.subject, module=module,
                           target=target, architecture=arch, engine=engine,
                           served=", ".join(sorted(served)) or "none")
            for target, module in sorted(hits.items())]


def _plain_embeddings(ctx: AdapterContext, *, any_form: bool = False) -> list[Violation]:
    """Full embedding weights saved as ``<module>.weight`` (``save_embedding_layers`` of an
    embedding that is no LoRA target), which an engine that reads saved embeddings only as
    ``<module>.base_layer.weight`` refuses (vLLM); ``any_form``: in either form, for an
    engine that loads only lora_A/lora_B weights (``saved-embeddings-refused``: lmdeploy)."""
    engine = ctx.limits.engine or "the server"
    return [make_violation(
        "LG104", "saved-embedding-any" if any_form else "saved-embedding", ctx.subject,
        key=key, engine=engine,
        module=key.removesuffix(".weight").removesuffix(".base_layer").rsplit(".", 1)[-1])
        for key, what in ctx.spec.extra_keys.items()
        if what == "embedding-base" and (any_form or not key.endswith(".base_layer.weight"))
    ][:MAX_PER_KIND]


def names_not_served(spec: AdapterSpec, served: frozenset[str], subject: str) -> list[Violation]:
    """For an engine that matches each module's name exactly against the modules it serves
    (vLLM's load: a packed name such as ``qkv_proj`` is refused where its parts are served,
    which `is_served` accepts for engines that split it): the first target it does not
    serve (MoE experts aside), or nothing."""
    fused = sorted({m.target for m in spec.modules.values() if m.target not in served
                    and m.kind not in ("moe-flat", "moe-packed")})
    if not fused:
        return []
    first = next(m for m in spec.modules.values() if m.target == fused[0])
    return [make_violation("LG104", "module", subject, module=first.module, target=fused[0],
                           served=", ".join(sorted(served)))]
