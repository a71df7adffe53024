"""The checks of one adapter, from its spec: `check_spec` (every code one adapter can break,
in report order) and `spec_violations` (the same for a guard that holds the spec)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace
from typing import Any

from lora_guard._checking.checks import check_moe_layouts
from lora_guard._checking.limits import ServingLimits, limits_argument, names, positive_int
from lora_guard._checking.registry import adapter_codes, registered_violations, report_rank
from lora_guard._checking.rules.engine_rules import engine_rules, is_served
from lora_guard._checking.rules.lg109_base import (
    base_model_hint,
    check_dims,
    check_saved_embeddings,
    dims_violation,
)
from lora_guard._checking.rules.recipe_outcome import ModuleOutcome, RecipeOutcome
from lora_guard._checking.rules.shared import (
    FEATURE_TEXT,
    MAX_PER_KIND,
    Expected,
    Grouped,
    more,
    share,
)
from lora_guard._core.errors import Violation, make_violation
from lora_guard._reading.adapters import (
    FEATURES,
    AdapterSpec,
    LoRAModuleSpec,
    init_method,
    parameter_key,
    pattern_value,
)

__all__ = ["check_spec", "spec_violations"]

_RERUN_INITS = ("pissa", "olora")  # deterministic: PEFT's loading rewrites the base again


def _zero_scaling(subject: str, spec: AdapterSpec) -> list[Violation]:
    """LG121: ``lora_alpha`` 0 (or an ``alpha_pattern`` value 0) scales B @ A by 0."""
    found: list[Violation] = []
    alpha = spec.config.get("lora_alpha")
    pattern = spec.config.get("alpha_pattern") or {}
    if alpha == 0:
        overridden = {m for m in spec.modules
                      if pattern_value(pattern, m) not in (None, 0)}
        zero = [m for m in spec.modules if m not in overridden]
        if zero or not spec.modules:
            found.append(make_violation(
                "LG121", "config", subject, where="lora_alpha", value=alpha,
                modules=more(zero[0], len(zero)) if zero else "every module"))
    for key, value in pattern.items():
        if value == 0:
            hit = [m for m in spec.modules if pattern_value(pattern, m) == 0]
            found.append(make_violation(
                "LG121", "config", subject, where=f"alpha_pattern[{key!r}]", value=value,
                modules=more(hit[0], len(hit)) if hit else "no module of this adapter"))
    return found



class _ConfigRank:
    """The rank the config gives a module: ``rank_pattern``'s first match, else ``r``."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.pattern = config.get("rank_pattern") or {}
        self.r = int(config["r"])

    def __call__(self, module: LoRAModuleSpec) -> int:
        if not self.pattern:
            return self.r
        value = pattern_value(self.pattern,
                              parameter_key(module.module, module.target, module.kind))
        return int(value) if value is not None else self.r


def _conv_groups(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """The ``groups`` of a grouped convolution's LoRA, or 0 when the halves do not show one.

    PEFT gives a conv LoRA's B the base layer's groups, so B is ``(out, r / groups, ...)``
    while A is ``(r, in, ...)``: the groups must divide the rank, the in and the out channels.
    """
    if len(a) < 2 or len(b) < 2 or b[1] <= 0 or a[0] % b[1]:
        return 0
    groups = a[0] // b[1]
    return groups if a[1] % groups == 0 and b[0] % groups == 0 else 0


def _check_ranks(subject: str, module: LoRAModuleSpec, expected: int,
                 found: list[Violation], grouped: Grouped) -> None:
    """LG102: A's rank against B's, and against the config's."""
    a, b = module.a_shape, module.b_shape
    if a is None or b is None:
        return
    if module.kind == "moe-packed":
        factor = 2 if "gate_up" in module.target or "w13" in module.target else 1
        rank_a = a[-2] // factor if len(a) == 3 else None
        rank_b = b[-1] if len(b) == 3 else None
        agree = len(a) == 3 and len(b) == 3 and a[-2] == factor * b[-1]
    else:  # linear A (r, in), B (out, r); conv the same with kernel dims after them
        ndim = 2 if module.kind != "conv" else max(len(a), len(b))
        rank_a = a[0] if len(a) == ndim else None
        rank_b = b[1] if len(b) == ndim else None
        agree = len(a) == ndim and len(b) == ndim and (
            a[0] == b[1] or (module.kind == "conv" and _conv_groups(a, b) > 1))
    if not agree:
        found.append(make_violation(
            "LG102", "a-b", subject, module=module.module, rank_a=rank_a, rank_b=rank_b,
            shape_a=a, shape_b=b))
        return
    rank = module.rank if module.rank is not None else rank_a
    if module.kind == "moe-flat" and module.experts is None:
        rank = rank_a  # rows not a multiple of r: report the rows
    if rank != expected:
        grouped.add(("LG102", "config", rank, expected), module.module,
                    {"rank": rank, "config_rank": expected})




def _block_diagonal(bd: object, module: LoRAModuleSpec) -> LoRAModuleSpec:
    """The dense factors a BD-LoRA module (PEFT's ``use_bdlora``, given as ``bd``) stands for.

    A block-diagonal factor is saved as its ``nblocks`` blocks side by side: A ``(r, in / n)``
    for the modules of ``target_modules_bd_a``, B ``(out, r / n)`` for ``target_modules_bd_b``
    (matched as PEFT matches them: the pattern is a substring of the module name). The checks
    compare the dense shapes with the config and the base model.
    """
    if not isinstance(bd, dict):
        return module
    n = bd.get("nblocks", 1)
    if not isinstance(n, int) or isinstance(n, bool) or n <= 1:
        return module

    def listed(key: str) -> bool:
        patterns = bd.get(key) or []
        return isinstance(patterns, list) and any(
            isinstance(p, str) and p in module.module for p in patterns)

    a, b = module.a_shape, module.b_shape
    if a is not None and len(a) == 2 and listed("target_modules_bd_a"):
        a = (a[0], a[1] * n)
    if b is not None and len(b) == 2 and listed("target_modules_bd_b"):
        b = (b[0], b[1] * n)
    if (a, b) == (module.a_shape, module.b_shape):
        return module
    return replace(module, a_shape=a, b_shape=b)




def check_spec(subject: str, spec: AdapterSpec, limits: ServingLimits, *,
                vocab_size: int | None = None,
                module_dims: Mapping[str, tuple[Expected, Expected]] | None = None,
                shared: RecipeOutcome | None = None,
                ) -> list[Violation]:
    found: list[Violation] = []
    grouped = Grouped()
    empty = _file_checks(subject, spec, limits, found, vocab_size, module_dims, shared)
    if shared is not None and vocab_size is None and module_dims is None:
        ranks = _shared_module_checks(subject, spec, limits, found, grouped, empty, shared)
    else:
        ranks = _module_checks(subject, spec, limits, found, grouped, empty, vocab_size,
                               module_dims)
    if limits.base is not None and spec.extra_keys:
        check_saved_embeddings(spec, limits.base, grouped)
    _rank_checks(subject, spec, limits, ranks, found)
    _dtype_checks(subject, spec, limits, found)
    if limits.engine_rules:
        engine_rules(subject, spec, limits, found, shared)
    if "init-rerun" in limits.engine_rules and str(
            spec.config.get("init_lora_weights")).lower() in _RERUN_INITS:
        found = [v for v in found if v.code != "LG116"]  # PEFT redoes the init when it loads
    if grouped.items:
        found.extend(_grouped_violations(subject, spec, grouped))
    if spec.moe_layout is not None:  # LG002: one adapter whose own MoE weights mix layouts
        found.extend(_mixed_layouts(subject, spec.tensors, shared))
    found.extend(registered_violations(subject, spec, limits))  # invariants defined in one unit
    if len(found) > 1:
        found.sort(key=lambda v: report_rank(v.code))
    return found


def _grouped_violations(subject: str, spec: AdapterSpec, grouped: Grouped) -> list[Violation]:
    """One violation per kind of finding (its first subject and count); the dims of an
    adapter trained on another base model said once (LG109 ``dims``)."""
    found: list[Violation] = []
    dims = [(name, count, details) for (code, variant, *_), (name, count, details)
            in grouped.items.items() if code == "LG109" and variant == "dim"]
    for (code, variant, *_), (name, count, details) in grouped.items.items():
        hint = base_model_hint(spec, variant) if code == "LG109" else None
        if code == "LG109" and variant == "dim" and len(dims) > 1:
            if name == dims[0][0]:
                found.append(dims_violation(subject, dims, hint))
            continue
        target = "module" if code in ("LG102", "LG103", "LG104") else "key"
        found.append(make_violation(code, variant, subject, **{
            **details, target: more(name, count)}, hint=hint))
    return found


def _file_checks(subject: str, spec: AdapterSpec, limits: ServingLimits,
                 found: list[Violation], vocab_size: int | None,
                 module_dims: Mapping[str, Any] | None,
                 shared: RecipeOutcome | None = None) -> frozenset[str]:
    """What the adapter as a whole holds: LG115, LG116, LG105, LG118, LG121, LG104, LG107.
    Returns the keys of the zero-size tensors."""
    # LG115: no tensors at all (the adapter would serve the base model)
    if not spec.tensors and spec.weights_file is not None:
        found.append(make_violation("LG115", "empty", subject, file=spec.weights_file))
    # LG116: an initialisation that rewrote the base weights, never converted
    method = init_method(spec.config)
    if method is not None:
        found.append(make_violation("LG116", "init", subject, method=method,
                                    value=spec.config.get("init_lora_weights")))
    vocab = limits.base.vocab_size if limits.base is not None else vocab_size
    if spec.features:
        _feature_checks(subject, spec, limits, found, vocab)
    # LG118: full base-model weights shipped inside the adapter, which a server drops for
    # its own copy: right when the vocab is the base model's (compared with it when known,
    # LG109 otherwise), unknown without it
    if spec.extra_keys and vocab is None and module_dims is None:
        _embedding_checks(subject, spec, found)
    # LG121: a scaling of zero (lora_alpha 0): the adapter computes nothing
    if spec.config.get("lora_alpha") == 0 or spec.config.get("alpha_pattern"):
        found.extend(_zero_scaling(subject, spec))
    # LG104: keys outside the grammar
    for key in spec.unknown_keys[:MAX_PER_KIND]:
        found.append(make_violation("LG104", "grammar", subject, key=key))
    if len(spec.unknown_keys) > MAX_PER_KIND:
        rest = len(spec.unknown_keys) - MAX_PER_KIND
        found.append(make_violation("LG104", "grammar", subject,
                                    key=f"... and {rest} more keys"))
    # LG107: zero-size tensors
    ordered, empty = _empty_tensors(spec.tensors, shared)
    for key in ordered:
        found.append(make_violation("LG107", "empty", subject, key=key,
                                    shape=spec.tensors[key].shape))
    return empty


_NO_KEYS: tuple[tuple[str, ...], frozenset[str]] = ((), frozenset())


def _empty_tensors(tensors: Mapping[str, Any],
                   shared: RecipeOutcome | None) -> tuple[tuple[str, ...], frozenset[str]]:
    """The keys of the zero-size tensors, in the header's order and as a set."""
    if shared is not None and shared.empty is not None:
        return shared.empty
    ordered = tuple([key for key, info in tensors.items() if 0 in info.shape])
    empty = (ordered, frozenset(ordered)) if ordered else _NO_KEYS
    if shared is not None:
        shared.empty = empty
    return empty


def _mixed_layouts(subject: str, tensors: Mapping[str, Any],
                   shared: RecipeOutcome | None) -> list[Violation]:
    """LG002 within one adapter; a recipe found unmixed once is not classified again."""
    if shared is not None and shared.unmixed:
        return []
    mixed = check_moe_layouts(subject, tensors)[1]
    if shared is not None and not mixed:
        shared.unmixed = True
    return mixed


def _total_bytes(spec: AdapterSpec) -> int:
    return sum(t.nbytes for t in spec.tensors.values())


def _feature_checks(subject: str, spec: AdapterSpec, limits: ServingLimits,
                    found: list[Violation], vocab: int | None = None) -> None:
    """LG105: features in use that the server does not serve."""
    for name, value in spec.features.items():
        if name == "modules_to_save" and limits.served_heads is not None and _heads_served(
                spec, limits.served_heads) and not _generative_base(limits):
            continue
        if name in limits.allow:
            continue
        if name == "bias" and "bias-by-tensors" in limits.engine_rules and "bias" not in \
                spec.extra_keys.values():
            continue  # the engine ignores the flag: no bias tensor saved, none is dropped
        if name == "added_tokens":
            found.extend(_added_tokens(subject, value, limits, vocab))
            continue
        details = {"feature": FEATURE_TEXT.get(name, name),
                   "value": f"{FEATURES.get(name, name)}={value!r}", "allow_name": name}
        saved = [k for k, what in spec.extra_keys.items() if what == name]
        if name == "modules_to_save" and saved:
            nbytes = sum(spec.tensors[k].nbytes for k in saved)
            found.append(make_violation(
                "LG105", "saved", subject, **details, nbytes=f"{nbytes:,}", bytes=nbytes,
                share=share(nbytes, _total_bytes(spec)), saved=more(
                    f"{saved[0].removeprefix('base_model.model.')} "
                    f"{spec.tensors[saved[0]].shape}", len(saved))))
        else:
            found.append(make_violation("LG105", "feature", subject, **details))


def _added_tokens(subject: str, tokens: Mapping[str, int], limits: ServingLimits,
                  vocab: int | None) -> list[Violation]:
    """LG105 for an ``added_tokens.json`` adding tokens: those with an id at or past the base
    vocab (below it they are the base tokenizer's own, copied by a tokenizer save; sglang
    filters them the same way). Without the base's vocab nothing can be told: a tokenizer
    save copies the base's own special tokens there (Qwen's do), so none is refused."""
    if vocab is None:
        return []
    new = sorted((i, t) for t, i in tokens.items() if i >= vocab)
    if not new:
        return []
    shown = ", ".join(repr(t) for _, t in new[:3]) + (", ..." if len(new) > 3 else "")
    beyond = f"at or past the base's vocab_size {vocab}"
    return [make_violation(
        "LG105", "added-tokens", subject, feature=FEATURE_TEXT["added_tokens"],
        allow_name="added_tokens", count=len(new), tokens=shown, first=new[0][0],
        last=new[-1][0], beyond=beyond, server=limits.engine or "the server",
        value=f"{len(new)} in added_tokens.json")]


def _embedding_checks(subject: str, spec: AdapterSpec, found: list[Violation]) -> None:
    """LG118: base embedding weights shipped in the adapter, with no vocab to compare."""
    for key, what in spec.extra_keys.items():
        if what == "embedding-base":
            info = spec.tensors[key]
            leaf = key.removesuffix(".weight").removesuffix(".base_layer").rsplit(".", 1)[-1]
            found.append(make_violation(
                "LG118", "embedding", subject, key=key, shape=info.shape,
                nbytes=f"{info.nbytes:,}", bytes=info.nbytes,
                share=share(info.nbytes, _total_bytes(spec)), module=leaf))



def _shared_module_checks(subject: str, spec: AdapterSpec, limits: ServingLimits,
                          found: list[Violation], grouped: Grouped,
                          empty: frozenset[str], shared: RecipeOutcome) -> dict[int, str]:
    """`_module_checks` in a set check, once per recipe: the modules' outcome is the same
    for every adapter of a recipe. Computed each time: a ``rank_pattern`` or
    ``use_bdlora`` (they change what each module is compared with), and an outcome with an
    LG102 between A and B (its message names the adapter)."""
    config = spec.config
    if config.get("use_bdlora") is not None or config.get("rank_pattern"):
        return _module_checks(subject, spec, limits, found, grouped, empty, None, None)
    hit = shared.modules
    if hit is not None:
        for group, name, count, details in hit.grouped:
            grouped.items[group] = [name, count, details]
        return dict(hit.ranks)
    before = len(found)
    ranks = _module_checks(subject, spec, limits, found, grouped, empty, None, None)
    if len(found) == before:
        shared.modules = ModuleOutcome(
            tuple((group, name, count, details) for group, (
                name, count, details) in grouped.items.items()), tuple(ranks.items()))
    return ranks


def _module_checks(subject: str, spec: AdapterSpec, limits: ServingLimits,
                   found: list[Violation], grouped: Grouped, empty: frozenset[str],
                   vocab_size: int | None,
                   module_dims: Mapping[str, tuple[Expected, Expected]] | None,
                   ) -> dict[int, str]:
    """Each module: LG103, LG104 (served modules), LG102, LG109. Returns rank -> first module."""
    ranks: dict[int, str] = {}
    bd = spec.config.get("use_bdlora")
    served = limits.target_modules
    slices = "packed-slices" in limits.engine_rules
    config_rank = _ConfigRank(spec.config)
    for module in spec.modules.values():
        if bd is not None:
            module = _block_diagonal(bd, module)
        if module.a_key is None or module.b_key is None:
            _orphan(module, grouped)  # LG103
        if empty and (module.a_key in empty or module.b_key in empty):
            continue
        if served is not None and not is_served(module, served, slices):  # LG104
            grouped.add(("LG104", "module", module.target), module.module,
                        {"target": module.target, "served": ", ".join(sorted(served))})
        _check_ranks(subject, module, config_rank(module), found, grouped)  # LG102
        if module.rank:
            ranks.setdefault(module.rank, module.module)
        check_dims(module, limits, grouped, vocab_size, module_dims)  # LG109
    return ranks


def _orphan(module: LoRAModuleSpec, grouped: Grouped) -> None:
    """LG103: a module with one half only."""
    embedding = module.kind == "embedding"
    a_name = "lora_embedding_A" if embedding else "lora_A"
    b_name = "lora_embedding_B" if embedding else "lora_B"
    present, missing = (a_name, b_name) if module.b_key is None else (b_name, a_name)
    grouped.add(("LG103", "orphan", present), module.module,
                {"present": present, "missing": missing})



def _rank_checks(subject: str, spec: AdapterSpec, limits: ServingLimits,
                 ranks: dict[int, str], found: list[Violation]) -> None:
    """LG101: ranks above the limit (config values too, as vLLM checks them)."""
    if limits.max_rank is None and limits.allowed_ranks is None:
        return
    config_ranks = {int(spec.config["r"]): "r in adapter_config.json"}
    for key, value in (spec.config.get("rank_pattern") or {}).items():
        config_ranks.setdefault(int(value), f"rank_pattern[{key!r}]")
    for rank, where in config_ranks.items():
        ranks.setdefault(rank, where)
    for rank, where in sorted(ranks.items()):
        if limits.max_rank is not None and rank > limits.max_rank:
            found.append(make_violation("LG101", "max", subject, rank=rank, module=where,
                                        max_rank=limits.max_rank))
        elif limits.allowed_ranks is not None and rank not in limits.allowed_ranks:
            found.append(make_violation("LG101", "allowed", subject, rank=rank, module=where,
                                        allowed=sorted(limits.allowed_ranks)))


def _dtype_checks(subject: str, spec: AdapterSpec, limits: ServingLimits,
                  found: list[Violation]) -> None:
    """LG106: mixed dtypes, and dtypes the server does not take."""
    if len(spec.dtypes) > 1 and "cast" not in limits.engine_rules:
        found.append(make_violation("LG106", "mixed", subject, dtypes=list(spec.dtypes)))
    if limits.dtypes is None:
        return
    lora_keys = [k for m in spec.modules.values() for k in (m.a_key, m.b_key) if k]
    for dtype in spec.dtypes:
        if dtype not in limits.dtypes:
            first = next(k for k in lora_keys if spec.tensors[k].dtype == dtype)
            count = sum(1 for k in lora_keys if spec.tensors[k].dtype == dtype)
            found.append(make_violation(
                "LG106", "allowed", subject, dtype=dtype, key=more(first, count),
                allowed=", ".join(sorted(limits.dtypes))))



def spec_violations(
    spec: AdapterSpec,
    limits: ServingLimits | None = None,
    *,
    subject: str | None = None,
    skip: Iterable[str] = (),
    vocab_size: int | None = None,
    module_dims: Mapping[str, tuple[Expected, Expected]] | None = None,
) -> list[Violation]:
    """What `check_adapters` finds in one adapter, for a guard that already holds its spec.

    The checks of one adapter (LG101-LG107, LG109, and LG002 within it; not LG108, which is
    the reading's, nor LG110 and LG002 across a set), in the order `check_adapters` reports
    them. For an engine in front of which a guard stands:

    - ``subject`` names the adapter in messages (default ``adapter '<folder>'``);
    - ``skip`` names codes the engine settles itself or accepts by design (e.g. ``"LG106"``
      where it casts every weight to its own dtype);
    - ``vocab_size`` is the base model's vocab when the engine knows no more of it (an
      embedding's A and lm_head's B are checked against it, LG109);
    - ``module_dims`` maps module paths to their ``((in, source), (out, source))`` dims on
      the live model; a module listed there is checked against them instead of
      ``limits.base_config``.

    Example:
        >>> import tempfile, lora_guard as lg
        >>> from lora_guard.testing import write_adapter
        >>> from lora_guard._checking.check_adapters import spec_violations
        >>> spec = lg.inspect_adapter(write_adapter(tempfile.mkdtemp() + "/a", rank=32))
        >>> [v.code for v in spec_violations(spec, lg.ServingLimits(max_rank=16))]
        ['LG101']
        >>> spec_violations(spec, lg.ServingLimits(max_rank=16), skip=("LG101",))
        []
    """
    limits = limits_argument("spec_violations", limits)
    skipped = names("spec_violations", "skip", skip, "('LG106',)") if skip else frozenset()
    codes = adapter_codes()
    unknown = sorted(set(skipped or ()) - set(codes))
    if unknown:
        raise ValueError(
            f"spec_violations(skip=...) got {unknown}; it takes codes of one adapter's checks: "
            f"{', '.join(codes)}"
        )
    positive_int("spec_violations", "vocab_size", vocab_size)
    found = check_spec(subject or f"adapter {spec.name!r}", spec, limits,
                        vocab_size=vocab_size, module_dims=module_dims)
    return [v for v in found if v.code not in (skipped or ())]



def _generative_base(limits: ServingLimits) -> bool:
    """A base the engine runs as a generative model (``*ForCausalLM``), where a
    classification head has no module to load into (``heads-need-pooling``)."""
    if "heads-need-pooling" not in limits.engine_rules or limits.base is None:
        return False
    names = limits.base.architectures
    return bool(names) and all(n.endswith(("ForCausalLM", "LMHeadModel")) for n in names)


def _heads_served(spec: AdapterSpec, heads: Collection[str]) -> bool:
    saved = spec.config.get("modules_to_save") or []
    names = [saved] if isinstance(saved, str) else list(saved) if isinstance(
        saved, (list, tuple)) else [None]
    if not all(isinstance(n, str) and n.split(".")[-1] in heads for n in names):
        return False
    return all(any(part in heads for part in k.split("."))
               for k, kind in spec.extra_keys.items() if kind == "modules_to_save")

