"""LG202's check of one adapter: a config the engine reads in another form than PEFT wrote
it: ``target_modules`` saved as a string (a regex) where the engine reads a list
(``target-modules-list``: sglang), any string or one module named twice where it unions names
(``target-modules-by-name``: lmdeploy), and keys the engine's pinned PEFT 0.14 does not know
(``peft-0.14-config``: lmdeploy)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lora_guard._checking.engines.lmdeploy import PEFT_0_14_LORA_KEYS
from lora_guard._checking.registry import adapter_check
from lora_guard._checking.rules.context import AdapterContext
from lora_guard._checking.rules.shared import PACKED, PART_OF
from lora_guard._core.errors import Violation, make_violation


@adapter_check("LG202", position=160)
def engine_config_form(ctx: AdapterContext) -> Iterator[Violation]:
    targets = ctx.spec.config.get("target_modules")
    rules, engine = ctx.limits.engine_rules, ctx.limits.engine or "the server"
    if "target-modules-list" in rules and isinstance(targets, str) and (
            targets not in ("all", "all-linear")):
        yield make_violation("LG202", "target-string", ctx.subject, value=targets,
                             engine=engine)
    if "peft-0.14-config" in rules:
        unknown = sorted(set(ctx.spec.config) - PEFT_0_14_LORA_KEYS)
        if unknown:
            keys = ", ".join(unknown[:3]) + (
                f" (and {len(unknown) - 3} more)" if len(unknown) > 3 else "")
            yield make_violation("LG202", "unknown-keys", ctx.subject, engine=engine,
                                 keys=keys)
    if "target-modules-by-name" in rules:
        yield from _targets_by_name(ctx.subject, targets, engine)


def _targets_by_name(subject: str, targets: Any, engine: str) -> Iterator[Violation]:
    """``target_modules`` read as a set of module names (lmdeploy): a string is read letter
    by letter; two entries whose last part names one module that is not packed find the
    first one's LoRA module by its name."""
    if isinstance(targets, str):
        yield make_violation("LG202", "target-string-any", subject, value=targets,
                             engine=engine)
        return
    seen: dict[str, str] = {}
    for target in targets if isinstance(targets, (list, tuple)) else ():
        leaf = str(target).rsplit(".", 1)[-1]
        if leaf in PART_OF or leaf in PACKED:
            continue
        if leaf in seen:
            yield make_violation("LG202", "repeated-target", subject, first=seen[leaf],
                                 second=str(target), module=leaf, engine=engine)
            return
        seen[leaf] = str(target)
