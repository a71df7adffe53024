"""LG202's check of one adapter: a config the engine reads in another form than PEFT wrote
it: ``target_modules`` saved as a string (a regex) or null where the engine reads a list
(``target-modules-list``: sglang), any string, null or one module named twice where it unions
names (``target-modules-by-name``: lmdeploy), keys the engine's pinned PEFT 0.14 does not know
(``peft-0.14-config``: lmdeploy), and a layer selection PEFT fails on
(``peft-selects-modules``: PEFT)."""

from __future__ import annotations

from typing import Any

from lora_guard._checking.engines.lmdeploy import PEFT_0_14_LORA_KEYS
from lora_guard._checking.registry import adapter_check
from lora_guard._checking.rules.context import AdapterContext
from lora_guard._checking.rules.peft_selection import refused_form
from lora_guard._checking.rules.shared import PACKED, PART_OF
from lora_guard._core.errors import Violation, make_violation

_RULES = frozenset(("target-modules-list", "peft-0.14-config", "target-modules-by-name",
                    "peft-selects-modules"))


@adapter_check("LG202", position=160)
def engine_config_form(ctx: AdapterContext) -> list[Violation]:
    rules = ctx.limits.engine_rules
    if not _RULES.intersection(rules):  # most engines: nothing to read another way
        return []
    targets = ctx.spec.config.get("target_modules")
    engine = ctx.limits.engine or "the server"
    found: list[Violation] = []
    if "target-modules-list" in rules and isinstance(targets, str) and (
            targets not in ("all", "all-linear")):
        found.append(make_violation("LG202", "target-string", ctx.subject, value=targets,
                                    engine=engine))
    if {"target-modules-list", "target-modules-by-name"}.intersection(rules) and (
            targets is None) and (
            "target_modules" in ctx.spec.config):  # null (a missing field is LG108)
        found.append(make_violation("LG202", "target-none", ctx.subject, value="null",
                                    engine=engine))
    if "peft-0.14-config" in rules:
        unknown = sorted(set(ctx.spec.config) - PEFT_0_14_LORA_KEYS)
        if unknown:
            keys = ", ".join(unknown[:3]) + (
                f" (and {len(unknown) - 3} more)" if len(unknown) > 3 else "")
            found.append(make_violation("LG202", "unknown-keys", ctx.subject, engine=engine,
                                        keys=keys))
    if "target-modules-by-name" in rules:
        found += _targets_by_name(ctx.subject, targets, engine)
    if "peft-selects-modules" in rules:
        refused = refused_form(ctx.spec.config)
        if refused is not None:
            variant, what = refused
            shown = {"value" if variant == "layers-form" else "problem": what}
            found.append(make_violation("LG202", variant, ctx.subject, engine=engine, **shown))
    return found


def _targets_by_name(subject: str, targets: Any, engine: str) -> list[Violation]:
    """``target_modules`` read as a set of module names (lmdeploy): a string is read letter
    by letter; two entries whose last part names one module that is not packed find the
    first one's LoRA module by its name."""
    if isinstance(targets, str):
        return [make_violation("LG202", "target-string-any", subject, value=targets,
                               engine=engine)]
    seen: dict[str, str] = {}
    for target in targets if isinstance(targets, (list, tuple)) else ():
        leaf = str(target).rsplit(".", 1)[-1]
        if leaf in PART_OF or leaf in PACKED:
            continue
        if leaf in seen:
            return [make_violation("LG202", "repeated-target", subject, first=seen[leaf],
                                   second=str(target), module=leaf, engine=engine)]
        seen[leaf] = str(target)
    return []
