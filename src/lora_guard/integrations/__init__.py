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
from dataclasses import dataclass
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

_BUILTIN = {"lmdeploy": "lmdeploy", "peft": "peft", "sglang": "sglang", "vllm": "vllm"}


@runtime_checkable
class IntegrationLike(Protocol):
    """What every integration `get` returns has: its `name`, whether it is `instrumented`,
    and `instrument` / `uninstrument`. An `Integration` has all four; an entry point's object
    that has only the two methods (a plain module, say) is given the other two by `get`.

    Example:
        >>> from lora_guard import integrations
        >>> peft = integrations.get("peft")
        >>> isinstance(peft, integrations.IntegrationLike), peft.name
        (True, 'peft')
        >>> type(peft.instrumented)  # True under pytest --lora-guard-instrument=peft
        <class 'bool'>
    """

    @property
    def name(self) -> str:
        """The name `get` knows it by (``"peft"``)."""
        ...

    @property
    def instrumented(self) -> bool:
        """True between `instrument` and `uninstrument`."""
        ...

    def instrument(self) -> object:
        """Put the guards in front of the library's entry points."""
        ...

    def uninstrument(self) -> None:
        """Take the guards away again."""
        ...


@runtime_checkable
class _Instrumentable(Protocol):
    """The least an entry point's object must offer."""

    def instrument(self) -> object: ...

    def uninstrument(self) -> None: ...


@dataclass(eq=False)
class _EntryPointIntegration:
    """An entry point's object that has only ``instrument()`` / ``uninstrument()``, named after
    its entry point (or its own ``name``), its state kept here; other attributes are its own."""

    name: str
    target: _Instrumentable
    instrumented: bool = False

    def instrument(self) -> object:
        result = self.target.instrument()
        self.instrumented = True
        return result

    def uninstrument(self) -> None:
        self.target.uninstrument()
        self.instrumented = False

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.target, attr)


# One wrapper per entry point object, so that its state is the same for every `get`.
_WRAPPED: dict[str, _EntryPointIntegration] = {}


def _as_integration(entry_point: importlib.metadata.EntryPoint, loaded: Any) -> IntegrationLike:
    if isinstance(loaded, IntegrationLike):
        return loaded
    if not isinstance(loaded, _Instrumentable):
        raise TypeError(
            f"the {ENTRY_POINT_GROUP!r} entry point {entry_point.name!r} "
            f"({entry_point.value}) gives {type(loaded).__name__}, which lacks "
            "instrument()/uninstrument(); point it at a module or object that has both."
        )
    wrapped = _WRAPPED.get(entry_point.value)
    if wrapped is None or wrapped.target is not loaded:
        own = getattr(loaded, "name", None)
        wrapped = _EntryPointIntegration(own if isinstance(own, str) else entry_point.name,
                                         loaded)
        _WRAPPED[entry_point.value] = wrapped
    return wrapped


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
    TypeError when an entry point's object lacks ``instrument``/``uninstrument``. What it
    returns has a `name` and an `instrumented` state (`IntegrationLike`), whatever the entry
    point gives.

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
    return _as_integration(entry_point, entry_point.load())


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
