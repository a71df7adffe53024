"""`Report`: the answer of `check_adapters`, and its JSON form (``schema_version`` 1)."""

from __future__ import annotations

import json
import pathlib
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from lora_guard._checking.limits import ServingLimits
from lora_guard._core.config import report as _report
from lora_guard._core.errors import Violation
from lora_guard._reading.adapters import AdapterSpec

__all__ = ["SCHEMA_VERSION", "SET", "Report"]

SCHEMA_VERSION = 1
"""Version of `Report.to_dict`'s JSON schema; bumped only on an incompatible change."""
SET = "*"
"""The id under which `Report.by_adapter` holds the violations of the set as a whole."""


@dataclass(frozen=True)
class Report:
    """The answer of `check_adapters`: the adapters read, and every violation found.

    ``ok`` is True when nothing was found. ``by_adapter`` groups the violations by adapter id
    (``"*"`` holds those about the set as a whole, e.g. LG110). `to_dict` is the JSON form
    ``lora-guard check --format json`` prints (``schema_version`` 1).

    Example:
        >>> import tempfile, lora_guard as lg
        >>> from lora_guard.testing import write_adapter
        >>> root = tempfile.mkdtemp()
        >>> _ = write_adapter(f"{root}/math", rank=8), write_adapter(f"{root}/code", rank=64)
        >>> report = lg.check_adapters(root, lg.ServingLimits(max_rank=16))
        >>> report.ok, [spec.name for spec in report.adapters]
        (False, ['code', 'math'])
        >>> [v.code for v in report.violations]
        ['LG101']
    """

    adapters: tuple[AdapterSpec, ...]
    """The adapters that could be read, in the order checked."""
    violations: tuple[Violation, ...]
    """Every violation, grouped by adapter in the order checked, then the set's."""
    ids: tuple[str, ...] = ()
    """Every adapter id checked (readable or not), in order."""
    by_adapter: Mapping[str, tuple[Violation, ...]] = field(
        default_factory=lambda: types.MappingProxyType({}))
    """Adapter id -> its violations (``"*"`` for the set's)."""
    limits: ServingLimits | None = None
    """The limits checked against."""
    skipped: tuple[str, ...] = ()
    """Checks that were not run, each with why (e.g. the base-model check when a serve
    command names a Hub model whose config.json could not be had); in `to_dict` as
    ``skipped`` when any."""

    @property
    def ok(self) -> bool:
        """True when no violation was found."""
        return not self.violations

    def spec(self, adapter_id: str) -> AdapterSpec | None:
        """The spec of a checked adapter id, None if it could not be read."""
        # An index built on the first lookup: the text report looks up every adapter, and a
        # scan per lookup made it quadratic in the number of adapters.
        index: dict[str, AdapterSpec] | None = self.__dict__.get("_spec_index")
        if index is None:
            index = {}
            for s in self.adapters:
                index.setdefault(str(s.path), s)
            object.__setattr__(self, "_spec_index", index)
        return _lookup(index, adapter_id)

    def codes(self) -> list[str]:
        """The codes of `violations`, in order."""
        return [v.code for v in self.violations]

    def enforce(self) -> None:
        """Report the violations through the mode: raises `lora_guard.AdapterError` (or the
        error of the first violation's code) in ``raise`` mode, warns in ``warn`` mode."""
        _report(list(self.violations))

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``schema_version`` 1): see the checking guide for every field."""
        return self._dict(list(self._entries()))

    def to_json(self) -> str:
        """`to_dict` as JSON text, exactly ``json.dumps(report.to_dict(), indent=2)``, built
        one adapter at a time so that 100,000 adapters never exist as one nested dict."""
        return "".join(self.json_chunks())

    def json_chunks(self) -> Iterator[str]:
        """`to_json`'s text in pieces, one adapter's entry at a time: written as they come
        (``lora-guard check --format json``), 100,000 adapters' report is never held whole.

        Example:
            >>> import lora_guard as lg
            >>> report = lg.Report(adapters=(), violations=())
            >>> "".join(report.json_chunks()) == report.to_json()
            True
        """
        head, tail = json.dumps(self._dict(_ADAPTERS_HOLE), indent=2).split(
            json.dumps(_ADAPTERS_HOLE), 1)
        yield head
        if not self.ids:
            yield "[]"
        else:
            pad = "[\n    "
            for entry in self._entries():
                yield pad + _indented(entry, "\n    ")
                pad = ",\n    "
            yield "\n  ]"
        yield tail

    def _entries(self) -> Iterator[dict[str, Any]]:
        specs = {str(s.path): s for s in self.adapters}
        for adapter_id in self.ids:
            yield _entry(adapter_id, _lookup(specs, adapter_id),
                         self.by_adapter.get(adapter_id, ()))

    def _dict(self, adapters: Any) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for v in self.violations:
            counts[v.code] = counts.get(v.code, 0) + 1
        return {
            "schema_version": SCHEMA_VERSION,
            "ok": self.ok,
            "limits": self.limits.to_dict() if self.limits else ServingLimits().to_dict(),
            "summary": {
                "adapters": len(self.ids),
                "failed": sum(1 for i in self.ids if self.by_adapter.get(i)),
                "violations": len(self.violations),
                "by_code": dict(sorted(counts.items())),
            },
            "adapters": adapters,
            "set_violations": [v.to_dict() for v in self.by_adapter.get(SET, ())],
        } | ({"skipped": list(self.skipped)} if self.skipped else {})


_ADAPTERS_HOLE = "\x00adapters\x00"  # where `Report.to_json` puts the adapters' text


def _entry(adapter_id: str, spec: AdapterSpec | None,
           found: tuple[Violation, ...]) -> dict[str, Any]:
    """One adapter of `Report.to_dict`."""
    entry: dict[str, Any] = {
        "id": adapter_id,
        "ok": not found,
        "readable": spec is not None,
        "rank": None, "dtypes": [], "layout": None, "targets": [], "size": None,
        "features": [], "modules": 0, "tensors": 0,
        "base_model": None,
    }
    if spec is not None:
        entry.update(
            rank=spec.rank, dtypes=list(spec.dtypes), layout=spec.layout,
            targets=list(spec.target_modules), size=spec.size,
            features=sorted(spec.features), modules=len(spec.modules),
            tensors=len(spec.tensors),
            base_model=spec.config.get("base_model_name_or_path"),
        )
        if spec.url is not None:  # a remote adapter: what its check cost
            entry["url"], entry["transferred"] = spec.url, spec.transferred
    entry["violations"] = [v.to_dict() for v in found]
    return entry


def _spec_key(adapter_id: str) -> str:
    return str(pathlib.Path(adapter_id))


def _lookup(index: Mapping[str, AdapterSpec], adapter_id: str) -> AdapterSpec | None:
    """``index.get(_spec_key(adapter_id))``, without building a path for an id that is
    already spelled as its path (every id the search finds; the spelling is idempotent)."""
    found = index.get(adapter_id)
    return found if found is not None else index.get(_spec_key(adapter_id))


_ENCODE_STR = json.JSONEncoder().encode  # a str: its JSON text, ASCII as json.dumps writes it


def _indented(value: Any, pad: str) -> str:
    """``json.dumps(value, indent=2)`` with every line after the first indented by ``pad``'s
    spaces (``pad`` is a newline and the indent of ``value``'s level): the same text,
    without the encoder's generator machinery (the report's JSON is 2-3x faster). A value
    this does not know is handed to `json.dumps`, which says why it cannot be encoded."""
    if isinstance(value, str):
        return _ENCODE_STR(value)
    if value is None or value is True or value is False:
        return "null" if value is None else "true" if value else "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return _float_text(value)
    inner = pad + "  "
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        return "[" + inner + ("," + inner).join([_indented(v, inner) for v in value]) + (
            pad + "]")
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{" + inner + ("," + inner).join([
            _key_text(k) + ": " + _indented(v, inner) for k, v in value.items()]) + pad + "}"
    return json.dumps(value, indent=2)  # raises TypeError naming the type


def _float_text(value: float) -> str:
    """A float as `json.dumps` writes it (``allow_nan``: NaN, Infinity, -Infinity)."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return float.__repr__(value)


def _key_text(key: Any) -> str:
    """A dict key as `json.dumps` writes it: strings as they are, numbers, booleans and None
    as their JSON text, quoted."""
    if isinstance(key, str):
        return _ENCODE_STR(key)
    if isinstance(key, (int, float)) or key is None:
        text = _indented(key, "")
        return _ENCODE_STR(text)
    return json.dumps({key: None})  # raises TypeError naming the key's type

