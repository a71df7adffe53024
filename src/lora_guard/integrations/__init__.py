"""Guards for PEFT, sglang and vLLM, put in front of their own entry points.

Each integration is a module with ``instrument()`` / ``uninstrument()``:

```python
from lora_guard.integrations import peft, sglang, vllm
peft.instrument()        # PeftModel.load_adapter/add_adapter, peft.utils.hotswap
```

Patching happens through wrapt post-import hooks, so importing lora_guard (or this package)
imports none of these libraries, and ``instrument()`` works before or after the library is
imported. ``uninstrument()`` restores the original attributes (``is`` identity).

Third-party packages build their integration on `Integration` (which owns instrument/
uninstrument, idempotence, version checks and the `AttachReport`) with one `Patch` per guarded
function, and ship it through the entry-point group ``lora_guard.integrations``: the entry
point names an object (an `Integration`, or any object with ``instrument()`` and
``uninstrument()``); `available` lists it and `get` returns it::

    [project.entry-points."lora_guard.integrations"]
    mylib = "mylib_lora_guard:integration"
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from ._base import AttachReport, Integration, IntegrationWarning, Patch

__all__ = [
    "ENTRY_POINT_GROUP",
    "AttachReport",
    "Integration",
    "IntegrationLike",
    "IntegrationWarning",
    "Patch",
    "available",
    "get",
    "instrument",
    "uninstrument",
]

ENTRY_POINT_GROUP = "lora_guard.integrations"
"""The entry-point group through which other packages register integrations."""

_BUILTIN = {"peft": "peft", "sglang": "sglang", "vllm": "vllm"}


@runtime_checkable
class IntegrationLike(Protocol):
    """What an integration offers: `instrument` and `uninstrument` (a module qualifies)."""

    def instrument(self) -> object: ...

    def uninstrument(self) -> None: ...


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    return {ep.name: ep for ep in found if ep.name not in _BUILTIN}


def available() -> list[str]:
    """The names `get` accepts: the built-in integrations and those of installed packages.

    Example:
        >>> from lora_guard import integrations
        >>> {"peft", "sglang", "vllm"} <= set(integrations.available())
        True
    """
    return sorted({*_BUILTIN, *_entry_points()})


def get(name: str) -> IntegrationLike:
    """The integration called ``name`` (built in, or from an installed package).

    Raises ValueError naming the known integrations when ``name`` is none of them, and
    TypeError when an entry point's object lacks ``instrument``/``uninstrument``.

    Example:
        >>> from lora_guard import integrations
        >>> integrations.get("peft").name
        'peft'
        >>> integrations.get("tgi")
        Traceback (most recent call last):
        ...
        ValueError: lora_guard has no integration 'tgi'; known: peft, sglang, vllm...
    """
    if not isinstance(name, str):
        raise TypeError(f"an integration name is a string such as 'peft', got {name!r}")
    key = name.strip().lower()
    if key in _BUILTIN:
        module = importlib.import_module(f"{__name__}.{_BUILTIN[key]}")
        integration: IntegrationLike = module.INTEGRATION
        return integration
    entry_points = _entry_points()
    if key not in entry_points and name not in entry_points:
        known = ", ".join(available())
        raise ValueError(
            f"lora_guard has no integration {name!r}; known: {known}. A third-party "
            f"integration registers itself under the entry-point group {ENTRY_POINT_GROUP!r}."
        )
    entry_point = entry_points.get(key) or entry_points[name]
    loaded: Any = entry_point.load()
    if not isinstance(loaded, IntegrationLike):
        raise TypeError(
            f"the {ENTRY_POINT_GROUP!r} entry point {entry_point.name!r} "
            f"({entry_point.value}) gives {type(loaded).__name__}, which lacks "
            "instrument()/uninstrument(); point it at a module or object that has both."
        )
    return loaded


def instrument(names: Iterable[str] | str) -> list[IntegrationLike]:
    """Instrument several integrations by name (``"peft,sglang"`` or a list); all or nothing
    for unknown names: every name is looked up before any library is patched.

    Example:
        >>> from lora_guard import integrations
        >>> done = integrations.instrument("vllm")
        >>> [i.name for i in done]
        ['vllm']
        >>> integrations.uninstrument("vllm")
    """
    items = names.split(",") if isinstance(names, str) else list(names)
    found = [get(n.strip()) for n in items if n.strip()]
    for integration in found:
        integration.instrument()
    return found


def uninstrument(names: Iterable[str] | str) -> None:
    """Uninstrument several integrations by name (see `instrument`).

    Example:
        >>> from lora_guard import integrations
        >>> integrations.uninstrument(["peft"])
    """
    items = names.split(",") if isinstance(names, str) else list(names)
    for integration in [get(n.strip()) for n in items if n.strip()]:
        integration.uninstrument()
