"""LG102's check: a module whose A and B disagree on the rank, or whose rank is not the one
its config gives it (``rank_pattern``'s first match, else ``r``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lora_guard._checking.registry import adapter_check, module_rule
from lora_guard._checking.rules.context import AdapterContext, ModuleContext, grouped_violations
from lora_guard._checking.rules.shared import Grouped
from lora_guard._core.errors import Violation, make_violation
from lora_guard._reading.adapters import LoRAModuleSpec, parameter_key, pattern_value


def _config_rank(config: Mapping[str, Any], module: LoRAModuleSpec) -> int:
    """The rank the config gives a module: ``rank_pattern``'s first match, else ``r``."""
    pattern = config.get("rank_pattern")
    if not pattern:
        return int(config["r"])
    value = pattern_value(pattern, parameter_key(module.module, module.target, module.kind))
    return int(value) if value is not None else int(config["r"])


def _conv_groups(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """The ``groups`` of a grouped convolution's LoRA, or 0 when the halves do not show one.

    PEFT gives a conv LoRA's B the base layer's groups, so B is ``(out, r / groups, ...)``
    while A is ``(r, in, ...)``: the groups must divide the rank, the in and the out channels.
    """
    if len(a) < 2 or len(b) < 2 or b[1] <= 0 or a[0] % b[1]:
        return 0
    groups = a[0] // b[1]
    return groups if a[1] % groups == 0 and b[0] % groups == 0 else 0


@module_rule("LG102")
def check_ranks(ctx: ModuleContext, module: LoRAModuleSpec, grouped: Grouped,
                found: list[Violation]) -> None:
    """A's rank against B's, and against the config's."""
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
            "LG102", "a-b", ctx.subject, module=module.module, rank_a=rank_a, rank_b=rank_b,
            shape_a=a, shape_b=b))
        return
    rank = module.rank if module.rank is not None else rank_a
    if module.kind == "moe-flat" and module.experts is None:
        rank = rank_a  # rows not a multiple of r: report the rows
    expected = _config_rank(ctx.config, module)
    if rank != expected:
        grouped.add(("LG102", "config", rank, expected), module.module,
                    {"rank": rank, "config_rank": expected})


@adapter_check("LG102", position=80)
def rank_inconsistent(ctx: AdapterContext) -> list[Violation]:
    grouped = grouped_violations(ctx, "LG102", "module")
    if not ctx.modules.found:
        return grouped
    return [v for v in ctx.modules.found if v.code == "LG102"] + grouped  # A against B first
