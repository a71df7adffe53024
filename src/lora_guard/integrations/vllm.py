"""lora_guard in front of vLLM's LoRA loading and slot activation.

Guarded (vLLM >= 0.11, ``vllm.lora.lora_model`` / ``model_manager`` / ``worker_manager``):

- ``LoRAModel.from_local_checkpoint`` (the successor of ``vllm.lora.models``'): before a
  tensor is read, the adapter's config and safetensors header against the engine: ranks of
  ``r`` and ``rank_pattern`` above ``max_lora_rank`` (LG101), weights for modules the model
  does not serve (LG104, compared with ``expected_lora_modules`` as vLLM does) or outside
  LoRA key grammar, features vLLM does not serve (LG105: ``bias``, ``modules_to_save``, DoRA,
  ``lora_bias``), an embedding A whose vocab is not the model's (LG109), A/B rank
  disagreement (LG102), orphan halves (LG103), zero-size tensors (LG107), malformed files
  (LG108). ``max_lora_rank`` comes from the ``WorkerLoRAManager._load_adapter`` that calls it.
- ``LoRAModelManager.activate_adapter`` (and so the LRU manager's): the slot table
  ``lora_index_to_id`` against the active adapters before and after activation (LG201), and
  an activation with no free slot (LG201) instead of a bare "No free lora slots".

Example:
    >>> from lora_guard.integrations import vllm as vllm_guard
    >>> vllm_guard.instrument()
    >>> vllm_guard.uninstrument()
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Callable, Sequence
from typing import Any

from .._checks import check_slot_maps_violations
from .._config import report
from .._errors import Violation, make_violation
from ._base import Integration, Patch, adapter_violations, read_adapter

__all__ = ["INTEGRATION", "instrument", "slot_violations", "uninstrument"]

name = "vllm"
"""This integration's name, as `lora_guard.integrations.get` knows it."""

_MAX_RANK: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "lora_guard_vllm_max_rank", default=None)


def _load_adapter(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
    max_rank = getattr(getattr(instance, "lora_config", None), "max_lora_rank", None)
    token = _MAX_RANK.set(max_rank if isinstance(max_rank, int) else None)
    try:
        return wrapped(*args, **kwargs)
    finally:
        _MAX_RANK.reset(token)


def _from_local_checkpoint(wrapped: Callable[..., Any], instance: Any,
                           args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    lora_dir = kwargs.get("lora_dir", args[0] if args else None)
    expected = kwargs.get("expected_lora_modules", args[1] if len(args) > 1 else None)
    vocab = kwargs.get("model_vocab_size")
    if isinstance(lora_dir, (str, os.PathLike)) and not kwargs.get("tensorizer_config_dict"):
        subject = f"adapter {os.path.basename(os.path.normpath(lora_dir))!r}"
        config, tensors, violations = read_adapter(lora_dir, subject)
        if config is not None:
            violations += adapter_violations(
                subject, config, tensors, max_rank=_MAX_RANK.get(),
                served_modules=expected if expected is not None and not kwargs.get(
                    "weights_mapper") else None,
                vocab_size=vocab if isinstance(vocab, int) else None,
                config_ranks=not config.get("target_parameters"))
        report(violations)
    return wrapped(*args, **kwargs)


def slot_violations(manager: Any) -> list[Violation]:
    """LG201 for a vLLM LoRA manager whose slot table and active adapters disagree.

    Example:
        >>> import types
        >>> from lora_guard.integrations.vllm import slot_violations
        >>> manager = types.SimpleNamespace(lora_index_to_id=[1, None], _active_adapters={1: None})
        >>> slot_violations(manager)
        []
    """
    slots: Sequence[Any] | None = getattr(manager, "lora_index_to_id", None)
    active = getattr(manager, "_active_adapters", None)
    if slots is None or active is None:
        return []
    table = list(slots)
    uid_to_slot = {uid: table.index(uid) if uid in table else -1 for uid in list(active)}
    return check_slot_maps_violations(uid_to_slot, table, slots=len(table),
                                      subject="vLLM LoRA slots")


def _activate_adapter(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> Any:
    lora_id = kwargs.get("lora_id", args[0] if args else None)
    found = slot_violations(instance)
    table = getattr(instance, "lora_index_to_id", None)
    active = getattr(instance, "_active_adapters", None) or {}
    if not found and table is not None and lora_id not in active and None not in table:
        found.append(make_violation("LG201", "exhausted", "vLLM LoRA slots",
                                    needed=len(active) + 1, slots=len(table)))
    report(found)
    result = wrapped(*args, **kwargs)
    report(slot_violations(instance))
    return result


INTEGRATION = Integration(
    name=name,
    distribution="vllm",
    min_version="0.11",
    patches=(
        Patch("vllm.lora.lora_model", "LoRAModel.from_local_checkpoint",
              ("cls", "lora_dir", "expected_lora_modules", "peft_helper"),
              _from_local_checkpoint),
        Patch("vllm.lora.worker_manager", "WorkerLoRAManager._load_adapter",
              ("self", "lora_request"), _load_adapter, optional=True),
        Patch("vllm.lora.model_manager", "LoRAModelManager.activate_adapter",
              ("self", "lora_id"), _activate_adapter),
    ),
)


def instrument() -> None:
    """Guard vLLM's adapter loading and slot activation, now or when vLLM is imported.

    Example:
        >>> from lora_guard.integrations import vllm as vllm_guard
        >>> vllm_guard.instrument(); vllm_guard.INTEGRATION.instrumented
        True
        >>> vllm_guard.uninstrument()
    """
    INTEGRATION.instrument()


def uninstrument() -> None:
    """Restore vLLM's original functions exactly; a hook firing later does nothing.

    Example:
        >>> from lora_guard.integrations import vllm as vllm_guard
        >>> vllm_guard.uninstrument(); vllm_guard.INTEGRATION.instrumented
        False
    """
    INTEGRATION.uninstrument()
