"""LG105's check: features in use that the server does not serve (DoRA, a LoRA bias, full
weights of modules_to_save, added tokens past the base's vocab, ...)."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping

from lora_guard._checking.limits import ServingLimits
from lora_guard._checking.registry import adapter_check
from lora_guard._checking.rules.context import AdapterContext
from lora_guard._checking.rules.shared import FEATURE_TEXT, more, share, total_bytes
from lora_guard._core.errors import Violation, make_violation
from lora_guard._reading.adapters import FEATURES, AdapterSpec


@adapter_check("LG105", position=30)
def unsupported_feature(ctx: AdapterContext) -> list[Violation]:
    return list(_features(ctx)) if ctx.spec.features else []


def _features(ctx: AdapterContext) -> Iterator[Violation]:
    spec, limits, subject = ctx.spec, ctx.limits, ctx.subject
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
            yield from _added_tokens(subject, value, limits, ctx.vocab)
            continue
        details = {"feature": FEATURE_TEXT.get(name, name),
                   "value": f"{FEATURES.get(name, name)}={value!r}", "allow_name": name}
        saved = [k for k, what in spec.extra_keys.items() if what == name]
        if name == "modules_to_save" and saved:
            nbytes = sum(spec.tensors[k].nbytes for k in saved)
            yield make_violation(
                "LG105", "saved", subject, **details, nbytes=f"{nbytes:,}", bytes=nbytes,
                share=share(nbytes, total_bytes(spec)), saved=more(
                    f"{saved[0].removeprefix('base_model.model.')} "
                    f"{spec.tensors[saved[0]].shape}", len(saved)))
        else:
            yield make_violation("LG105", "feature", subject, **details)


def _added_tokens(subject: str, tokens: Mapping[str, int], limits: ServingLimits,
                  vocab: int | None) -> list[Violation]:
    """An ``added_tokens.json`` adding tokens: those with an id at or past the base vocab
    (below it they are the base tokenizer's own, copied by a tokenizer save; sglang filters
    them the same way). Without the base's vocab nothing can be told: a tokenizer save copies
    the base's own special tokens there (Qwen's do), so none is refused."""
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
