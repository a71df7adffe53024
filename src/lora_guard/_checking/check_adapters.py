"""Will these adapters serve together? `ServingLimits`, `check_adapters` -> `Report`."""

from __future__ import annotations

import functools
import json
import operator
import os
import pathlib
import re
import stat
import types
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple, Union, cast

from lora_guard._checking.checks import MoELayout, check_moe_layouts
from lora_guard._checking.registry import registered_violations
from lora_guard._core.config import report as _report
from lora_guard._core.errors import Violation, make_violation
from lora_guard._reading.adapters import (
    FEATURES,
    AdapterSpec,
    LoRAModuleSpec,
    Malformed,
    init_method,
    is_adapter_dir,
    join_name,
    load_spec,
    malformed_violation,
    parameter_key,
    pattern_value,
    read_folders,
)
from lora_guard._reading.architectures import ARCHITECTURE_NAMES
from lora_guard._reading.basemodel import BaseModelDims, load_base_config
from lora_guard._reading.safetensors import DTYPE_NAMES, safetensors_code

__all__ = [
    "SCHEMA_VERSION",
    "Report",
    "ServingLimits",
    "adapter_servable",
    "check_adapters",
    "spec_violations",
]

SCHEMA_VERSION = 1
ENGINE_RULES = ("packed-slices", "packed-ranks-uniform", "one-scaling", "rank-from-set",
                "init-rerun", "cast", "packed-names-native", "heads-need-pooling",
                "target-modules-list", "plain-embeddings-refused", "bias-by-tensors")
_RERUN_INITS = ("pissa", "olora")  # deterministic: PEFT's loading rewrites the base again
"""Version of `Report.to_dict`'s JSON schema; bumped only on an incompatible change."""

PathOrSpec = Union[str, "os.PathLike[str]", AdapterSpec]
_SET = "*"
_MAX_PER_KIND = 10

_FEATURE_TEXT = {
    "dora": "DoRA",
    "lora_bias": "a LoRA bias",
    "bias": "trained biases",
    "modules_to_save": "full weights of modules_to_save",
    "trainable_tokens": "trainable tokens",
    "peft_type": "a PEFT method other than LoRA",
    "alora": "activated LoRA",
    "layer_replication": "layer replication",
    "qalora": "QALoRA",
    "bdlora": "block-diagonal LoRA (BD-LoRA)",
    "added_tokens": "added tokens",
}


def _positive_int(owner: str, name: str, value: object) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{owner}({name}=...) must be a positive int or None, got {value!r}")


def _names(owner: str, name: str, value: object, example: str) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ValueError(
            f"{owner}({name}=...) takes a collection of names such as {example}, got {value!r}"
        )
    items = list(value)
    if not items or not all(isinstance(v, str) and v for v in items):
        raise ValueError(
            f"{owner}({name}=...) takes a non-empty collection of names such as {example}, "
            f"got {items!r}"
        )
    return frozenset(items)


def _ranks(value: object) -> frozenset[int] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(
            f"ServingLimits(allowed_ranks=...) takes a collection of ranks such as (8, 16), "
            f"got {value!r}"
        )
    listed = list(value)
    if not listed or not all(
            isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in listed):
        raise ValueError(
            "ServingLimits(allowed_ranks=...) takes a non-empty collection of positive ints "
            f"such as (8, 16), got {listed!r}"
        )
    return frozenset(listed)


_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _dtypes(value: object) -> frozenset[str] | None:
    dtypes = _names("ServingLimits", "dtypes", value, "('bfloat16', 'float16')")
    if dtypes is None:
        return None
    normal = set()
    for d in dtypes:
        try:
            normal.add(DTYPE_NAMES[safetensors_code(_DTYPE_ALIASES.get(d, d))])
        except ValueError:
            raise ValueError(
                f"ServingLimits(dtypes=...) got unknown dtype {d!r}; use names such as "
                "'bfloat16', 'float16', 'float32'"
            ) from None
    return frozenset(normal)


def _known(owner: str, name: str, value: object, known: Iterable[str],
           what: str) -> frozenset[str]:
    """An optional set of names, each one of ``known`` (``allow``, ``engine_rules``)."""
    if not value:
        return frozenset()
    example = f"({next(iter(known))!r},)"
    names = _names(owner, name, value, example) or frozenset()
    unknown = sorted(names - set(known))
    if unknown:
        raise ValueError(
            f"{owner}({name}=...) got unknown {what}(s) {unknown}; known {what}s: "
            f"{', '.join(known)}"
        )
    return names


@dataclass(frozen=True)
class ServingLimits:
    """What a server serves: max rank, ranks, slots, modules, dtypes, base model, features.

    Every option is optional and validated when the limits are made. ``base_config`` is the
    base model's Hugging Face ``config.json`` (a path, a folder holding it, or a dict).
    ``allow`` names config features the server does implement (``dora``, ``lora_bias``,
    ``bias``, ``modules_to_save``, ``trainable_tokens``, ``peft_type``, ``alora``,
    ``layer_replication``, ``qalora``, ``bdlora``, ``added_tokens``); any other feature in
    use is LG105.

    Example:
        >>> import lora_guard as lg
        >>> limits = lg.ServingLimits(max_rank=16, target_modules=("q_proj", "v_proj"),
        ...                           dtypes=("bf16", "float16"))
        >>> sorted(limits.dtypes)
        ['bfloat16', 'float16']
        >>> lg.ServingLimits(max_rank=0)
        Traceback (most recent call last):
        ...
        ValueError: ServingLimits(max_rank=...) must be a positive int or None, got 0
    """

    max_rank: int | None = None
    """Largest rank the server's pool holds (vLLM ``max_lora_rank``)."""
    allowed_ranks: Collection[int] | None = None
    """Ranks the server serves, when it serves only some."""
    max_loras: int | None = None
    """Adapter slots (vLLM ``max_loras``, sglang ``max_loras_per_batch``)."""
    target_modules: Collection[str] | None = None
    """Module types (or module path suffixes) the server applies LoRA to."""
    dtypes: Collection[str] | None = None
    """Allowed dtypes, as torch-style names."""
    base_config: str | os.PathLike[str] | Mapping[str, Any] | None = None
    """The base model's config.json (path, folder or dict), as given."""
    allow: Collection[str] = frozenset()
    """Features the server implements (names as above)."""
    engine: str | None = None
    """The engine release these limits are of (``"vllm==0.34.0"``), set by `for_engine`."""
    engine_options: Mapping[str, Any] = field(default_factory=dict)
    """The engine's LoRA flags as it resolves them (its defaults filled in), by `for_engine`."""
    served_heads: Collection[str] | None = None
    """``modules_to_save`` heads the server serves although it refuses others (vLLM
    ``classifier``, ``score``)."""
    max_loaded: int | None = None
    """Adapters the engine holds loaded at once and refuses to load past (sglang
    ``--max-loaded-loras``): more adapters than that in the set is LG110."""
    engine_rules: Collection[str] = frozenset()
    """The engine's own rules, by name: ``packed-slices`` (a packed module and its parts
    match each other), ``packed-ranks-uniform`` (LG111), ``one-scaling`` (LG112),
    ``rank-from-set`` (no max rank given: the largest ``r`` of the set is the pool's),
    ``cast`` (every weight is cast to the engine's dtype: mixed dtypes serve, LG106 only for
    ``dtypes`` given), ``init-rerun`` (PEFT: loading a PiSSA/OLoRA adapter redoes its
    deterministic init on the base, so it serves as trained), ``packed-names-native`` (a
    weight named by a packed module, ``qkv_proj``, loads only on a base that has that module:
    vLLM), ``heads-need-pooling`` (`served_heads` only on a base that is not a generative
    ``*ForCausalLM``: vLLM's generate runner has no classifier), ``target-modules-list``
    (``target_modules`` as a string other than ``all``/``all-linear`` is refused: sglang,
    LG202)."""
    base: BaseModelDims | None = field(default=None, init=False, repr=False, compare=False)
    """The dims read from ``base_config``."""

    if TYPE_CHECKING:  # typed as users pass them (any iterable), kept as frozensets
        def __init__(
            self, max_rank: int | None = None, allowed_ranks: Iterable[int] | None = None,
            max_loras: int | None = None, target_modules: Iterable[str] | None = None,
            dtypes: Iterable[str] | None = None,
            base_config: str | os.PathLike[str] | Mapping[str, Any] | None = None,
            allow: Iterable[str] = (), engine: str | None = None,
            engine_options: Mapping[str, Any] = types.MappingProxyType({}),
            served_heads: Iterable[str] | None = None, max_loaded: int | None = None,
            engine_rules: Iterable[str] = (),
        ) -> None: ...

    def __post_init__(self) -> None:
        owner = "ServingLimits"
        _positive_int(owner, "max_rank", self.max_rank)
        _positive_int(owner, "max_loras", self.max_loras)
        _positive_int(owner, "max_loaded", self.max_loaded)
        self._set("allowed_ranks", _ranks(self.allowed_ranks))
        self._set("target_modules", _names(
            owner, "target_modules", self.target_modules, "('q_proj', 'v_proj')"))
        self._set("dtypes", _dtypes(self.dtypes))
        self._set("allow", _known(owner, "allow", self.allow, FEATURES, "feature"))
        self._set("served_heads", _names(owner, "served_heads", self.served_heads,
                                         "('score',)"))
        self._set("engine_rules", _known(owner, "engine_rules", self.engine_rules,
                                         ENGINE_RULES, "rule"))
        if not isinstance(self.engine_options, Mapping):
            raise ValueError("ServingLimits(engine_options=...) takes a mapping of option "
                             f"names to values, got {type(self.engine_options).__name__}")
        self._set("engine_options", types.MappingProxyType(dict(self.engine_options)))
        if self.base_config is not None:
            if not isinstance(self.base_config, (str, os.PathLike, Mapping)):
                raise ValueError(
                    "ServingLimits(base_config=...) takes a config.json path or a dict, got "
                    f"{type(self.base_config).__name__}"
                )
            self._set("base", load_base_config(self.base_config))

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)

    @classmethod
    def for_engine(cls, name: str, *argv: str | Sequence[str], version: str | None = None,
                   **engine_options: Any) -> ServingLimits:
        """The limits of one engine release, from its own serve flags and defaults.

        ``name`` is ``"vllm"``, ``"sglang"`` or ``"peft"``, optionally pinned
        (``"vllm==0.34.0"``; ``version=`` does the same); without a version the newest
        supported release. ``argv`` are the engine's flags as on its command line
        (``"--max-lora-rank", "64"``, or one list of them; flags that do not bear on LoRA are
        ignored);
        ``engine_options`` the same by their Python names (``max_lora_rank=64``), plus
        ``base_config=``. The engine's defaults fill in the rest (vLLM ``max_lora_rank`` 16).
        An unknown engine or release, a LoRA flag that cannot be parsed or a combination the
        engine refuses to start with raises ``ValueError`` naming it.

        The profile is the engine's rules with their sources (``docs/engines/``): it passes
        what the engine loads *and* serves correctly.

        Example:
            >>> import lora_guard as lg
            >>> limits = lg.ServingLimits.for_engine("vllm", max_lora_rank=64)
            >>> limits.engine, limits.max_rank, limits.max_loras
            ('vllm==0.34.0', 64, None)
            >>> lg.ServingLimits.for_engine("sglang", "--max-loaded-loras", "16").max_loaded
            16
            >>> lg.ServingLimits.for_engine("vllm", "--max-lora-rank", "24")  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            lora_guard._checking.engines.EngineOptionError: --max-lora-rank '24': not one of ...
        """
        from lora_guard._checking.engines import limits_for_engine

        limits: ServingLimits = limits_for_engine(name, *argv, version=version,
                                                  **engine_options)
        return limits

    def to_dict(self) -> dict[str, Any]:
        """The limits as JSON-ready values (sets as sorted lists)."""
        def listed(v: Collection[Any] | None) -> list[Any] | None:
            return None if v is None else sorted(v)

        base = self.base_config
        return {
            "max_rank": self.max_rank,
            "allowed_ranks": listed(self.allowed_ranks),
            "max_loras": self.max_loras,
            "target_modules": listed(self.target_modules),
            "dtypes": listed(self.dtypes),
            "base_config": None if base is None else
            ("<dict>" if isinstance(base, Mapping) else os.fspath(base)),
            "allow": sorted(self.allow),
            **({} if self.engine is None else {
                "engine": self.engine,
                "engine_options": {k: sorted(v) if isinstance(v, (set, frozenset)) else v
                                   for k, v in self.engine_options.items()},
                "max_loaded": self.max_loaded,
            }),
        }


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
        text = json.dumps(self._dict(_ADAPTERS_HOLE), indent=2)
        entries = [_indented(e, "\n    ") for e in self._entries()]
        listed = "[\n    " + ",\n    ".join(entries) + "\n  ]" if entries else "[]"
        return text.replace(json.dumps(_ADAPTERS_HOLE), listed, 1)

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
            "set_violations": [v.to_dict() for v in self.by_adapter.get(_SET, ())],
        }


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


_ENCODE_STR = json.encoder.encode_basestring_ascii


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


def _fetch_remote(items: list[PathOrSpec]) -> dict[int, list[tuple[str, Future[Any]]]]:
    if not any(isinstance(i, str) and ("://" in i or i.count("/") == 1) for i in items):
        return {}  # no URL, no Hub id: the remote module is not even imported
    from lora_guard._reading.remote import fetch_remote

    return fetch_remote(items)


# --- discovery -----------------------------------------------------------------------------


MAX_SEARCH_DEPTH = 64
"""Deepest folder a search descends to below the path given (an upload nests 3 or 4)."""
MAX_SEARCH_ENTRIES = 200_000
"""Most folder entries a search looks at, in all; past it the search stops and says so."""


_Target = Union[AdapterSpec, pathlib.Path, str, Malformed, "Future[Any]"]
"""What one discovered adapter is read from: a spec given, a folder, a problem already
known, or a remote read under way."""
_Found = tuple[str, _Target, str]
"""(adapter id, what to read, its real path: two ids of one real folder are checked once)."""


def _discover(item: PathOrSpec) -> list[_Found]:
    """The adapters a path names: itself, its parent (a file of an adapter), or the adapter
    folders found below it; a problem is itself an entry (`Malformed`)."""
    if isinstance(item, AdapterSpec):
        return [(str(item.path), item, os.path.realpath(item.path))]
    path = pathlib.Path(item)
    shown = os.fspath(item)
    info = _stat(path, shown)
    if isinstance(info, Malformed):
        return [(shown, info, shown)]
    if stat.S_ISREG(info.st_mode) and path.name in (
            "adapter_config.json", "adapter_model.safetensors"):
        return [(str(path.parent), path.parent, os.path.realpath(path.parent))]
    if not stat.S_ISDIR(info.st_mode):
        return [(shown, Malformed(shown, "not an adapter folder", kind="not-found"), shown)]
    if is_adapter_dir(path):
        return [(shown, path, os.path.realpath(path))]
    found = _search(str(path), os.path.realpath(path), shown)
    if not found:
        return [(shown, Malformed(
            shown, "no adapter found (no folder holding adapter_config.json or "
            "adapter_model.safetensors)", kind="not-found"), shown)]
    return found


def _stat(path: pathlib.Path, shown: str) -> os.stat_result | Malformed:
    try:
        return os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            return Malformed(shown, "a symlink that leads nowhere", kind="not-found")
        return Malformed(shown, "no such file or folder", kind="not-found")
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return Malformed(shown, f"cannot be read ({reason})", kind="not-found")


def _search(root: str, real_root: str, shown: str) -> list[_Found]:
    """The adapter folders below ``root``, depth first in name order, without following a
    symlink; each one's real path is its parent's and its name (no ``realpath`` per
    adapter: the search never leaves a real folder)."""
    found: list[_Found] = []
    stack: list[tuple[str, str, int]] = [(root, real_root, 0)]  # iterative: no recursion limit
    seen = 0
    while stack:
        here, real, depth = stack.pop()
        children = _children(here, found)
        seen += len(children)
        if seen > MAX_SEARCH_ENTRIES:
            found.append((shown, Malformed(
                shown, f"search stopped after {MAX_SEARCH_ENTRIES:,} folder entries; name the "
                "adapter folders instead", kind="not-found"), shown))
            break
        below = [(_child(here, entry), join_name(real, entry.name), depth + 1)
                 for entry in children if _visit(entry, here, real, depth, shown, found)]
        stack.extend(reversed(below))
    return found


def _children(here: str, found: list[_Found]) -> list[os.DirEntry[str]]:
    """The entries of a folder in name order; a folder that cannot be read is reported."""
    try:
        with os.scandir(here) as entries:
            return sorted(entries, key=_BY_NAME)
    except OSError as exc:
        found.append((here, Malformed(
            here, f"folder cannot be read ({exc.strerror or type(exc).__name__}); "
            "adapters in it were not checked", kind="not-found"), here))
        return []


_BY_NAME = operator.attrgetter("name")


def _child(here: str, entry: os.DirEntry[str]) -> str:
    """The entry's path as ``str(pathlib.Path(here) / name)`` spells it."""
    return entry.name if here == "." else entry.path


def _visit(entry: os.DirEntry[str], here: str, real: str, depth: int, shown: str,
           found: list[_Found]) -> bool:
    """Record ``entry`` if it is an adapter folder (or a problem); True to search below it."""
    child = _child(here, entry)
    try:
        if entry.is_symlink():
            if is_adapter_dir(child):  # said, not read: it may lead anywhere
                found.append((child, Malformed(
                    child, f"a symlinked folder (to {os.readlink(child)}) is not followed "
                    "when a folder is searched; pass it explicitly to check it",
                    kind="link"), child))
            return False
        if not entry.is_dir(follow_symlinks=False):
            return False
    except OSError:
        return False
    if is_adapter_dir(child):
        found.append((child, child, join_name(real, entry.name)))
        return False
    if depth + 1 >= MAX_SEARCH_DEPTH:
        found.append((child, Malformed(
            child, f"folders nest deeper than {MAX_SEARCH_DEPTH} levels below "
            f"{shown}; the search does not go further", kind="not-found"), child))
        return False
    return True


# --- checks on one adapter -----------------------------------------------------------------


def _share(part: int, whole: int) -> str:
    """``part`` as a percentage of ``whole``, for messages (``"93"``, ``"<1"``)."""
    if whole <= 0:
        return "0"
    share = 100 * part / whole
    return "<1" if 0 < share < 1 else f"{share:.0f}"


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
                modules=_more(zero[0], len(zero)) if zero else "every module"))
    for key, value in pattern.items():
        if value == 0:
            hit = [m for m in spec.modules if pattern_value(pattern, m) == 0]
            found.append(make_violation(
                "LG121", "config", subject, where=f"alpha_pattern[{key!r}]", value=value,
                modules=_more(hit[0], len(hit)) if hit else "no module of this adapter"))
    return found


def _more(first: str, count: int) -> str:
    return first if count <= 1 else f"{first} (and {count - 1} more)"


class _Grouped:
    """Collects (variant, values) -> first subject and count, to report each kind once."""

    def __init__(self) -> None:
        self.items: dict[tuple[Any, ...], list[Any]] = {}

    def add(self, group: tuple[Any, ...], name: str, details: dict[str, Any]) -> None:
        entry = self.items.setdefault(group, [name, 0, details])
        entry[1] += 1


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
                 found: list[Violation], grouped: _Grouped) -> None:
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


# Towers of a multimodal model have their own dims (vision_config, audio_config) that the
# language model's config does not give: their modules are not compared with it.
_OTHER_TOWERS = {
    "vision": ("vision", "visual", "image", "multi_modal", "mm_projector"),
    "audio": ("audio",),
}


_ANY_TOWER = re.compile("|".join(re.escape(mark) for marks in _OTHER_TOWERS.values()
                                 for mark in marks))


def _tower(module: str) -> str | None:
    """``vision`` or ``audio`` for a module of a non-text tower, else None."""
    if _ANY_TOWER.search(module) is None:  # one scan for every mark (most modules)
        return None
    for tower, marks in _OTHER_TOWERS.items():
        if any(mark in module for mark in marks):
            return tower
    return None


_TYPICAL_TARGETS = (
    "q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "gate_proj", "up_proj", "down_proj",
    "gate_up_proj", "c_attn", "c_proj", "c_fc", "query_key_value", "dense", "Wqkv", "out_proj",
    "fc1", "fc2", "w1", "w2", "w3", "wqkv", "wo", "query", "key", "value",
)
_HEADS = frozenset(("score", "classifier", "qa_outputs", "lm_head", "embed_tokens"))
_FUSED = {"gate_up_proj": ("gate_proj", "up_proj"), "qkv_proj": ("q_proj", "k_proj", "v_proj"),
          "w13": ("w1", "w3")}


def _foreign(module: LoRAModuleSpec, base: BaseModelDims,
             rules: Collection[str] = frozenset()) -> bool:
    """A module whose name the base model's architecture does not have (GPT-2's ``c_attn`` on
    a Llama base), when the architecture is known. Per-expert paths are not compared: their
    names changed between transformers releases (``block_sparse_moe.experts.0.w1``). A packed
    name whose parts the base has (``qkv_proj`` on Llama) is the base's unless the engine
    loads only the base's own names (``packed-names-native``)."""
    model_type = base.model_type or ""
    if model_type not in ARCHITECTURE_NAMES:
        return False
    return _foreign_name(module.module, model_type, "packed-names-native" not in rules)


@functools.lru_cache(maxsize=4096)
def _foreign_name(path: str, model_type: str, fused_ok: bool) -> bool:
    """`_foreign` of a module path (asked for every module of every adapter: remembered)."""
    names = ARCHITECTURE_NAMES[model_type]
    if ".experts." in path + ".":
        return False
    while path.endswith(".base_layer"):
        path = path[: -len(".base_layer")]
    leaf = path.rsplit(".", 1)[-1]
    if leaf in names or leaf in _HEADS:
        return False
    return not (fused_ok and leaf in _FUSED and all(part in names for part in _FUSED[leaf]))


def _check_base(subject: str, module: LoRAModuleSpec, base: BaseModelDims,
                grouped: _Grouped, rules: Collection[str] = frozenset()) -> None:
    key = module.a_key or module.b_key or module.module
    tower = _tower(module.module)
    if tower is not None:
        if base.multimodal and (tower in base.towers or not base.towers):
            return  # its dims are in the tower's own config
        grouped.add(("LG109", "tower", tower), key, {
            "tower": tower, "source": base.source})
        return
    if _foreign(module, base, rules):
        names = ARCHITECTURE_NAMES[base.model_type or ""]
        grouped.add(("LG109", "architecture", base.model_type), module.module, {
            "model_type": base.model_type,
            "example": ", ".join([n for n in _TYPICAL_TARGETS if n in names][:4]
                                 or sorted(names)[:4])})
        return
    if module.layer is not None and base.num_layers is not None and (
            module.layer >= base.num_layers):
        grouped.add(("LG109", "layer", module.layer), key,
                    {"layer": module.layer, "layers": base.num_layers})
        return
    moe = module.kind.startswith("moe")
    if moe and base.num_experts is not None:
        if module.expert is not None and module.expert >= base.num_experts:
            grouped.add(("LG109", "expert", module.expert), key,
                        {"expert": module.expert, "experts": base.num_experts})
            return
        if module.experts is not None and module.experts != base.num_experts and (
                module.experts != 1 or module.kind != "moe-packed"):
            grouped.add(("LG109", "dim", module.target, "expert-count", module.experts),
                        key, {"which": "expert", "got": module.experts,
                              "module_kind": f"{module.target} experts",
                              "expected": base.num_experts,
                              "source": f"num_experts {base.num_experts}"})
            return
    if moe and base.num_experts is None:
        grouped.add(("LG109", "dim", module.target, "experts"), key, {
            "which": "expert", "got": module.experts or "some",
            "module_kind": f"{module.target} experts", "expected": 0,
            "source": "the base config has no experts"})
        return
    if module.kind == "embedding":
        _check_fit(module, *base.expected("embed_tokens", moe=False), grouped,
                   module_kind="embed_tokens")
        return
    _check_fit(module, *base.expected(module.target, moe=moe, module=module.module), grouped)


Expected = tuple[int | None, str]
"""An expected dim and where it comes from, e.g. ``(64, "hidden_size 64")``; None: unknown."""


def _check_fit(module: LoRAModuleSpec, expected_in: Expected, expected_out: Expected,
               grouped: _Grouped, module_kind: str | None = None) -> None:
    """LG109: A's in dim and B's out dim against the module's dims on the base model
    (an embedding's in dim and lm_head's out dim are the vocab)."""
    got_in, got_out = module.in_features, module.out_features
    if (got_in is None or expected_in[0] is None or got_in == expected_in[0]) and (
            got_out is None or expected_out[0] is None or got_out == expected_out[0]):
        return  # both dims fit (most modules)
    key = module.a_key or module.b_key or module.module
    kind_name = module_kind or module.target
    sides = (("in", module.in_features, expected_in, module.a_key, module.kind == "embedding"),
             ("out", module.out_features, expected_out, module.b_key,
              module.target == "lm_head"))
    for which, got, (expected, source), tensor_key, is_vocab in sides:
        if got is None or expected is None or got == expected:
            continue
        if is_vocab:
            grouped.add(("LG109", "vocab", got), tensor_key or key,
                        {"got": got, "expected": expected})
        else:
            grouped.add(("LG109", "dim", kind_name, which, got), tensor_key or key, {
                "which": which, "got": got, "module_kind": kind_name, "expected": expected,
                "source": source})


def _check_vocab(module: LoRAModuleSpec, vocab: int, grouped: _Grouped) -> None:
    """LG109 against the vocab alone: an embedding's A and lm_head's B."""
    known: Expected = (vocab, f"vocab_size {vocab}")
    unknown: Expected = (None, "")
    if module.kind == "embedding":
        _check_fit(module, known, unknown, grouped)
    elif module.target == "lm_head":
        _check_fit(module, unknown, known, grouped)


def _check_saved_embeddings(spec: AdapterSpec, base: BaseModelDims, grouped: _Grouped) -> None:
    for key, what in spec.extra_keys.items():
        if what not in ("embedding-base", "modules_to_save"):
            continue
        shape = spec.tensors[key].shape
        leaf = key.removesuffix(".weight").removesuffix(".base_layer").rsplit(".", 1)[-1]
        if leaf not in ("embed_tokens", "lm_head") or len(shape) != 2 or not base.vocab_size:
            continue
        if shape[0] != base.vocab_size:
            grouped.add(("LG109", "vocab", shape[0]), key,
                        {"got": shape[0], "expected": base.vocab_size})


PACKED: Mapping[str, frozenset[str]] = types.MappingProxyType({
    "qkv_proj": frozenset({"q_proj", "k_proj", "v_proj"}),
    "gate_up_proj": frozenset({"gate_proj", "up_proj"}),
    "w13": frozenset({"w1", "w3"}),
})
"""Packed module -> the parts an adapter may name it by (vLLM ``packed_modules_mapping``,
sglang ``get_normalized_target_modules``)."""
_PART_OF = {part: packed for packed, parts in PACKED.items() for part in parts}


def _served(module: LoRAModuleSpec, served: Collection[str], slices: bool = False) -> bool:
    if module.target in served or any(
        module.module == s or module.module.endswith("." + s) for s in served
    ):
        return True
    # A packed target whose parts are all served, and a part whose packed module is served
    # (an engine that packs q/k/v applies LoRA to qkv_proj whichever names the adapter uses).
    if module.target in PACKED and PACKED[module.target].issubset(served):
        return True
    if _PART_OF.get(module.target) in served:
        return True
    if slices:  # the engine wraps the whole packed module when any part is targeted
        packed = module.target if module.target in PACKED else _PART_OF.get(module.target)
        if packed is not None and not PACKED[packed].isdisjoint(served):
            return True
    return module.kind in ("moe-flat", "moe-packed") and "experts" in served


def _packed_parent(module: LoRAModuleSpec) -> tuple[str, str] | None:
    packed = _PART_OF.get(module.target)
    if packed is None or not module.module.endswith(module.target):
        return None
    return module.module[: -len(module.target)].rstrip("."), packed


def _scaling(alpha: float, rank: int, rslora: bool) -> float:
    return float(alpha) / (rank ** 0.5 if rslora else rank)


def _engine_rules(subject: str, spec: AdapterSpec, limits: ServingLimits,
                  found: list[Violation], memo: _Memo | None = None) -> None:
    """The engine's own rules of one adapter (LG111, LG112, LG202)."""
    engine = limits.engine or "the server"
    rules = limits.engine_rules
    targets = spec.config.get("target_modules")
    if "target-modules-list" in rules and isinstance(targets, str) and (
            targets not in ("all", "all-linear")):
        found.append(make_violation("LG202", "target-string", subject, value=targets,
                                    engine=engine))
    if "packed-ranks-uniform" in rules:
        found.extend(_packed_ranks(subject, spec.modules, engine, memo))
    if "one-scaling" in rules:
        found.extend(_one_scaling(subject, spec.config, spec.modules, engine))
    if "plain-embeddings-refused" in rules:
        found.extend(_plain_embeddings(subject, spec, engine))


def _plain_embeddings(subject: str, spec: AdapterSpec, engine: str) -> list[Violation]:
    """LG104: full embedding weights saved as ``<module>.weight`` (``save_embedding_layers`` of
    an embedding that is no LoRA target), which an engine that reads saved embeddings only as
    ``<module>.base_layer.weight`` refuses (vLLM)."""
    return [make_violation(
        "LG104", "saved-embedding", subject, key=key, engine=engine,
        module=key.removesuffix(".weight").rsplit(".", 1)[-1])
        for key, what in spec.extra_keys.items()
        if what == "embedding-base" and not key.endswith(".base_layer.weight")][:_MAX_PER_KIND]


def _packed_ranks(subject: str, modules: Mapping[str, LoRAModuleSpec], engine: str,
                  memo: _Memo | None = None) -> list[Violation]:
    """LG111: the parts of one packed module at different ranks (modules without a rank are
    not compared); a header found uniform once is not grouped again."""
    if memo is not None and memo.packed.get(id(modules)) is modules:
        return []
    groups: dict[tuple[str, str], dict[str, int]] = {}
    for m in modules.values():
        parent = _packed_parent(m) if m.rank else None
        if parent is not None:
            groups.setdefault(parent, {})[m.target] = int(m.rank or 0)
    bad = [(k, v) for k, v in groups.items() if len(set(v.values())) > 1]
    if memo is not None and not bad:
        _remember(memo.packed, id(modules), modules)
    return [make_violation(
        "LG111", "packed", subject, packed=packed, layer=layer or "the model",
        parts=", ".join(sorted(parts)),
        ranks=", ".join(f"{k}={v}" for k, v in sorted(parts.items())), engine=engine)
        for (layer, packed), parts in bad[:_MAX_PER_KIND]]


def _one_scaling(subject: str, config: Mapping[str, Any],
                 modules: Mapping[str, LoRAModuleSpec], engine: str) -> list[Violation]:
    """LG112: a module (with a rank) whose own rank or alpha gives another scaling than the
    one the engine applies to every module (``lora_alpha / r``)."""
    try:
        r, alpha = int(config["r"]), float(config.get("lora_alpha", 8))
    except (KeyError, TypeError, ValueError):
        return []
    if r <= 0:
        return []
    rslora = bool(config.get("use_rslora"))
    served = alpha / r
    ranks = config.get("rank_pattern") or {}
    alphas = config.get("alpha_pattern") or {}
    if ranks or alphas:
        wrong = _own_scalings(modules, ranks, alphas, r, alpha, rslora, served)
    else:  # every module at r and lora_alpha: one scaling, compared once
        expected = _scaling(alpha, r, rslora)
        wrong = [] if not _scaling_differs(expected, served) else [
            (m.module, expected, "rsLoRA" if rslora else "") for m in modules.values()
            if m.rank]
    if not wrong:
        return []
    name, expected, why = wrong[0]
    return [make_violation(
        "LG112", "scaling", subject, module=_more(name, len(wrong)),
        expected=f"{expected:.4g}", why=why, engine=engine, served=f"{served:.4g}")]


def _scaling_differs(expected: float, served: float) -> bool:
    return abs(expected - served) > 1e-6 * max(abs(served), 1.0)


def _own_scalings(modules: Mapping[str, LoRAModuleSpec], ranks: Mapping[str, Any],
                  alphas: Mapping[str, Any], r: int, alpha: float, rslora: bool,
                  served: float) -> list[tuple[str, float, str]]:
    """(module, its scaling, why) of each module whose patterns give another scaling."""
    wrong: list[tuple[str, float, str]] = []
    for m in modules.values():
        if not m.rank:
            continue
        rank = pattern_value(ranks, m.module) if ranks else None
        own_alpha = pattern_value(alphas, m.module) if alphas else None
        rank = int(rank) if isinstance(rank, (int, float)) and rank > 0 else r
        a = float(own_alpha) if isinstance(own_alpha, (int, float)) else alpha
        expected = _scaling(a, rank, rslora)
        if _scaling_differs(expected, served):
            why = ", ".join(x for x in (
                f"rank {rank}" if rank != r else "", f"alpha {a:g}" if a != alpha else "",
                "rsLoRA" if rslora else "") if x)
            wrong.append((m.module, expected, why))
    return wrong


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


_ORDER = {c: i for i, c in enumerate(
    ("LG115", "LG116", "LG105", "LG118", "LG104", "LG103", "LG107", "LG102", "LG101",
     "LG111", "LG112", "LG106", "LG109", "LG121", "LG002"))}
"""The order of one adapter's violations in a report."""


class _Memo:
    """What one run's checks remember across adapters: outcomes that depend only on a
    header's tensors and modules (and the run's fixed limits). The reader hands adapters whose
    headers differ only in their metadata (a recipe's adapters) the same ``tensors`` and
    ``modules`` mappings, so each outcome is computed once per recipe, not once per adapter.
    Entries are keyed by the mappings' identities and hold the mappings (an identity cannot
    be reused while its entry lives); each memory is bounded."""

    __slots__ = ("empty", "modules", "moe", "packed")

    def __init__(self) -> None:
        self.empty: dict[int, tuple[Mapping[str, Any],
                                    tuple[tuple[str, ...], frozenset[str]]]] = {}
        self.modules: dict[tuple[int, int], _ModuleOutcome] = {}
        self.moe: dict[int, Mapping[str, Any]] = {}
        self.packed: dict[int, Mapping[str, Any]] = {}


_MEMO_SIZE = 256


def _remember(memory: dict[Any, Any], key: Any, value: Any) -> None:
    if len(memory) >= _MEMO_SIZE:
        memory.clear()
    memory[key] = value


def _check_spec(subject: str, spec: AdapterSpec, limits: ServingLimits, *,
                vocab_size: int | None = None,
                module_dims: Mapping[str, tuple[Expected, Expected]] | None = None,
                memo: _Memo | None = None,
                ) -> list[Violation]:
    found: list[Violation] = []
    grouped = _Grouped()
    empty = _file_checks(subject, spec, limits, found, vocab_size, module_dims, memo)
    if memo is not None and vocab_size is None and module_dims is None:
        ranks = _remembered_module_checks(subject, spec, limits, found, grouped, empty, memo)
    else:
        ranks = _module_checks(subject, spec, limits, found, grouped, empty, vocab_size,
                               module_dims)
    if limits.base is not None and spec.extra_keys:
        _check_saved_embeddings(spec, limits.base, grouped)
    _rank_checks(subject, spec, limits, ranks, found)
    _dtype_checks(subject, spec, limits, found)
    if limits.engine_rules:
        _engine_rules(subject, spec, limits, found, memo)
    if "init-rerun" in limits.engine_rules and str(
            spec.config.get("init_lora_weights")).lower() in _RERUN_INITS:
        found = [v for v in found if v.code != "LG116"]  # PEFT redoes the init when it loads
    for (code, variant, *_), (name, count, details) in grouped.items.items():
        target = "module" if code in ("LG102", "LG103", "LG104") else "key"
        found.append(make_violation(code, variant, subject, **{
            **details, target: _more(name, count)}))
    if spec.moe_layout is not None:  # LG002: one adapter whose own MoE weights mix layouts
        found.extend(_mixed_layouts(subject, spec.tensors, memo))
    found.extend(registered_violations(subject, spec, limits))  # invariants defined in one unit
    if len(found) > 1:
        found.sort(key=lambda v: _ORDER.get(v.code, 99))
    return found


def _file_checks(subject: str, spec: AdapterSpec, limits: ServingLimits,
                 found: list[Violation], vocab_size: int | None,
                 module_dims: Mapping[str, Any] | None,
                 memo: _Memo | None = None) -> frozenset[str]:
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
    for key in spec.unknown_keys[:_MAX_PER_KIND]:
        found.append(make_violation("LG104", "grammar", subject, key=key))
    if len(spec.unknown_keys) > _MAX_PER_KIND:
        rest = len(spec.unknown_keys) - _MAX_PER_KIND
        found.append(make_violation("LG104", "grammar", subject,
                                    key=f"... and {rest} more keys"))
    # LG107: zero-size tensors
    ordered, empty = _empty_tensors(spec.tensors, memo)
    for key in ordered:
        found.append(make_violation("LG107", "empty", subject, key=key,
                                    shape=spec.tensors[key].shape))
    return empty


_NO_KEYS: tuple[tuple[str, ...], frozenset[str]] = ((), frozenset())


def _empty_tensors(tensors: Mapping[str, Any],
                   memo: _Memo | None) -> tuple[tuple[str, ...], frozenset[str]]:
    """The keys of the zero-size tensors, in the header's order and as a set."""
    if memo is not None:
        hit = memo.empty.get(id(tensors))
        if hit is not None and hit[0] is tensors:
            return hit[1]
    ordered = tuple([key for key, info in tensors.items() if 0 in info.shape])
    empty = (ordered, frozenset(ordered)) if ordered else _NO_KEYS
    if memo is not None:
        _remember(memo.empty, id(tensors), (tensors, empty))
    return empty


def _mixed_layouts(subject: str, tensors: Mapping[str, Any],
                   memo: _Memo | None) -> list[Violation]:
    """LG002 within one adapter; a header found unmixed once is not classified again."""
    if memo is not None and memo.moe.get(id(tensors)) is tensors:
        return []
    mixed = check_moe_layouts(subject, tensors)[1]
    if memo is not None and not mixed:
        _remember(memo.moe, id(tensors), tensors)
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
        details = {"feature": _FEATURE_TEXT.get(name, name),
                   "value": f"{FEATURES.get(name, name)}={value!r}", "allow_name": name}
        saved = [k for k, what in spec.extra_keys.items() if what == name]
        if name == "modules_to_save" and saved:
            nbytes = sum(spec.tensors[k].nbytes for k in saved)
            found.append(make_violation(
                "LG105", "saved", subject, **details, nbytes=f"{nbytes:,}", bytes=nbytes,
                share=_share(nbytes, _total_bytes(spec)), saved=_more(
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
        "LG105", "added-tokens", subject, feature=_FEATURE_TEXT["added_tokens"],
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
                share=_share(info.nbytes, _total_bytes(spec)), module=leaf))


class _ModuleOutcome(NamedTuple):
    """What `_module_checks` found for one header's modules at one config ``r``."""

    modules: Mapping[str, LoRAModuleSpec]
    tensors: Mapping[str, Any]
    grouped: tuple[tuple[tuple[Any, ...], str, int, dict[str, Any]], ...]
    ranks: tuple[tuple[int, str], ...]


def _remembered_module_checks(subject: str, spec: AdapterSpec, limits: ServingLimits,
                              found: list[Violation], grouped: _Grouped,
                              empty: frozenset[str], memo: _Memo) -> dict[int, str]:
    """`_module_checks` in a set check, once per header and ``r``: the modules' outcome is
    the same for every adapter of a recipe. Computed each time: a ``rank_pattern`` or
    ``use_bdlora`` (they change what each module is compared with), and an outcome with an
    LG102 between A and B (its message names the adapter)."""
    config = spec.config
    if config.get("use_bdlora") is not None or config.get("rank_pattern"):
        return _module_checks(subject, spec, limits, found, grouped, empty, None, None)
    modules, tensors = spec.modules, spec.tensors
    key = (id(modules), int(config["r"]))
    hit = memo.modules.get(key)
    if hit is not None and hit.modules is modules and hit.tensors is tensors:
        for group, name, count, details in hit.grouped:
            grouped.items[group] = [name, count, details]
        return dict(hit.ranks)
    before = len(found)
    ranks = _module_checks(subject, spec, limits, found, grouped, empty, None, None)
    if len(found) == before:
        _remember(memo.modules, key, _ModuleOutcome(
            modules, tensors, tuple((group, name, count, details) for group, (
                name, count, details) in grouped.items.items()), tuple(ranks.items())))
    return ranks


def _module_checks(subject: str, spec: AdapterSpec, limits: ServingLimits,
                   found: list[Violation], grouped: _Grouped, empty: frozenset[str],
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
        if served is not None and not _served(module, served, slices):  # LG104
            grouped.add(("LG104", "module", module.target), module.module,
                        {"target": module.target, "served": ", ".join(sorted(served))})
        _check_ranks(subject, module, config_rank(module), found, grouped)  # LG102
        if module.rank:
            ranks.setdefault(module.rank, module.module)
        _check_dims(subject, module, limits, grouped, vocab_size, module_dims)  # LG109
    return ranks


def _orphan(module: LoRAModuleSpec, grouped: _Grouped) -> None:
    """LG103: a module with one half only."""
    embedding = module.kind == "embedding"
    a_name = "lora_embedding_A" if embedding else "lora_A"
    b_name = "lora_embedding_B" if embedding else "lora_B"
    present, missing = (a_name, b_name) if module.b_key is None else (b_name, a_name)
    grouped.add(("LG103", "orphan", present), module.module,
                {"present": present, "missing": missing})


def _check_dims(subject: str, module: LoRAModuleSpec, limits: ServingLimits,
                grouped: _Grouped, vocab_size: int | None,
                module_dims: Mapping[str, tuple[Expected, Expected]] | None) -> None:
    """LG109: fit to the base model (its live modules, its config, or its vocab alone)."""
    if module_dims is not None and module.module in module_dims:
        _check_fit(module, *module_dims[module.module], grouped)
    elif limits.base is not None:
        _check_base(subject, module, limits.base, grouped, limits.engine_rules)
    elif vocab_size is not None:
        _check_vocab(module, vocab_size, grouped)


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
                "LG106", "allowed", subject, dtype=dtype, key=_more(first, count),
                allowed=", ".join(sorted(limits.dtypes))))


_CODES = ("LG002", "LG101", "LG102", "LG103", "LG104", "LG105", "LG106", "LG107", "LG109",
          "LG111", "LG112", "LG115", "LG116", "LG118", "LG121")


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
    limits = _limits_argument("spec_violations", limits)
    skipped = _names("spec_violations", "skip", skip, "('LG106',)") if skip else frozenset()
    unknown = sorted(set(skipped or ()) - set(_CODES))
    if unknown:
        raise ValueError(
            f"spec_violations(skip=...) got {unknown}; it takes codes of one adapter's checks: "
            f"{', '.join(_CODES)}"
        )
    _positive_int("spec_violations", "vocab_size", vocab_size)
    found = _check_spec(subject or f"adapter {spec.name!r}", spec, limits,
                        vocab_size=vocab_size, module_dims=module_dims)
    return [v for v in found if v.code not in (skipped or ())]


def _as_list(paths_or_specs: PathOrSpec | Iterable[PathOrSpec]) -> list[PathOrSpec]:
    if isinstance(paths_or_specs, (str, os.PathLike, AdapterSpec)):
        return [paths_or_specs]
    if isinstance(paths_or_specs, Iterable):
        items = list(paths_or_specs)
        for item in items:
            if not isinstance(item, (str, os.PathLike, AdapterSpec)):
                raise TypeError(
                    "check_adapters takes paths (str or PathLike) or lg.AdapterSpec objects, "
                    f"got {type(item).__name__}"
                )
        return items
    raise TypeError(
        "check_adapters takes a path, an lg.AdapterSpec, or a list of them, got "
        f"{type(paths_or_specs).__name__}"
    )


def check_adapters(
    paths_or_specs: PathOrSpec | Iterable[PathOrSpec],
    limits: ServingLimits | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
    scan_values: bool = False,
) -> Report:
    """Check a set of adapters against what a server serves; never raises for a bad adapter.

    Each path is an adapter folder, or a folder searched for adapter folders (a folder with
    ``adapter_config.json`` or adapter weights is an adapter; otherwise its subfolders are
    searched); `AdapterSpec` objects are checked as they are. A path that holds no readable
    adapter is itself reported (LG108). Every check of LG101-LG110 runs on each adapter, then
    LG110 and LG002 across the set. ``progress(done, total)`` is called after each adapter.

    ``scan_values=True`` also reads each local adapter's tensor values once, in bounded
    chunks: a ``lora_B`` that is all zeros (LG119: the adapter does nothing) and NaN or Inf
    values (LG120). It costs about one read of the files (see the performance page); remote
    adapters are checked from their headers only.

    A path may also be remote: ``hf://ORG/REPO[@REV][/SUB]`` (or a bare Hub id ``ORG/NAME``
    that is not a local path), ``s3://BUCKET/PREFIX`` or ``https://...``, read from ranged
    reads of the config and header only, many at once (the ``lora-guard[remote]`` extra; see
    the remote guide). A remote adapter that cannot be fetched is reported as LG140.

    The report is returned, not raised: call `Report.enforce` to report it through the mode.

    Example:
        >>> import tempfile, lora_guard as lg
        >>> from lora_guard.testing import write_adapter
        >>> root = tempfile.mkdtemp()
        >>> _ = write_adapter(f"{root}/ok"), write_adapter(f"{root}/dora", defects=("dora",))
        >>> report = lg.check_adapters(root)
        >>> [(v.code, v.subject.split("/")[-1]) for v in report.violations]
        [('LG105', "dora'")]
        >>> lg.check_adapters(root, lg.ServingLimits(allow={"dora"})).ok
        True
    """
    limits = _limits_argument("check_adapters", limits)
    if progress is not None and not callable(progress):
        raise TypeError("check_adapters(progress=...) takes a callable(done, total) or None")
    if not isinstance(scan_values, bool):
        raise TypeError(f"check_adapters(scan_values=...) takes True or False, got "
                        f"{scan_values!r}")
    discovered = _discover_all(_as_list(paths_or_specs))
    run = _SetCheck(limits, scan_values)
    total = len(discovered)
    for start in range(0, total, _BATCH):
        batch = discovered[start:start + _BATCH]
        reads = _read_found(batch)
        for done, ((adapter_id, target), read) in enumerate(
                zip(batch, reads, strict=True), start + 1):
            run.add(adapter_id, target, read)
            if progress is not None:
                progress(done, total)
    return run.report()


_BATCH = 32
"""Adapters read together, a phase at a time (`read_folders`), then checked one by one."""


def _read_found(batch: list[tuple[str, _Target]]) -> list[AdapterSpec | Exception | None]:
    """What `read_folders` gives each folder the search found in ``batch``; None for the
    other targets (given specs, remote reads, named paths), which `_read` reads."""
    found = [i for i, (_, target) in enumerate(batch) if type(target) is str]
    reads: list[AdapterSpec | Exception | None] = [None] * len(batch)
    if found:
        results = read_folders([_folder(cast(str, batch[i][1])) for i in found])
        for i, result in zip(found, results, strict=True):
            reads[i] = result
    return reads


def _limits_argument(owner: str, limits: object) -> ServingLimits:
    if limits is None:
        return ServingLimits()
    if not isinstance(limits, ServingLimits):
        raise TypeError(
            f"{owner}(limits=...) takes an lg.ServingLimits, got {type(limits).__name__}"
        )
    return limits


def _discover_all(items: list[PathOrSpec]) -> list[tuple[str, _Target]]:
    """Every adapter the items name, each real folder once, in the order given."""
    discovered: list[tuple[str, _Target]] = []
    seen: set[str] = set()
    remote = _fetch_remote(items)  # hf://, s3://, https:// (read in parallel), else {}
    for index, item in enumerate(items):
        fetched = remote.get(index)
        found: Iterable[_Found] = (
            [(i, t, os.path.realpath(i)) for i, t in fetched] if fetched else _discover(item))
        for adapter_id, target, real in found:
            if real not in seen:
                seen.add(real)
                discovered.append((adapter_id, target))
    return discovered


_FILE_ERRORS = (OSError, ValueError, ArithmeticError, RecursionError, MemoryError)
"""Errors that say something about the adapter's files (unreadable, undecodable, a number
out of range): a verdict on the adapter (LG108). Any other exception is a bug in the checker
(LG900), re-raised with its traceback when ``LORA_GUARD_DEBUG=1``."""


def _debugging() -> bool:
    return os.environ.get("LORA_GUARD_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


def _internal_error(subject: str, exc: BaseException) -> Violation:
    """LG900: the checker itself failed on this adapter; where, for the bug report."""
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    where = (f"{os.path.basename(frame.tb_frame.f_code.co_filename)}:{frame.tb_lineno} "
             f"({frame.tb_frame.f_code.co_name})") if frame is not None else "unknown"
    return make_violation("LG900", "internal", subject, error=type(exc).__name__,
                          problem=str(exc)[:200], where=where)


def _read(adapter_id: str, subject: str, target: _Target) -> AdapterSpec | Violation:
    """The spec of a target the search did not read (`_read_found` reads the folders it
    found), or the violation that says why it cannot be read."""
    if isinstance(target, Future):
        target = target.result()
    if isinstance(target, Malformed):
        return malformed_violation(subject, target)
    if isinstance(target, AdapterSpec):
        return target
    try:
        return load_spec(cast("str | pathlib.Path", target))
    except Exception as exc:
        return _unreadable(adapter_id, subject, exc)


def _unreadable(adapter_id: str, subject: str, exc: Exception) -> Violation:
    """The violation of an adapter whose reading raised ``exc``: LG108 for what the files
    say (never a crash for one bad adapter), LG900 for a bug in the reader (re-raised, with
    its traceback, when ``LORA_GUARD_DEBUG=1``)."""
    if isinstance(exc, Malformed):
        return malformed_violation(subject, exc)
    if isinstance(exc, _FILE_ERRORS):
        return malformed_violation(subject, Malformed(
            adapter_id, f"could not be checked ({type(exc).__name__}: {exc})"))
    if _debugging():
        raise exc
    return _internal_error(subject, exc)


_PARENTS: dict[str, pathlib.Path] = {}


def _child_maker() -> Callable[[pathlib.Path, str], pathlib.Path] | None:
    """``pathlib``'s own way to make ``parent / name`` for a plain name without parsing it
    again (what ``Path.iterdir`` uses: 0.24 us against 0.92 for ``/`` on 3.11), when this
    Python has it and it gives exactly what ``/`` gives; else None (``/`` is used)."""
    make = getattr(pathlib.Path, "_make_child_relpath", None)
    try:
        probe = make(pathlib.Path("/p"), "q") if callable(make) else None
    except Exception:  # a private method whose signature changed: not used
        return None
    if not (isinstance(probe, pathlib.Path) and probe == pathlib.Path("/p/q")
            and str(probe) == "/p/q" and probe.name == "q"):
        return None
    return cast(Callable[[pathlib.Path, str], pathlib.Path], make)


_CHILD = _child_maker()



def _folder(found: str) -> pathlib.Path:
    """The path of a folder the search found, built on its parent's (the adapters of one
    folder share the parts of its path: 100,000 paths hold their own names only)."""
    head, _, name = found.rpartition(os.sep)
    if not head or not name:
        return pathlib.Path(found)
    parent = _PARENTS.get(head)
    if parent is None:
        if len(_PARENTS) >= 64:
            _PARENTS.clear()
        parent = _PARENTS[head] = pathlib.Path(head)
    return parent / name if _CHILD is None else _CHILD(parent, name)


def _verdict(adapter_id: str, subject: str, spec: AdapterSpec, limits: ServingLimits,
             scan_values: bool, memo: _Memo | None = None) -> tuple[list[Violation], bool]:
    """Every check of one readable adapter: its violations (LG900 for a bug in a check), and
    whether the checks ran to the end."""
    try:
        found = _check_spec(subject, spec, limits, memo=memo)
        if scan_values:
            from lora_guard._checking.values import (
                scan_violations,  # reads values: only when asked
            )

            found += scan_violations(spec, subject)
    except Malformed as exc:
        return [malformed_violation(subject, exc)], False
    except _FILE_ERRORS as exc:
        return [malformed_violation(subject, Malformed(
            adapter_id, f"could not be checked ({type(exc).__name__}: {exc})"))], False
    except Exception as exc:
        if _debugging():
            raise
        return [_internal_error(subject, exc)], False
    return found, True


class _SetCheck:
    """One pass over a set of adapters: each adapter's verdict as it is read, and only what
    the checks across the set need (the first MoE layout, the ranks of ``rank-from-set``)."""

    def __init__(self, limits: ServingLimits, scan_values: bool) -> None:
        self.limits = limits
        self.scan_values = scan_values
        self.specs: list[AdapterSpec] = []
        self.ids: list[str] = []
        self.by_adapter: dict[str, tuple[Violation, ...]] = {}
        self.pool: tuple[str, MoELayout] | None = None
        self.rank_from_set = ("rank-from-set" in limits.engine_rules
                              and limits.max_rank is None)
        self.largest_r: int | None = None
        self.patterns: list[tuple[str, Mapping[str, Any]]] = []
        self.memo = _Memo()

    def add(self, adapter_id: str, target: _Target,
            read_already: AdapterSpec | Exception | None = None) -> None:
        """Check one adapter: ``read_already`` is its spec or the error reading it raised,
        when it was read with others (`_read_found`); else it is read here."""
        self.ids.append(adapter_id)
        subject = f"adapter {adapter_id!r}"
        read: AdapterSpec | Violation
        if read_already is None:
            read = _read(adapter_id, subject, target)
        elif isinstance(read_already, Exception):
            read = _unreadable(adapter_id, subject, read_already)
        else:
            read = read_already
        if isinstance(read, Violation):
            self.by_adapter[adapter_id] = (read,)
            return
        found, checked = _verdict(adapter_id, subject, read, self.limits, self.scan_values,
                                  self.memo)
        if checked:
            self.specs.append(read)
            self._across(adapter_id, read, found)
        if found:
            self.by_adapter[adapter_id] = tuple(found)

    def _across(self, adapter_id: str, spec: AdapterSpec, found: list[Violation]) -> None:
        """Remember what the checks across the set need; LG002 against the pool's layout."""
        layout = spec.moe_layout
        if layout is not None and not any(v.code == "LG002" for v in found):
            if self.pool is None:
                self.pool = (adapter_id, layout)
            elif layout is not self.pool[1]:
                found.append(make_violation(
                    "LG002", "set", f"adapter {adapter_id!r}", layout=layout.value,
                    pool_layout=self.pool[1].value, owner=self.pool[0]))
        if self.rank_from_set:
            r = spec.config.get("r")
            if isinstance(r, int) and not isinstance(r, bool):
                self.largest_r = r if self.largest_r is None else max(self.largest_r, r)
            pattern = spec.config.get("rank_pattern")
            if pattern and isinstance(pattern, Mapping):
                self.patterns.append((adapter_id, pattern))

    def report(self) -> Report:
        by_adapter, ids, limits = self.by_adapter, self.ids, self.limits
        if self.rank_from_set and self.largest_r is not None:
            _rank_from_set(self.largest_r, self.patterns, by_adapter)
        if limits.max_loras is not None and len(ids) > limits.max_loras:
            by_adapter[_SET] = (make_violation(
                "LG110", "count", "adapter set", count=len(ids), max_loras=limits.max_loras),)
        if limits.max_loaded is not None and len(ids) > limits.max_loaded:
            by_adapter[_SET] = (*by_adapter.get(_SET, ()), make_violation(
                "LG110", "loaded", "adapter set", count=len(ids), limit=limits.max_loaded,
                engine=limits.engine or "the server",
                per_batch=limits.engine_options.get("max_loras_per_batch", "?")))
        violations = [v for i in [*ids, _SET] for v in by_adapter.get(i, ())]
        return Report(
            adapters=tuple(self.specs), violations=tuple(violations), ids=tuple(ids),
            by_adapter=types.MappingProxyType(by_adapter), limits=limits,
        )


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


def _rank_from_set(pool: int, patterns: list[tuple[str, Mapping[str, Any]]],
                   by_adapter: dict[str, tuple[Violation, ...]]) -> None:
    """No max rank given (sglang): the pool's rank is the largest ``r`` of the set; a
    ``rank_pattern`` value above it does not fit."""
    for adapter_id, pattern in patterns:
        over = sorted((int(v), k) for k, v in pattern.items()
                      if isinstance(v, int) and v > pool)
        if over:
            rank, key = over[-1]
            by_adapter[adapter_id] = (*by_adapter.get(adapter_id, ()), make_violation(
                "LG101", "max", f"adapter {adapter_id!r}", rank=rank,
                module=f"rank_pattern[{key!r}]", max_rank=pool))


def adapter_servable(spec: AdapterSpec | str | os.PathLike[str],
                     limits: ServingLimits | None = None) -> bool:
    """Every LG1xx check as a predicate: does this adapter serve within ``limits``?

    Raises nothing for a bad adapter (an unreadable one is simply not servable).

    Example:
        >>> import tempfile, lora_guard as lg
        >>> from lora_guard.testing import write_adapter
        >>> spec = lg.inspect_adapter(write_adapter(tempfile.mkdtemp() + "/a", rank=32))
        >>> lg.adapter_servable(spec, lg.ServingLimits(max_rank=64))
        True
        >>> lg.adapter_servable(spec, lg.ServingLimits(max_rank=16))
        False
    """
    return check_adapters([spec], limits).ok
