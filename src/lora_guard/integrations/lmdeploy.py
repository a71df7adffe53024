"""lora_guard in front of lmdeploy's adapter loading (its PyTorch engine).

Guarded (lmdeploy 0.18.0, run by the engine tier ``tests/engines/``, with that release's
profile): lmdeploy reads its adapters once, at start-up, in every model agent (one per GPU
rank, each in the engine's worker process), through
``lmdeploy.pytorch.models.patch.add_adapters(model, adapters, dtype, device)``, which
``lmdeploy/pytorch/engine/model_agent/agent.py`` binds at import (``from
lmdeploy.pytorch.models.patch import add_adapters``): so the hook is
``lmdeploy.pytorch.engine.model_agent.agent.add_adapters``, the name
``BaseModelAgent._build_model`` calls, and ``patch.add_adapters`` for a direct call.

Before ``add_adapters`` reads a config or touches the model, every adapter of ``{name: path}``
goes through the checker of ``lora-guard check`` with the one lmdeploy profile that
``lora-guard check --engine lmdeploy`` uses (the same codes for the same adapter; the engine
tier asserts it on every corpus adapter), filled with the served model: its config (LG109
dims, layers, towers) and the modules it built with LoRA slots (LG104). All adapters are
checked first and reported together: a refusal raises lora_guard's error (in ``raise`` mode)
before any LoRA module is added, so the model is left as it was.

Worker processes: lmdeploy builds its model agents in the process of its executor (the
engine's own for one GPU, a ``multiprocessing`` or Ray worker per rank otherwise). Call
`instrument` in each of them, e.g. in a ``sitecustomize.py`` on the workers' ``PYTHONPATH``
(as for vLLM's and sglang's workers): the hook attaches when the agent module is imported.

Example:
    >>> from lora_guard.integrations import lmdeploy as lmdeploy_guard
    >>> report = lmdeploy_guard.instrument()   # which hooks attached (or are pending)
    >>> lmdeploy_guard.uninstrument()
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from .._checking.check_adapters import ServingLimits, spec_violations
from .._checking.engines import SPECS
from .._checking.invariants import settled_codes
from .._checking.limits import running_limits
from .._core.config import report
from .._core.errors import Violation
from ._base import AttachReport, Integration, Patch, local_adapter

__all__ = ["INTEGRATION", "adapter_violations", "instrument", "uninstrument"]

name = "lmdeploy"
"""This integration's name, as `lora_guard.integrations.get` knows it."""

_LMDEPLOY_SETTLES = settled_codes("LG106")
"""Codes lmdeploy settles by design: it copies every weight into buffers of its own dtype."""


def _inner(model: Any) -> Any:
    """The model itself (``add_adapters`` is also given a graph runner around it)."""
    get_model = getattr(model, "get_model", None)
    return get_model() if callable(get_model) else model


def _base_config(model: Any) -> dict[str, Any] | None:
    """The served model's (text) config, as the checker reads a ``config.json``."""
    config = getattr(model, "config", None)
    text = getattr(config, "get_text_config", None)
    if callable(text):
        with contextlib.suppress(Exception):  # no text part: the config whole
            config = text()
    to_dict = getattr(config, "to_dict", None)
    if not callable(to_dict):
        return None
    try:
        found = to_dict()
    except Exception:  # a config that cannot say its fields: the dims are not checked
        return None
    return found if isinstance(found, dict) and found.get("hidden_size") else None


def _served(model: Any) -> tuple[str, ...] | None:
    """The modules the model built with LoRA slots (``lora_adapters``), with the parts of its
    packed ones (``packed_modules_mapping``: q/k/v of qkv_proj): what lmdeploy can load."""
    named = getattr(model, "named_modules", None)
    if not callable(named):
        return None
    slots = {path.rsplit(".", 1)[-1] for path, module in named()
             if hasattr(module, "lora_adapters")}
    packed = getattr(model, "packed_modules_mapping", None) or {}
    for packed_name, parts in packed.items() if isinstance(packed, Mapping) else ():
        if packed_name in slots:
            slots.update(str(p) for p in parts)
    return tuple(sorted(slots)) or None


def _limits(model: Any) -> ServingLimits:
    """The lmdeploy profile of ``lora-guard check --engine lmdeploy``, with this model."""
    served = _served(model)
    return running_limits("lmdeploy", INTEGRATION.version(), base_config=_base_config(model),
                          narrow={"target_modules": served} if served else None)


def adapter_violations(model: Any, adapters: Mapping[str, Any]) -> list[Violation]:
    """What lora_guard finds in the adapters ``add_adapters`` is about to load on ``model``
    (``{name: path}``, as ``--adapters name=path`` gives them), in name order.

    Example:
        >>> import tempfile
        >>> from lora_guard.integrations.lmdeploy import adapter_violations
        >>> from lora_guard.testing import write_adapter
        >>> path = write_adapter(tempfile.mkdtemp() + "/sql", rank=64)  # PEFT 0.21's config
        >>> [v.code for v in adapter_violations(object(), {"sql": path})]
        ['LG202']
    """
    if not adapters:
        return []
    model = _inner(model)
    limits = _limits(model)
    found: list[Violation] = []
    for adapter_name in sorted(adapters):
        subject = f"adapter {adapter_name!r}"
        spec, violations = local_adapter(adapters[adapter_name], subject)
        if spec is not None:
            violations += spec_violations(spec, limits, subject=subject,
                                          skip=_LMDEPLOY_SETTLES)
        found += violations
    return found


def _add_adapters(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
    model = kwargs.get("model", args[0] if args else None)
    adapters = kwargs.get("adapters", args[1] if len(args) > 1 else None)
    if isinstance(adapters, Mapping):
        report(adapter_violations(model, adapters))  # before a config is read
    return wrapped(*args, **kwargs)


_PARAMS = ("model", "adapters")

INTEGRATION = Integration(
    name=name,
    distribution="lmdeploy",
    min_version=SPECS["lmdeploy"].releases[-1],
    max_version="0.18.1",
    patches=(
        Patch("lmdeploy.pytorch.engine.model_agent.agent", "add_adapters", _PARAMS,
              _add_adapters),
        Patch("lmdeploy.pytorch.models.patch", "add_adapters", _PARAMS, _add_adapters),
    ),
)


def instrument() -> AttachReport:
    """Guard lmdeploy's adapter loading, now or when its model agent is imported.

    Example:
        >>> from lora_guard.integrations import lmdeploy as lmdeploy_guard
        >>> report = lmdeploy_guard.instrument(); lmdeploy_guard.INTEGRATION.instrumented
        True
        >>> lmdeploy_guard.uninstrument()
    """
    return INTEGRATION.instrument()


def uninstrument() -> None:
    """Restore lmdeploy's original functions exactly; a hook firing later does nothing.

    Example:
        >>> from lora_guard.integrations import lmdeploy as lmdeploy_guard
        >>> lmdeploy_guard.uninstrument(); lmdeploy_guard.INTEGRATION.instrumented
        False
    """
    INTEGRATION.uninstrument()
