"""The one catalogue of invariants: a registry by code.

Every fact about an invariant lives in its entry: code, slug, the error class that raises it,
its message templates, its hint (the first fix), the docs' sections and `lora-guard explain`.
Nothing else in the package spells a message or a hint.

`INVARIANTS` is a read-only view of the registry; `register` adds an entry (refusing a code
that is taken or malformed). The entries of ``_ENTRIES`` below are registered when this module
is imported; an invariant defined with its check in one unit
(``lora_guard._checking.registry.adapter_invariant``) registers itself the same way, so the
catalogue, ``lora-guard codes``/``explain``, the pytest summary and the docs reference see it
without another edit.
"""

from __future__ import annotations

import re
import string
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

__all__ = ["INVARIANTS", "Invariant", "register", "unregister"]


@dataclass(frozen=True)
class Invariant:
    """One invariant of LoRA serving, as the catalogue `lora_guard.INVARIANTS` holds it.

    Example:
        >>> import lora_guard as lg
        >>> inv = lg.INVARIANTS["LG001"]
        >>> inv.slug
        'pool-shape-drift'
        >>> inv.hint == inv.fixes[0]
        True
    """

    code: str
    """Stable code, ``LG`` and three digits; never renumbered."""
    slug: str
    """Short kebab-case name, also ``error.invariant``."""
    title: str
    """One line for tables and summaries."""
    summary: str
    """What the invariant guards and why breaking it hurts."""
    triggers: tuple[str, ...]
    """The calls or inputs that break it."""
    fixes: tuple[str, ...]
    """Ways to fix it, the most common first; ``fixes[0]`` is the hint."""
    error: str
    """Name of the exception class that raises it."""
    messages: Mapping[str, str]
    """Message templates by variant, formatted with ``subject`` and the violation's details."""
    situations: tuple[str, ...] = ()
    """Situations in the field that usually lead to it."""
    example: str = ""
    """A before/after fix, as code."""
    raised_by: tuple[str, ...] = ()
    """The guards, checks and integrations that report it."""
    variant_fixes: Mapping[str, int] = field(default_factory=dict)
    """For a message variant whose best fix is not the first: variant -> index in `fixes`."""
    docs: str = field(default="")
    """Anchor of its section in the invariants reference."""
    severity: str = "error"
    """``error``: a violation fails ``lora-guard check`` (exit 1) and raises in ``raise``
    mode. Every built-in code is an error (SARIF's ``level`` and ``lora-guard codes`` show it)."""

    @property
    def hint(self) -> str:
        """The first fix, one line."""
        return self.fixes[0]

    def hint_for(self, variant: str) -> str:
        """The fix that fits a message variant best (the first fix unless the entry says)."""
        return self.fixes[self.variant_fixes.get(variant, 0)]

    def explain(self) -> str:
        """The whole entry as Markdown: what ``lora-guard explain`` prints and the docs show.

        Example:
            >>> import lora_guard as lg
            >>> print(lg.INVARIANTS["LG003"].explain().splitlines()[0])
            ## LG003 cache-key-collision: One cache key maps to tensors of different shape or dtype
        """
        def bullets(items: tuple[str, ...]) -> str:
            return "\n".join(f"- {item}" for item in items)

        parts = [
            f"## {self.code} {self.slug}: {self.title}",
            f"Raised as `lora_guard.{self.error}`.",
            self.summary,
            f"**When it happens**\n\n{bullets(self.triggers)}",
        ]
        if self.situations:
            parts.append(f"**Common situations**\n\n{bullets(self.situations)}")
        parts.append(
            "**How to fix it**\n\n"
            + "\n".join(f"{i}. {fix_as_documented(fix)}" for i, fix in enumerate(self.fixes, 1))
        )
        if self.example:
            parts.append(f"**Example**\n\n```python\n{self.example.rstrip()}\n```")
        parts.append(
            "**What you see**\n\n"
            + "\n".join(f"- ``{text}``" for text in dict.fromkeys(self.messages.values()))
        )
        if self.raised_by:
            parts.append("**Reported by**: " + ", ".join(f"`{r}`" for r in self.raised_by))
        return "\n\n".join(parts) + "\n"


def fix_as_documented(fix: str) -> str:
    """A fix template as the docs show it: ``{allow_name}`` as ``<allow_name>``."""
    if "{" not in fix:
        return fix
    try:
        parts = list(string.Formatter().parse(fix))
    except ValueError:
        return fix
    return "".join(text + (f"<{name}>" if name is not None else "")
                   for text, name, _, _ in parts)


def _entry(**kwargs: object) -> Invariant:
    code = str(kwargs["code"])
    kwargs.setdefault("docs", f"reference/invariants.md#{code.lower()}")
    messages = kwargs["messages"]
    assert isinstance(messages, dict)
    kwargs["messages"] = types.MappingProxyType(messages)
    return Invariant(**kwargs)  # type: ignore[arg-type]


_ENTRIES = (
    _entry(
        code="LG001",
        slug="pool-shape-drift",
        title="A pool dimension frozen at first allocation changed",
        summary=(
            "A LoRA pool allocates its buffers (slots, max rank, experts, inner dims) on the "
            "first call and serves every later batch from them. A later call that brings "
            "another size would have the server reallocate or mis-index buffers under "
            "in-flight batches, so the call is refused before it mutates anything."
        ),
        triggers=(
            "A `@lg.shapes(..., frozen=...)` method called with a frozen dim of another size "
            "than on its first successful call.",
            "sglang's shared-sink `set_lora_info` called at rank 16, then at rank 8 or with "
            "more slots.",
        ),
        situations=(
            "Hot-swapping an adapter of another rank into a live pool.",
            "Loading more adapters than the slot count allocated at start-up.",
            "An adapter bundle whose ranks differ from one update to the next.",
        ),
        fixes=(
            "Allocate the pool for the largest rank and slot count up front and pad smaller "
            "adapters into it; call lora_guard.unfreeze(obj) only for a deliberate rebuild.",
            "Recreate the module (or restart the server) when the pool really must change size.",
            "Normalise every adapter to one rank before it reaches the pool.",
            "For PEFT hot-swapping: call prepare_model_for_compiled_hotswap(model, "
            "target_rank=...) with the largest rank you will ever swap in, before compiling.",
        ),
        example=(
            "# before: the second call changes the pool's rank\n"
            "sink.set_lora_info(ga16, gb16, da16, db16)\n"
            "sink.set_lora_info(ga8, gb8, da8, db8)      # LG001: rank 16 -> 8\n"
            "\n"
            "# after: allocate for the largest rank once, zero-pad smaller adapters into it\n"
            "sink.set_lora_info(*pad_to_rank(16, ga8, gb8, da8, db8))\n"
        ),
        error="PoolShapeDriftError",
        messages={
            "frozen": (
                "{subject}: dim '{dim}' was frozen at {old} by the first call and is now {new} "
                "(argument '{argument}' has shape {shape})."
            ),
            "expected": (
                "{subject}: pool dim '{dim}' is {new}, but the server expects {old}."
            ),
            "hotswap": (
                "{subject}: {key} has rank {new}, above the rank {old} that "
                "prepare_model_for_compiled_hotswap padded the model to; PEFT would replace the "
                "padded tensor (torch.utils.swap_tensors) and break the compiled model's fixed "
                "shapes (prepare it with target_rank={new} or more)."
            ),
        },
        variant_fixes={"hotswap": 3},
        raised_by=("@lg.shapes(frozen=...)", "lg.pool_shapes_stable", "integrations.sglang",
                   "integrations.peft"),
    ),
    _entry(
        code="LG002",
        slug="mixed-moe-layout",
        title="MoE adapters of different layouts in one pool",
        summary=(
            "Fused MoE LoRA kernels assume one weight layout for every adapter in a pool: "
            "shared-outer (one outer weight for all experts), per-expert, or PEFT's flat "
            "`target_parameters` layout. An adapter of another layout would be read with the "
            "wrong strides and serve garbage, so it is refused at admission."
        ),
        triggers=(
            "`LayoutRegistry.admit` of an adapter whose MoE layout differs from the layout the "
            "pool already holds.",
            "One adapter whose own MoE weights mix layouts.",
            "`lora-guard check` on a set of adapters of more than one MoE layout.",
        ),
        situations=(
            "Adapters exported by different versions of a training library.",
            "Mixing adapters trained with shared-outer MoE LoRA and per-expert LoRA on one server.",
        ),
        fixes=(
            "Serve adapters of one MoE layout per server (or per pool); release the adapters of "
            "the other layout first, or re-export them in the pool's layout.",
            "Re-export or retrain every MoE adapter with the same layout and tool version.",
            "Group adapters by layout and serve each group on its own instance.",
        ),
        example=(
            "# before: two layouts admitted into one pool\n"
            "registry.admit('math', shared_outer_weights)\n"
            "registry.admit('code', per_expert_weights)   # LG002\n"
            "\n"
            "# after: check the layout first, route to a pool that serves it\n"
            "layout = lg.detect_moe_layout(per_expert_weights)\n"
            "pools[layout].admit('code', per_expert_weights)\n"
        ),
        error="MixedMoELayoutError",
        messages={
            "pool": (
                "{subject}: its MoE layout is {layout}, but the pool holds {pool_layout} "
                "adapters (set by adapter {owner!r}); fused MoE buffers serve one layout only."
            ),
            "within": (
                "{subject}: its own MoE weights mix layouts: {first_key} is {layout} but "
                "{other_key} is {other_layout}."
            ),
            "set": (
                "{subject}: MoE layout {layout} differs from {pool_layout} of adapter {owner!r} "
                "in the same set."
            ),
        },
        raised_by=(
            "lg.LayoutRegistry.admit",
            "@lg.guard_adapter_load",
            "lg.detect_moe_layout",
            "lg.check_adapters",
            "integrations.sglang",
            "integrations.peft",
            "integrations.vllm",
        ),
    ),
    _entry(
        code="LG003",
        slug="cache-key-collision",
        title="One cache key maps to tensors of different shape or dtype",
        summary=(
            "A weight cache (sglang's pinned-weight store, a CPU LoRA cache) reuses tensors "
            "by key. When the key does not include shape and dtype, a second weight of another "
            "shape under the same key either gets the stale tensor copied into the GPU pool or "
            "overwrites a tensor another adapter still uses."
        ),
        triggers=(
            "Storing a tensor in a `GuardedCache` under a key that holds one of another shape "
            "or dtype.",
            "A `@lg.guard_cache_lookup` lookup whose cached hit differs from the weight asked for.",
        ),
        situations=(
            "A cache key built from the weight name only while adapters of different ranks load.",
            "A key scheme that omits dtype when fp16 and bf16 adapters are served together.",
        ),
        fixes=(
            "Build cache keys with lora_guard.weight_cache_key(name, ..., weight=w), which "
            "includes shape and dtype.",
            "Evict the entry when an adapter is unloaded or reconfigured "
            "(GuardedCache(store, on_collision='evict')).",
            "Make sure weights stored under one key always come from one adapter shape and dtype.",
        ),
        example=(
            "# the guard says:\n# LG003 cache-key-collision: cache key 'model.layers.0.q_proj."
            "lora_A#tp0' holds a tensor of shape (16, 64) and dtype float16, but the new weig"
            'ht has shape (8, 64) and dtype float16; the stale tensor would be served.\n'
            "# before\n"
            "cache_key = f'{layer}.{name}#tp{tp_rank}'\n"
            "# after\n"
            "cache_key = lg.weight_cache_key(layer, name, f'tp{tp_rank}', weight=weight)\n"
        ),
        error="CacheKeyCollisionError",
        messages={
            "collision": (
                "cache key {subject!r} holds a tensor of shape {old_shape} and dtype {old_dtype}, "
                "but the new weight has shape {new_shape} and dtype {new_dtype}; the stale "
                "tensor would be served."
            ),
        },
        raised_by=(
            "lg.GuardedCache",
            "@lg.guard_cache_lookup",
            "lg.cache_entry_matches",
            "integrations.sglang",
        ),
    ),
    _entry(
        code="LG004",
        slug="shape-contract",
        title="A call's arguments disagree with their declared dims",
        summary=(
            "The arguments of one call must agree with the dims declared for them: the number "
            "of dims, literal sizes, names bound across arguments (the rank of A and of B), "
            "multiples such as 2*rank, the `where` predicate and the allowed dtypes."
        ),
        triggers=(
            "A `@lg.shapes` call whose tensor has the wrong number of dims, a size that does not "
            "match a literal or a name bound by another argument, or fails `where`.",
            "An argument without a `.shape`.",
        ),
        situations=(
            "A LoRA A weight passed transposed, or A and B from adapters of different ranks.",
            "Fused qkv or gate_up weights stacked with the wrong multiple.",
        ),
        fixes=(
            "Pass tensors whose shapes match the declared dims; the message names the argument, "
            "the dim and the size it expected.",
            "If the declaration is wrong, fix the spec in the @lora_guard.shapes decorator.",
            "Pass tensors of a dtype the guard allows (cast with .to(dtype) before the call), "
            "or widen the guard's dtypes=...; with same_dtype=True every guarded argument must "
            "share one dtype.",
        ),
        variant_fixes={"dtype": 2, "same-dtype": 2},
        example=(
            "@lg.shapes(a='slots rank hidden', b='slots hidden rank')\n"
            "def set_lora(self, a, b): ...\n"
            "pool.set_lora(a, b.transpose(1, 2))   # LG004: b dim 1 is 'hidden' (64), got 16\n"
        ),
        error="ShapeContractError",
        messages={
            "ndim": (
                "{subject}: argument '{argument}' has {ndim} dims (shape {shape}), "
                "but its spec '{spec}' wants {expected_ndim}."
            ),
            "literal": (
                "{subject}: argument '{argument}' dim {axis} is {got} (shape {shape}), "
                "but its spec '{spec}' fixes it at {expected}."
            ),
            "bound": (
                "{subject}: argument '{argument}' dim {axis} should be '{dim}' = {expected} "
                "(bound by argument '{bound_by}'), but it is {got} (shape {shape}; spec '{spec}')."
            ),
            "multiple": (
                "{subject}: argument '{argument}' dim {axis} is {got} (shape {shape}), "
                "which is not a multiple of {factor} as its spec '{spec}' requires."
            ),
            "no-shape": (
                "{subject}: argument '{argument}' is a {type} with no .shape; its spec '{spec}' "
                "wants a tensor."
            ),
            "where": (
                "{subject}: the bound dims {dims} fail the guard's where= predicate."
            ),
            "dtype": (
                "{subject}: argument '{argument}' has dtype {got}, but the guard allows {expected}."
            ),
            "same-dtype": (
                "{subject}: arguments disagree on dtype: {dtypes}."
            ),
            "bad-shape": (
                "{subject}: {problem}; a guarded tensor's .shape must be at most 64 integer "
                "dims, none negative (a regular tensor, not a nested or jagged one)."
            ),
        },
        raised_by=("@lg.shapes", "lg.shapes_conform"),
    ),
    _entry(
        code="LG101",
        slug="rank-exceeds-limit",
        title="Adapter rank above the served max rank, or not an allowed rank",
        summary=(
            "A server allocates its LoRA pool for a max rank. An adapter whose `r`, or any "
            "`rank_pattern` value, is above it cannot be loaded (vLLM raises at load time) or "
            "would be truncated; an engine that only serves some ranks refuses the others."
        ),
        triggers=(
            "`r` or a `rank_pattern` value above `ServingLimits.max_rank`.",
            "A rank not in `ServingLimits.allowed_ranks`.",
        ),
        situations=(
            "A new fine-tune trained at r=64 uploaded to a server started with max rank 16.",
            "`rank_pattern` raising one module's rank above the others.",
        ),
        fixes=(
            "Start the server with a max rank at least the adapter's (vLLM --max-lora-rank, "
            "sglang --max-lora-rank), or retrain/compress the adapter to a served rank.",
            "Reduce the adapter's rank with an SVD truncation before serving it.",
            "Retrain (or SVD-truncate) the adapter to one of the ranks the server serves, or add "
            "its rank to them (lora-guard check --allowed-ranks, ServingLimits(allowed_ranks=...)"
            "); a rank under the max rank is not enough when only some ranks are served.",
        ),
        variant_fixes={"allowed": 2},
        example=(
            "# before: max_rank 16, adapter r=64\n"
            "lora-guard check ./adapters --max-rank 16      # LG101\n"
            "# after\n"
            "lora-guard check ./adapters --max-rank 64\n"
        ),
        error="AdapterError",
        messages={
            "max": "{subject}: rank {rank} of {module} is above the served max rank {max_rank}.",
            "allowed": (
                "{subject}: rank {rank} of {module} is not one of the served ranks {allowed}."
            ),
        },
        raised_by=("lg.check_adapters", "lora-guard check", "integrations.vllm",
                   "integrations.sglang", "integrations.peft"),
    ),
    _entry(
        code="LG102",
        slug="rank-inconsistent",
        title="A and B disagree on rank, or the tensors disagree with the config",
        summary=(
            "A LoRA module's A is `(r, in)` and its B is `(out, r)`. When A's rows differ from "
            "B's columns, or from the `r` (or `rank_pattern` value) in the config, the product "
            "B @ A is wrong or cannot be computed, and a server pads or scales it wrongly."
        ),
        triggers=(
            "A `lora_A` with r rows beside a `lora_B` with another number of columns.",
            "Tensor rank different from the config's `r` / `rank_pattern` for that module.",
        ),
        situations=(
            "An adapter edited or merged by hand, its config not updated.",
            "A `rank_pattern` regex that no longer matches the module names after a rename.",
        ),
        fixes=(
            "Re-save the adapter with its real rank in adapter_config.json (r or rank_pattern).",
            "Re-export the adapter from the training run; do not mix A and B from different runs.",
        ),
        example=(
            '# lora-guard check says:\n# LG102 rank-inconsistent: model.layers.0.self_attn.q_p'
            'roj has lora_A of rank 8 (shape (8, 64)) but lora_B of rank 9 (shape (64, 9)).\n'
            "# before: config r=8, tensors saved at rank 16\n"
            '{"r": 8, ...}\n'
            "# after\n"
            '{"r": 16, ...}\n'
        ),
        error="AdapterError",
        messages={
            "a-b": (
                "{subject}: {module} has lora_A of rank {rank_a} (shape {shape_a}) but lora_B of "
                "rank {rank_b} (shape {shape_b})."
            ),
            "config": (
                "{subject}: {module} has tensors of rank {rank} but the config says {config_rank}."
            ),
        },
        raised_by=("lg.check_adapters", "lora-guard check", "integrations.vllm",
                   "integrations.sglang", "integrations.peft"),
    ),
    _entry(
        code="LG103",
        slug="orphan-weight",
        title="A lora_A without its lora_B, or the reverse",
        summary=(
            "Every LoRA module needs both halves. An orphan half is either silently skipped "
            "(the module serves the base weights) or crashes the loader."
        ),
        triggers=("A weights file with `...lora_A.weight` but no matching `...lora_B.weight`.",),
        situations=(
            "A sharded trainer that saved part of the weights.",
            "Keys renamed by a conversion script for one half only.",
        ),
        fixes=(
            "Re-save the adapter so every module has both lora_A and lora_B.",
            "Drop the orphan module from the weights and from target_modules.",
        ),
        example=(
            '# lora-guard check says:\n# LG103 orphan-weight: model.layers.0.self_attn.q_proj '
            'has lora_B but no lora_A.\n'
            "# the weights must hold pairs:\n"
            "x.lora_A.weight  (r, in)\n"
            "x.lora_B.weight  (out, r)\n"
        ),
        error="AdapterError",
        messages={
            "orphan": "{subject}: {module} has {present} but no {missing}.",
        },
        raised_by=("lg.check_adapters", "lora-guard check", "integrations.vllm",
                   "integrations.sglang", "integrations.peft"),
    ),
    _entry(
        code="LG104",
        slug="unsupported-target",
        title="A weight whose module is not served, or not LoRA key grammar",
        summary=(
            "Servers apply an adapter by module name. A weight for a module the server does not "
            "serve is dropped without a word (the adapter then silently serves the base model), "
            "and a key outside PEFT's grammar is not understood at all."
        ),
        triggers=(
            "A weight module not in `ServingLimits.target_modules`.",
            "A key that is not `<module>.lora_A.weight`, `lora_B.weight`, `lora_embedding_A/B`, "
            "DoRA's magnitude vector or a `modules_to_save` weight.",
        ),
        situations=(
            "Module prefixes from another architecture (`model.layers` vs `transformer.h`).",
            "An adapter targeting `lm_head` or an MoE router the server does not serve.",
        ),
        fixes=(
            "Serve the module (add it to the server's LoRA target modules) or retrain the adapter "
            "on modules the server serves.",
            "Rename the keys to the base model's module names if the adapter was converted.",
            "Save the adapter without the full embedding weights "
            "(save_pretrained(path, save_embedding_layers=False)) when the vocabulary was not "
            "resized; if it was, merge the adapter into the resized base model and serve that.",
        ),
        example=(
            "# before: adapter targets o_proj, server serves q_proj,v_proj\n"
            "lora-guard check a --target-modules q_proj,v_proj   # LG104\n"
            "# after\n"
            "lora-guard check a --target-modules q_proj,v_proj,o_proj\n"
        ),
        error="AdapterError",
        messages={
            "module": "{subject}: module {module} ({target}) is not served; served: {served}.",
            "grammar": "{subject}: tensor key {key!r} is not LoRA key grammar.",
            "saved-embedding": (
                "{subject}: tensor key {key!r} is a full {module} weight saved with "
                "save_embedding_layers; {engine} reads saved embeddings only as "
                "'<module>.base_layer.weight' and refuses this key as an unsupported LoRA "
                "weight."
            ),
            "shared-experts-overwritten": (
                "{subject}: {module} is an indexed shared-expert weight; {engine} takes it for "
                "routed expert {index} and writes it over that expert's LoRA weights without "
                "a word."
            ),
            "shared-experts-refused": (
                "{subject}: {module} is an indexed shared-expert weight (shared_experts."
                "{index}); {engine} refuses it when it copies the adapter into its memory pool."
            ),
        },
        raised_by=("lg.check_adapters", "lora-guard check", "integrations.vllm",
                   "integrations.sglang"),
        variant_fixes={"grammar": 1, "saved-embedding": 2, "shared-experts-overwritten": 1,
                       "shared-experts-refused": 1},
    ),
    _entry(
        code="LG105",
        slug="unsupported-feature",
        title="A config feature the server does not serve",
        summary=(
            "DoRA, `lora_bias`, `bias` other than \"none\", `modules_to_save`, trainable tokens "
            "and similar features change the forward pass. A server that does not implement "
            "them either refuses the adapter or serves a different function than was trained."
        ),
        triggers=(
            "`use_dora`, `lora_bias`, `bias != \"none\"`, `modules_to_save`, "
            "`trainable_token_indices` or a non-LORA `peft_type` in the config, or their "
            "weights in the file, or an `added_tokens.json` whose token ids are at or past the "
            "base's `vocab_size`, without `ServingLimits(allow=...)` naming them.",
        ),
        situations=(
            "A DoRA fine-tune sent to vLLM, which does not serve DoRA.",
            "`modules_to_save=['lm_head']` from a classification fine-tune.",
        ),
        fixes=(
            "Retrain without {feature}, or serve the adapter on an engine that implements "
            "{feature} and allow it there (lora-guard check --allow {allow_name}, or "
            "ServingLimits(allow={{{allow_name!r}}})).",
            "Merge the feature into the base model and serve the merged model.",
            "The adapter was trained with tokens the base model does not have: merge it into "
            "the base with the resized embeddings (model.resize_token_embeddings, then "
            "merge_and_unload) and serve the merged model with the adapter's tokenizer; if "
            "the engine does serve them, allow it (lora-guard check --allow added_tokens).",
        ),
        variant_fixes={"added-tokens": 2},
        example=(
            '# lora-guard check says:\n# LG105 unsupported-feature: uses DoRA (use_dora=True),'
            ' which the server does not serve.\n'
            "# before\n"
            "LoraConfig(r=16, use_dora=True)\n"
            "# after\n"
            "LoraConfig(r=16)\n"
        ),
        error="AdapterError",
        messages={
            "feature": "{subject}: uses {feature} ({value}), which the server does not serve.",
            "saved": (
                "{subject}: uses {feature} ({value}): {saved} ({nbytes} bytes, {share}% of the "
                "weights file), which the server does not serve."
            ),
            "added-tokens": (
                "{subject}: added_tokens.json adds {count} token(s) to the vocabulary ({tokens}; "
                "ids {first}..{last}, {beyond}), which {server} does not serve."
            ),
            "hotswap-config": (
                "{subject}: the new adapter's {key} is {new!r} but the loaded adapter's is "
                "{old!r}; a hot-swap keeps the loaded adapter's {key}, so the swapped model "
                "would compute another function than the adapter was trained for."
            ),
        },
        raised_by=("lg.check_adapters", "lora-guard check", "integrations.vllm",
                   "integrations.sglang", "integrations.peft"),
    ),
    _entry(
        code="LG106",
        slug="dtype-policy",
        title="A dtype outside the allowed set, or mixed dtypes in one adapter",
        summary=(
            "Pools are allocated in one dtype. An adapter in a dtype the server does not accept, "
            "or whose tensors mix dtypes, is cast silently (losing precision) or mis-copied."
        ),
        triggers=(
            "A tensor whose dtype is not in `ServingLimits.dtypes`.",
            "LoRA tensors of more than one dtype in one adapter.",
        ),
        situations=("An fp32 export of a bf16 fine-tune; a partial conversion script.",),
        fixes=(
            "Convert the adapter to one allowed dtype before serving it "
            "(e.g. save it again after model.to(torch.bfloat16)).",
            "Widen ServingLimits(dtypes=...) if the server casts safely.",
        ),
        example=(
            "# lora-guard check says:\n# LG106 dtype-policy: LoRA tensors mix dtypes ['float16"
            "', 'float32'].\n"
            "# after\nmodel = model.to(torch.bfloat16)\nmodel.save_pretrained(path)\n"
        ),
        error="AdapterError",
        messages={
            "allowed": "{subject}: dtype {dtype} of {key} is not allowed; allowed: {allowed}.",
            "mixed": "{subject}: LoRA tensors mix dtypes {dtypes}.",
        },
        raised_by=("lg.check_adapters", "lora-guard check"),
    ),
    _entry(
        code="LG107",
        slug="empty-tensor",
        title="A zero-size tensor",
        summary=(
            "Some sharded trainers (FSDP, ZeRO-3 without gathering) save empty placeholders. "
            "A zero-size LoRA weight loads without error and contributes nothing, or breaks "
            "the slicing of a tensor-parallel server (tp > ep once sliced MoE weights to [r, 0])."
        ),
        triggers=("A tensor with a 0 in its shape.",),
        situations=("Saving an adapter from one rank of a sharded run without gathering.",),
        fixes=(
            "Gather the full state dict before saving (e.g. FSDP full_state_dict, "
            "ZeRO-3 stage3_gather_16bit_weights_on_model_save).",
        ),
        example=(
            '# lora-guard check says:\n# LG107 empty-tensor: tensor base_model.model.model.lay'
            'ers.0.self_attn.q_proj.lora_A.weight has zero size (shape (0, 64)).\n'
            "# after\nwith FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT): ...\n"
        ),
        error="AdapterError",
        messages={"empty": "{subject}: tensor {key} has zero size (shape {shape})."},
        raised_by=("lg.check_adapters", "lora-guard check", "integrations.vllm",
                   "integrations.sglang", "integrations.peft"),
    ),
    _entry(
        code="LG108",
        slug="malformed-adapter",
        title="An adapter that cannot be read safely",
        summary=(
            "Adapters are files users upload. lora_guard reads `adapter_config.json` and the "
            "safetensors header only, with strict limits, and never unpickles. A file that is "
            "unreadable, invalid, oversized, inconsistent with itself, pickled or outside the "
            "adapter folder is refused with the reason."
        ),
        triggers=(
            "A missing, unreadable or invalid `adapter_config.json`.",
            "A safetensors file with a truncated, oversized or invalid header, offsets that "
            "overlap, leave gaps or point past the file, unknown dtypes or bad shapes.",
            "A pickle `adapter_model.bin` (never unpickled).",
            "A symlink that leads out of the adapter folder.",
            "A remote store that answers with what is never followed or read: a listed path "
            "out of its folder (`..`, absolute, encoded), a listing page linking to another "
            "host, a page or a body past its size cap.",
        ),
        situations=(
            "An interrupted upload or copy; an adapter saved by an old PEFT as .bin.",
            "A hostile upload.",
        ),
        fixes=(
            "Re-save the adapter with a current PEFT (save_pretrained writes "
            "adapter_config.json and adapter_model.safetensors).",
            "Convert a .bin adapter to safetensors in a trusted environment.",
            "Copy the adapter again; check the upload was complete.",
            "Check the path: name an adapter folder (holding adapter_config.json and "
            "adapter_model.safetensors) or a folder of such folders.",
            "Keep the adapter's files inside its folder (copy them instead of linking out); a "
            "symlinked adapter folder found by a search is checked when you name it explicitly.",
            "Check that the endpoint is the store you meant (the URL, HF_ENDPOINT, "
            "AWS_ENDPOINT_URL_S3) and report the reply to its operator: a store that lists "
            "paths out of their folder or links to another host is not read, and no credential "
            "was sent there.",
        ),
        example=(
            '# lora-guard check says:\n# LG108 malformed-adapter: adapter_model.safetensors: h'
            'eader length 1016 bytes runs past the end of the file (516 bytes); the file is t'
            'runcated.\n'
            "# a pickle .bin adapter instead: convert a trusted one once, offline\n"
            "sd = torch.load('adapter_model.bin', weights_only=True)\n"
            "safetensors.torch.save_file(sd, 'adapter_model.safetensors')\n"
        ),
        error="AdapterError",
        messages={
            "malformed": "{subject}: {file}: {problem}.",
            "not-found": "{subject}: {file}: {problem}.",
            "pickle": "{subject}: {file}: {problem}.",
            "link": "{subject}: {file}: {problem}.",
            "untrusted": "{subject}: {file}: {problem}.",
        },
        variant_fixes={"not-found": 3, "pickle": 1, "link": 4, "untrusted": 5},
        raised_by=("lg.inspect_adapter", "lg.check_adapters", "lora-guard check",
                   "integrations.vllm", "integrations.sglang", "integrations.peft"),
    ),
    _entry(
        code="LG109",
        slug="base-model-mismatch",
        title="An adapter that does not fit the base model",
        summary=(
            "An adapter trained on another base model (another size, vocabulary, layer count or "
            "expert count) can load without error where only names are checked, and then serves "
            "garbage. Its A in-dims and B out-dims must match the base model's module dims."
        ),
        triggers=(
            "A weight whose in/out dims differ from the base config's (hidden, intermediate, "
            "head dims, kv heads, vocab).",
            "A layer index at or above `num_hidden_layers` (or the live model's layer count); "
            "an expert index at or above the expert count.",
            "Vision- or audio-tower weights on a text-only base model.",
            "Module names of another architecture (GPT-2's `transformer.h.0.attn.c_attn` on a "
            "Llama base), even where the sizes happen to match.",
        ),
        situations=(
            "A 7B adapter loaded onto a 1B model with the same architecture names.",
            "An adapter for a model variant with another vocabulary.",
        ),
        fixes=(
            "Serve the adapter on the base model it was trained on (see "
            "base_model_name_or_path in its config).",
            "Retrain the adapter on this base model.",
            "Serve a multimodal adapter on the multimodal base model it was trained on (whose "
            "config has the tower's vision_config/audio_config), or retrain it on the language "
            "model's modules only.",
            "Serve the adapter on a base model of the architecture it was trained on (its module "
            "names come from base_model_name_or_path's architecture); renaming the keys does "
            "not help, the weights belong to another network.",
            "Serve the adapter on the base model it was trained on; its config does not say "
            "which (base_model_name_or_path is empty): ask whoever trained it, or compare its "
            "dims with the base models you serve.",
        ),
        example=(
            "lora-guard check ./adapter --base-config ./base/config.json   # LG109\n"
        ),
        error="AdapterError",
        messages={
            "dim": (
                "{subject}: {key} has {which} dim {got}, but {module_kind} on the base model "
                "has {expected} ({source})."
            ),
            "dims": (
                "{subject}: {count} weights do not fit the base model's dims, {kinds} "
                "mismatches: {examples}{rest} (the first weight: {key})."
            ),
            "layer": (
                "{subject}: {key} is for layer {layer}, but the base model has {layers} layers."
            ),
            "expert": (
                "{subject}: {key} is for expert {expert}, but the base model has {experts} "
                "experts."
            ),
            "vocab": "{subject}: {key} has vocab dim {got}, the base model's vocab is {expected}.",
            "tower": (
                "{subject}: {key} adapts a {tower} tower, but the base model ({source}) has "
                "none (no {tower}_config); nothing would apply it."
            ),
            "architecture": (
                "{subject}: module {key} is not a module of the base model's architecture "
                "({model_type}, whose modules are named like {example}); the adapter was made "
                "for another architecture and would not be applied."
            ),
        },
        variant_fixes={"tower": 2, "architecture": 3},
        raised_by=("lg.check_adapters", "lora-guard check", "integrations.vllm",
                   "integrations.sglang", "integrations.peft"),
    ),
    _entry(
        code="LG110",
        slug="too-many-adapters",
        title="More adapters than the served slot count",
        summary=(
            "A server has a fixed number of adapter slots (vLLM max_loras, sglang "
            "max_loras_per_batch). A set, or a batch, that needs more adapters than slots "
            "cannot be served together: sglang's scheduler once died on an assert for it."
        ),
        triggers=("`check_adapters` of more adapters than `ServingLimits.max_loras`.",),
        situations=("A batch that mixes requests for more adapters than the pool holds.",),
        fixes=(
            "Raise the slot count (vLLM --max-loras, sglang --max-loras-per-batch) or split the "
            "adapters over servers.",
            "Raise the engine's limit on loaded adapters (sglang --max-loaded-loras) or split "
            "the adapters over servers.",
        ),
        example="lora-guard check ./adapters --max-loras 8   # LG110 with 9 adapters\n",
        error="AdapterError",
        messages={
            "count": "{subject}: {count} adapters, but the server has {max_loras} slots.",
            "loaded": (
                "{subject}: {count} adapters to hold loaded, but {engine} holds at most "
                "{limit} (--max-loaded-loras) and refuses to load more; "
                "--max-loras-per-batch ({per_batch}) is per batch, not a limit on the set."
            ),
        },
        variant_fixes={"loaded": 1},
        raised_by=("lg.check_adapters", "lora-guard check"),
    ),
    _entry(
        code="LG111",
        slug="packed-rank-mismatch",
        title="Ranks that differ within one packed module",
        summary=(
            "Engines that stack q/k/v into one `qkv_proj` buffer (and gate/up into "
            "`gate_up_proj`) hold one rank per packed module. An adapter whose `rank_pattern` "
            "gives the parts of one packed module different ranks cannot be stacked: sglang "
            "refuses it when it loads the weights."
        ),
        triggers=(
            "`lora-guard check --engine sglang` of an adapter whose `rank_pattern` gives "
            "`q_proj`, `k_proj` and `v_proj` (or `gate_proj` and `up_proj`) of one layer "
            "different ranks.",
        ),
        situations=("A `rank_pattern` tuned per projection, e.g. `{\"k_proj\": 4}` with r=8.",),
        fixes=(
            "Give the parts of each packed module one rank (retrain with a rank_pattern keyed "
            "on whole layers, or no rank_pattern), or serve the adapter with an engine that "
            "keeps the parts apart (vLLM, PEFT).",
            "Give the experts of each MoE projection one rank (retrain without a per-expert "
            "rank_pattern), or serve the adapter with PEFT.",
        ),
        example=(
            '# lora-guard check says:\n# LG111 packed-rank-mismatch: qkv_proj of model.layers.'
            '0.self_attn stacks k_proj, q_proj, v_proj of ranks k_proj=16, q_proj=8, v_proj=8'
            '; sglang==0.5.23 holds one rank per packed module and refuses it.\n'
            "# before\nLoraConfig(r=8, target_modules=[\"q_proj\", \"k_proj\", \"v_proj\"],\n"
            "           rank_pattern={\"k_proj\": 4})\n"
            "# after\nLoraConfig(r=8, target_modules=[\"q_proj\", \"k_proj\", \"v_proj\"])\n"
        ),
        error="AdapterError",
        messages={
            "packed": (
                "{subject}: {packed} of {layer} stacks {parts} of ranks {ranks}; {engine} holds "
                "one rank per packed module and refuses it."
            ),
            "experts": (
                "{subject}: the experts of {packed} have different ranks ({ranks}); {engine} "
                "packs one rank per MoE projection and refuses it."
            ),
        },
        raised_by=("lg.check_adapters", "lora-guard check"),
        variant_fixes={"experts": 1},
    ),
    _entry(
        code="LG112",
        slug="scaling-not-honoured",
        title="A per-module scaling the engine does not compute",
        summary=(
            "PEFT scales each module's update by `lora_alpha / r` (`/ sqrt(r)` with rsLoRA), "
            "with `rank_pattern` and `alpha_pattern` giving a module its own rank and alpha. "
            "An engine that computes one scaling for the whole adapter from `lora_alpha` and "
            "`r` (sglang) loads such an adapter without a word and serves every module whose "
            "own scaling differs at the wrong strength."
        ),
        triggers=(
            "`lora-guard check --engine sglang` of an adapter with `use_rslora`, or whose "
            "`rank_pattern` / `alpha_pattern` gives a module another `alpha / r` than the "
            "adapter's.",
        ),
        situations=("rsLoRA fine-tunes; rank or alpha tuned per module.",),
        fixes=(
            "Fold the scaling into the weights (multiply each module's lora_B by its own "
            "scaling divided by lora_alpha / r) and save the adapter again without "
            "use_rslora, rank_pattern or alpha_pattern, or serve it with vLLM or PEFT, which "
            "honour them.",
        ),
        example=(
            '# lora-guard check says:\n# LG112 scaling-not-honoured: model.layers.0.self_attn.'
            'v_proj (and 1 more) is scaled by 4 in PEFT (alpha 32), but sglang==0.5.23 scales'
            ' the whole adapter by lora_alpha / r = 1.\n'
            "# before\nLoraConfig(r=16, lora_alpha=16, use_rslora=True)\n"
            "# after (for sglang)\nLoraConfig(r=16, lora_alpha=16)\n"
        ),
        error="AdapterError",
        messages={
            "scaling": (
                "{subject}: {module} is scaled by {expected} in PEFT ({why}), but {engine} "
                "scales the whole adapter by lora_alpha / r = {served}."
            ),
            "experts": (
                "{subject}: the MoE experts {module} are scaled by {expected} in PEFT "
                "(rsLoRA), but {engine} packs them with lora_alpha / r = {served}."
            ),
        },
        raised_by=("lg.check_adapters", "lora-guard check"),
    ),
    _entry(
        code="LG115",
        slug="no-weights",
        title="An adapter that holds no tensors",
        summary=(
            "An adapter folder whose weights file holds no tensor at all loads without error "
            "on every engine and then serves the base model: the fine-tune is simply not there. "
            "It is what a ZeRO-3 save without gathering, an interrupted upload or a save from "
            "the wrong process leaves behind."
        ),
        triggers=("An `adapter_model.safetensors` whose header lists no tensor.",),
        situations=(
            "DeepSpeed ZeRO-3 saving the adapter without gathering the partitioned weights.",
            "`save_pretrained` called on a rank that holds no parameters; an upload cut short.",
        ),
        fixes=(
            "Save the adapter again from the training run with the weights gathered (ZeRO-3: "
            "stage3_gather_16bit_weights_on_model_save, or save from rank 0 after "
            "accelerator.get_state_dict(model)), then check that adapter_model.safetensors "
            "lists lora_A/lora_B tensors.",
        ),
        example=(
            "lora-guard check ./adapter\n"
            "# adapter './adapter': adapter_model.safetensors holds no tensors; the adapter "
            "would serve the base model unchanged.   [LG115]\n"
        ),
        error="AdapterError",
        messages={
            "empty": (
                "{subject}: {file} holds no tensors; the adapter would serve the base model "
                "unchanged."
            ),
        },
        raised_by=("lg.check_adapters", "lora-guard check", "integrations.peft"),
    ),
    _entry(
        code="LG116",
        slug="unconverted-init",
        title="A PiSSA, OLoRA, CorDA, LoRA-GA or LoftQ adapter that was never converted",
        summary=(
            "PiSSA, OLoRA, CorDA and LoRA-GA initialise the adapter from the base weights and "
            "subtract that start from them; LoftQ replaces them with a quantised residual. The "
            "adapter is only right on top of that rewritten base: on the original base model it "
            "serves garbage, without any error. PEFT converts such an adapter into a plain LoRA "
            "(of twice the rank) that serves on the original base when it is saved with "
            "`path_initial_model_for_weight_conversion`; a converted adapter says "
            "`init_lora_weights: true`."
        ),
        triggers=(
            "`init_lora_weights` in `adapter_config.json` is `pissa`, `pissa_niter_<n>`, "
            "`olora`, `corda`, `lora_ga` or `loftq`.",
        ),
        situations=(
            "`model.save_pretrained(out)` at the end of a PiSSA or OLoRA fine-tune, without "
            "`path_initial_model_for_weight_conversion`.",
            "A LoftQ adapter served on the unquantised base model.",
        ),
        fixes=(
            "Convert it: save the initial adapter right after get_peft_model "
            "(peft_model.peft_config['default'].init_lora_weights = True; "
            "peft_model.save_pretrained('init')), then save the trained one with "
            "save_pretrained(out, path_initial_model_for_weight_conversion='init'); serve the "
            "converted adapter (twice the rank) on the original base.",
            "If you serve it on the rewritten base model it was trained with (the residual "
            "model PiSSA/OLoRA/CorDA saved, or LoftQ's quantised base), it is right: ignore the "
            "code for that server (lora-guard check --ignore LG116).",
        ),
        example=(
            "# before: a PiSSA fine-tune saved as is\n"
            "peft_model.save_pretrained('out')                    # LG116\n"
            "# after: converted to a plain LoRA that serves on the original base\n"
            "peft_model.save_pretrained('out', path_initial_model_for_weight_conversion='init')\n"
        ),
        error="AdapterError",
        messages={
            "init": (
                "{subject}: initialised with {method} (init_lora_weights={value!r}) and never "
                "converted; {method} rewrote the base weights, so on the original base model "
                "it serves garbage."
            ),
        },
        raised_by=("lg.check_adapters", "lora-guard check"),
    ),
    _entry(
        code="LG117",
        slug="not-lora",
        title="A PEFT method other than LoRA",
        summary=(
            "LoHa, LoKr, IA3, VeRA, AdaLoRA, OFT, BOFT, prompt tuning and the other PEFT methods "
            "save weights that are not LoRA's A and B matrices (Hadamard or Kronecker factors, "
            "scaling vectors, rotations, prompts). A LoRA server cannot serve them: it refuses "
            "them or, where it reads the keys it knows, serves something else."
        ),
        triggers=("`peft_type` in `adapter_config.json` is anything but `LORA`.",),
        situations=(
            "An IA3 or LoHa fine-tune uploaded to a vLLM or sglang LoRA endpoint.",
            "An AdaLoRA adapter (it has lora_A/lora_B, but also lora_E and a budget of ranks).",
        ),
        fixes=(
            "Serve it with PEFT (PeftModel.from_pretrained), or merge it into the base model "
            "(merge_and_unload) and serve the merged model; or retrain with LoraConfig.",
        ),
        example=(
            "# before: IA3Config(...)                 # LG117: serves LoRA only\n"
            "# after\n"
            "LoraConfig(r=16, target_modules=['q_proj', 'v_proj'])\n"
        ),
        error="AdapterError",
        messages={
            "method": (
                "{subject}: {file}: peft_type {peft_type!r} is {method}, another PEFT method "
                "than LoRA; the server serves LoRA only."
            ),
        },
        raised_by=("lg.check_adapters", "lora-guard check", "lg.inspect_adapter",
                   "integrations.vllm", "integrations.sglang"),
    ),
    _entry(
        code="LG118",
        slug="base-weights-in-adapter",
        title="Full base-model weights shipped inside an adapter",
        summary=(
            "PEFT saves whole base-model weights into an adapter when an embedding is targeted "
            "(`save_embedding_layers`, e.g. `embed_tokens.base_layer.weight`) or a module is in "
            "`modules_to_save` (e.g. `lm_head.weight`). A LoRA server applies only the A and B "
            "halves and keeps the base model's own copy of those weights, so the adapter serves "
            "another function whenever they were resized (added tokens) or trained; and every "
            "copy of the adapter carries the cost."
        ),
        triggers=(
            "`<embedding>.base_layer.weight` in the weights (an embedding targeted with "
            "`save_embedding_layers` on or `auto`), checked without a base config to compare "
            "its vocabulary with (with one, a vocabulary that differs is LG109).",
            "`modules_to_save` weights are LG105, whose message gives their size too.",
        ),
        situations=(
            "`target_modules` including `embed_tokens` or `lm_head`, saved with the default "
            "`save_embedding_layers='auto'`.",
            "A tokenizer resized for new tokens before training.",
        ),
        fixes=(
            "Check it against the base model (lora-guard check --base-config config.json): "
            "with the base model's vocabulary it serves, with another it is LG109. If the "
            "vocabulary was not resized, save with save_pretrained(path, "
            "save_embedding_layers=False): the adapter loses those bytes and serves the same; "
            "if it was resized, serve the resized base model (or merge the adapter into it).",
        ),
        example=(
            "# before: embed_tokens targeted, its full weight saved too\n"
            "peft_model.save_pretrained('out')                              # LG118\n"
            "# after (vocabulary unchanged)\n"
            "peft_model.save_pretrained('out', save_embedding_layers=False)\n"
        ),
        error="AdapterError",
        messages={
            "embedding": (
                "{subject}: ships the full base weight {key} ({shape}, {nbytes} bytes, "
                "{share}% of the weights file); a LoRA server keeps the base model's own "
                "{module} and drops it, which is right only if the vocabulary was not resized "
                "(no base config to compare with)."
            ),
        },
        raised_by=("lg.check_adapters", "lora-guard check"),
    ),
    _entry(
        code="LG119",
        slug="noop-adapter",
        title="lora_B all zeros: the adapter does nothing",
        summary=(
            "PEFT initialises every lora_B to zeros, so B @ A is zero until training moves B. "
            "An adapter saved before training, or whose trained B was lost (a save from the "
            "wrong process, a failed merge, a bug in a conversion script), loads and serves "
            "without any error and computes exactly the base model. No engine can tell: it "
            "takes the values, not the header. Found by the opt-in value scan "
            "(`lora-guard check --scan-values`)."
        ),
        triggers=(
            "Every value of a module's `lora_B` (or `lora_embedding_B`) is zero, in the value "
            "scan.",
        ),
        situations=(
            "`save_pretrained` called right after `get_peft_model`, before `trainer.train()`.",
            "Training with a learning rate of 0, or with the LoRA parameters frozen.",
            "A checkpoint of the wrong step or process uploaded.",
        ),
        fixes=(
            "Check the training run: save the adapter after training from the process that "
            "trained it (trainer.save_model() or model.save_pretrained() after train()), with "
            "the LoRA parameters trainable (model.print_trainable_parameters()) and a learning "
            "rate above 0.",
        ),
        example=(
            "lora-guard check --scan-values ./adapter\n"
            "# adapter './adapter': lora_B is all zeros in every one of its 4 modules "
            "(model.layers.0.self_attn.q_proj and 3 more): the adapter computes the base "
            "model unchanged.   [LG119]\n"
        ),
        error="AdapterError",
        messages={
            "all": (
                "{subject}: lora_B is all zeros in every one of its {count} modules "
                "({modules}): the adapter computes the base model unchanged."
            ),
            "some": (
                "{subject}: lora_B is all zeros in {count} of its {total} modules "
                "({modules}): those modules compute nothing."
            ),
        },
        raised_by=("lg.check_adapters(scan_values=True)", "lora-guard check --scan-values"),
    ),
    _entry(
        code="LG120",
        slug="non-finite-weights",
        title="NaN or Inf values in an adapter's weights",
        summary=(
            "A training run that diverged (fp16 overflow, a learning rate too high) can save "
            "LoRA weights holding NaN or Inf. They load without a word and turn every output "
            "that passes through the module into NaN. Found by the opt-in value scan "
            "(`lora-guard check --scan-values`)."
        ),
        triggers=("A NaN or an infinite value in any floating-point tensor, in the value scan.",),
        situations=(
            "fp16 training without loss scaling; a loss spike before the checkpoint was saved.",
        ),
        fixes=(
            "Save the adapter from an earlier, finite checkpoint, or retrain with bf16 or fp32, "
            "loss scaling and a lower learning rate; check torch.isfinite on the weights "
            "before uploading.",
        ),
        example=(
            "lora-guard check --scan-values ./adapter\n"
            "# adapter './adapter': tensor ...q_proj.lora_A.weight holds 3 NaN and 0 Inf values "
            "(of 512).   [LG120]\n"
        ),
        error="AdapterError",
        messages={
            "values": (
                "{subject}: tensor {key} holds {nan} NaN and {inf} Inf values (of "
                "{numel}); every output through it becomes NaN."
            ),
        },
        raised_by=("lg.check_adapters(scan_values=True)", "lora-guard check --scan-values"),
    ),
    _entry(
        code="LG121",
        slug="zero-scaling",
        title="A scaling of zero: lora_alpha 0",
        summary=(
            "A LoRA module adds (alpha / r) * B @ A to the base output. With `lora_alpha` 0 "
            "(or an `alpha_pattern` value 0) that scaling is 0, so the module adds nothing "
            "whatever its weights hold, and the adapter loads and serves the base model. Read "
            "from the config: reported by every check, not only the value scan."
        ),
        triggers=("`lora_alpha: 0`, or an `alpha_pattern` value 0, in `adapter_config.json`.",),
        situations=(
            "A config written by a script that lost lora_alpha (0 as a placeholder).",
            "An alpha_pattern meant to switch modules off, left in a released adapter.",
        ),
        fixes=(
            "Set lora_alpha in adapter_config.json to the value the adapter was trained with "
            "(often r or 2*r; see the training config), or retrain with a non-zero lora_alpha.",
        ),
        example=(
            "# before\n"
            '{"r": 16, "lora_alpha": 0, ...}      # LG121\n'
            "# after\n"
            '{"r": 16, "lora_alpha": 32, ...}\n'
        ),
        error="AdapterError",
        messages={
            "config": (
                "{subject}: {where} is {value}, so the scaling alpha/r of {modules} is 0: the "
                "adapter adds nothing there."
            ),
        },
        raised_by=("lg.check_adapters", "lora-guard check"),
    ),
    _entry(
        code="LG140",
        slug="remote-adapter-unreadable",
        title="A remote adapter that could not be fetched",
        summary=(
            "An adapter named by URL (`hf://ORG/REPO[@REV][/SUB]`, a bare Hub id `ORG/NAME`, "
            "`s3://BUCKET/PREFIX`, `https://...`) is checked from ranged reads of its "
            "`adapter_config.json` and safetensors header (credentials from huggingface_hub and "
            "botocore), each read within a total deadline. When the object is missing, access "
            "is denied, a read comes back short, a redirect leads to another host, or the store "
            "stays unreachable after the retries or past the deadline, that adapter is reported "
            "with the reason and the rest of the run goes on. What the files hold, once read, "
            "is checked as for a local adapter (LG108 for a bad header)."
        ),
        triggers=(
            "A URL, bucket, key, repo, revision or subfolder that does not exist.",
            "Credentials missing, expired or without read access (HTTP 401/403, S3 AccessDenied, "
            "a gated or private Hub repo).",
            "A read that returned fewer bytes than asked, or an object that changed size between "
            "the listing and the read.",
            "An HTTP(S) redirect to another host.",
            "Timeouts, throttling (429, SlowDown) or server errors that outlast the retries.",
        ),
        situations=(
            "A typo in a prefix or repo id; a bare `ORG/NAME` meant as a local folder that is "
            "not there (it is then read from the Hub).",
            "A CI job whose role or token cannot read the adapters' bucket or repo.",
            "An upload still in progress while the check runs.",
        ),
        fixes=(
            "Check the URL: bucket and prefix, repo id, revision and subfolder (list it with "
            "`aws s3 ls` or `hf download --dry-run`); a local folder needs a path that exists.",
            "Give the library its usual credentials: AWS_PROFILE or AWS_ACCESS_KEY_ID/"
            "AWS_SECRET_ACCESS_KEY (or an instance role) for S3, HF_TOKEN or `hf auth login` for "
            "the Hub, and check they may read this object.",
            "Run the check again once the upload is complete; if the read stays short, upload "
            "the adapter again.",
            "Name the final URL: a redirect to another host is not followed.",
            "Retry later, or raise LORA_GUARD_REMOTE_TIMEOUT / LORA_GUARD_REMOTE_DEADLINE / "
            "LORA_GUARD_REMOTE_RETRIES; lower "
            "LORA_GUARD_REMOTE_WORKERS if the store throttles.",
        ),
        example=(
            '# lora-guard check says:\n'
            "# LG140 remote-adapter-unreadable: adapter 's3://my-bucket/loras/math':\n"
            '# adapter_config.json: access denied (HTTP 403).\n'
            "lora-guard check s3://my-bucket/loras/ hf://my-org/math-lora@v2\n"
            "AWS_PROFILE=reader lora-guard check s3://my-bucket/loras/   # the credentials "
            "that may read it\n"
        ),
        error="AdapterError",
        messages={
            "not-found": "{subject}: {file}: {problem}.",
            "denied": "{subject}: {file}: {problem}.",
            "truncated": "{subject}: {file}: {problem}.",
            "redirect": "{subject}: {file}: {problem}.",
            "unreachable": "{subject}: {file}: {problem}.",
        },
        variant_fixes={"denied": 1, "truncated": 2, "redirect": 3, "unreachable": 4},
        raised_by=("lg.inspect_adapter", "lg.check_adapters", "lora-guard check"),
    ),
    _entry(
        code="LG201",
        slug="registry-inconsistent",
        title="Adapter/slot bookkeeping disagrees with itself",
        summary=(
            "A pool keeps a map from adapter to slot and its inverse. When they stop being exact "
            "inverses, hold stale entries, or a batch needs more slots than exist, requests are "
            "served with another adapter's weights."
        ),
        triggers=(
            "`uid_to_slot` and `slot_to_uid` that are not inverse, a slot out of range, "
            "a batch with more adapters than slots, a config left behind by a failed load.",
        ),
        situations=(
            "An exception part-way through a load leaving the maps half updated.",
            "Eviction that updates one map and not the other.",
        ),
        fixes=(
            "Update both maps in one step, and undo both on failure; check with "
            "lora_guard.assert_slot_maps_consistent after each change.",
            "Bound a batch's adapters by the slot count before scheduling it.",
        ),
        example=(
            '# lg.assert_slot_maps_consistent raises:\n'
            "# LG201 registry-inconsistent: slot map: adapter 'sql' maps to slot 1, but slot 1\n"
            "# holds 'code'.\n"
            "# before\n"
            "uid_to_slot[uid] = slot            # slot_to_uid not updated\n"
            "# after\n"
            "uid_to_slot[uid] = slot; slot_to_uid[slot] = uid\n"
            "lg.assert_slot_maps_consistent(uid_to_slot, slot_to_uid, slots=S)\n"
        ),
        error="RegistryError",
        messages={
            "not-inverse": (
                "{subject}: adapter {uid!r} maps to slot {slot}, but slot {slot} holds {other}."
            ),
            "stale": "{subject}: slot {slot} holds {uid!r}, but {uid!r} maps to {mapped}.",
            "range": "{subject}: adapter {uid!r} maps to slot {slot}, outside 0..{last}.",
            "exhausted": "{subject}: {needed} adapters needed at once, but only {slots} slots.",
            "stale-config": "{subject}: {uid!r} is in {where} but not loaded.",
        },
        raised_by=("lg.assert_slot_maps_consistent", "integrations.sglang", "integrations.vllm"),
    ),
    _entry(
        code="LG202",
        slug="engine-config-form",
        title="An adapter config the engine reads in another form than PEFT wrote it",
        summary=(
            "PEFT accepts forms of `adapter_config.json` that a serving engine reads "
            "differently or not at all. sglang 0.5.23 takes `target_modules` only as a list of "
            "module names or the strings `all` / `all-linear`: a regex string (PEFT's "
            "`target_modules=r'.*\\.(q_proj|v_proj)'`) fails the load, at start-up it stops "
            "the server. lora_guard says so before the engine reads a tensor, with the form "
            "the engine takes."
        ),
        triggers=(
            "sglang (the integration, and `lora-guard check --engine sglang`): "
            "`target_modules` is a string other than `all` or `all-linear`.",
        ),
        situations=(
            "An adapter trained with a regex `target_modules`, served on sglang.",
        ),
        fixes=(
            "Re-save the adapter's config with `target_modules` as the list of module names "
            "it trained (the leaf names of its weight keys, e.g. [\"q_proj\", \"v_proj\"]).",
        ),
        example=(
            "# before: adapter_config.json {\"target_modules\": \".*\\\\.(q_proj|v_proj)\"}"
            "   # LG202 on sglang\n"
            "# after:  adapter_config.json {\"target_modules\": [\"q_proj\", \"v_proj\"]}\n"
        ),
        error="AdapterError",
        messages={
            "target-string": (
                "{subject}: target_modules is the string {value!r}; {engine} reads "
                "target_modules only as a list of module names or 'all' / 'all-linear'."
            ),
        },
        raised_by=("integrations.sglang", "lora-guard check --engine sglang"),
    ),
    _entry(
        code="LG301",
        slug="rank-divergence",
        title="Tensor-parallel ranks disagree",
        summary=(
            "Every tensor-parallel rank must hold the same pool shapes, slot map and adapter "
            "set; otherwise ranks compute with different adapters and all-reduce garbage. "
            "Python hash seeds differ per process, so iteration order alone can diverge."
        ),
        triggers=("`assert_rank_consistent` finding a fingerprint that differs between ranks.",),
        situations=(
            "Slot order taken from a set or dict whose order depends on the hash seed.",
            "tp > kv heads making ranks allocate different buffer shapes.",
            "A load that failed on one rank only.",
        ),
        fixes=(
            "Derive slot order and pool shapes deterministically (sorted ids, shapes from the "
            "config, not the local shard), and load adapters on all ranks or none.",
            "When a rank does not answer: read the logs of the rank that died or hung, make "
            "every rank call the check at the same point, and restart the job; raise "
            "timeout=... only for ranks that are slow but healthy.",
        ),
        example=(
            '# lg.assert_rank_consistent raises, on every rank:\n'
            '# LG301 rank-divergence: slot map: ranks [1] differ from rank 0 at\n'
            "# state['uid_to_slot']['chat']: rank 1 has 0, rank 0 has 2.\n"
            "# before\n"
            "for slot, uid in enumerate(set(batch_uids)): ...\n"
            "# after\n"
            "for slot, uid in enumerate(sorted(batch_uids)): ...\n"
            "lg.assert_rank_consistent(pool_state)\n"
        ),
        error="RankDivergenceError",
        messages={
            "diverged": "{subject}: ranks {ranks} differ from rank {reference} at {path}: {diff}.",
            "timeout": "{subject}: no answer from ranks within {timeout} s ({problem}).",
            "protocol": (
                "{subject}: ranks {ranks} run another lora_guard release than rank {reference} "
                "({diff}); their checks cannot be compared: run one lora_guard release on "
                "every rank."
            ),
        },
        raised_by=("lg.assert_rank_consistent", "@lg.guard_rank_consistency"),
    ),
    _entry(
        code="LG900",
        slug="internal-error",
        title="A bug in lora_guard's checker",
        summary=(
            "The checker itself failed while checking an adapter: an exception that says "
            "nothing about the adapter's files (a TypeError, KeyError, ... inside lora_guard). "
            "It is reported as a bug with the place it happened, never as a verdict on the "
            "adapter (an unreadable file stays LG108), and the other adapters are still "
            "checked. With LORA_GUARD_DEBUG=1 the exception is raised with its traceback."
        ),
        triggers=(
            "`lg.check_adapters` or `lora-guard check` hitting an unexpected exception in "
            "its own code while reading or checking one adapter.",
        ),
        situations=(
            "An adapter shape or config field the checker was not written for.",
            "A newer PEFT or engine release than this lora_guard knows.",
        ),
        fixes=(
            "Run the check again with LORA_GUARD_DEBUG=1 to get the traceback, and report it "
            "to the lora_guard maintainers (the project's issue tracker) with the traceback "
            "and the adapter's adapter_config.json (no weights needed: the header's keys and "
            "shapes are enough); until it is fixed the adapter is not checked, so do not "
            "serve it on this verdict alone.",
        ),
        example=(
            "# lora-guard check says:\n"
            "# LG900 internal-error: adapter 'math': lora_guard's checker failed with KeyError\n"
            "# ('lora_B') at check_adapters.py:412; this is a bug in lora_guard, not a verdict\n"
            "# on the adapter.\n"
            "LORA_GUARD_DEBUG=1 lora-guard check ./adapters/math   # the traceback to report\n"
        ),
        error="AdapterError",
        messages={
            "internal": (
                "{subject}: lora_guard's checker failed with {error} ({problem}) at {where}; "
                "this is a bug in lora_guard, not a verdict on the adapter."
            ),
        },
        raised_by=("lg.check_adapters", "lora-guard check"),
    ),
)

_REGISTRY: dict[str, Invariant] = {}
_ORDER: tuple[str, ...] = ()  # the codes in code order, replaced whole on each change
_BUILT_IN: frozenset[str] = frozenset(e.code for e in _ENTRIES)
_CODE = re.compile(r"LG\d{3}")
_SLUG = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


def register(invariant: Invariant) -> Invariant:
    """Add ``invariant`` to the catalogue, kept in code order; return it.

    Refuses (ValueError, the catalogue unchanged) a code that is not ``LG`` and three digits,
    a code or slug already registered, a slug that is not kebab-case, or an entry without a
    fix or a message.
    """
    if not isinstance(invariant, Invariant):
        raise TypeError(f"register() takes an Invariant, got {type(invariant).__name__}")
    problem = _problem(invariant)
    if problem:
        raise ValueError(f"cannot register invariant {invariant.code!r}: {problem}")
    global _ORDER
    _REGISTRY[invariant.code] = invariant  # no entry is ever missing, even for an instant
    _ORDER = tuple(sorted(_REGISTRY))
    return invariant


def _problem(invariant: Invariant) -> str | None:
    if not _CODE.fullmatch(invariant.code):
        return "a code is 'LG' and three digits, such as 'LG150'"
    if invariant.code in _REGISTRY:
        return f"the code is taken by {_REGISTRY[invariant.code].slug!r}; pick a free number"
    if not _SLUG.fullmatch(invariant.slug):
        return f"the slug {invariant.slug!r} is not kebab-case (e.g. 'zero-scaling')"
    taken = [inv.code for inv in _REGISTRY.values() if inv.slug == invariant.slug]
    if taken:
        return f"the slug {invariant.slug!r} is taken by {taken[0]}"
    if not invariant.fixes or not invariant.messages:
        return "an entry needs at least one fix and one message template"
    return None


def unregister(code: str) -> None:
    """Remove an invariant added with `register` (a test's made-up one); the built-in
    entries stay. Unknown codes are ignored."""
    global _ORDER
    if code in _BUILT_IN:
        raise ValueError(f"{code} is a built-in invariant of lora_guard; it cannot be removed")
    _ORDER = tuple(c for c in _ORDER if c != code)
    _REGISTRY.pop(code, None)


class _Catalogue(Mapping[str, Invariant]):
    """The registry as users read it: read-only, in code order. Registering a code (an
    ``adapter_invariant`` of a plugin, at its import) adds it in place, so a thread reading
    the catalogue meanwhile never finds an entry missing."""

    __slots__ = ()

    def __getitem__(self, code: str) -> Invariant:
        return _REGISTRY[code]

    def __contains__(self, code: object) -> bool:
        return code in _REGISTRY

    def __iter__(self) -> Iterator[str]:
        return iter(_ORDER)

    def __len__(self) -> int:
        return len(_ORDER)

    def __repr__(self) -> str:
        return f"<lora_guard.INVARIANTS: {', '.join(_ORDER)}>"


for _inv in _ENTRIES:
    register(_inv)
del _inv

INVARIANTS: Mapping[str, Invariant] = _Catalogue()
"""Every invariant, by code: the single source of codes, messages, hints and docs.

A read-only mapping of code to `Invariant`; errors, `lora-guard explain`, the pytest summary
and the invariants reference all read it.

Example:
    >>> import lora_guard as lg
    >>> [code for code in lg.INVARIANTS if code.startswith("LG00")]
    ['LG001', 'LG002', 'LG003', 'LG004']
    >>> lg.INVARIANTS["LG002"].slug
    'mixed-moe-layout'
"""
