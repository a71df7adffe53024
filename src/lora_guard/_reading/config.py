"""``adapter_config.json``: its strict, bounded parse, the checks of LoRA's fields (one
validator per field, each naming the problem), the ReDoS bound on ``rank_pattern`` and
``alpha_pattern`` regexes, PEFT's first-match rule, and the forward-changing features."""

from __future__ import annotations

import importlib
import math
import os
import pathlib
import re
import sys
import types
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from lora_guard._reading.bounded import Bounded
from lora_guard._reading.files import (
    _config_bytes,
)
from lora_guard._reading.malformed import (
    ADDED_TOKENS_NAME,
    CONFIG_NAME,
    MAX_CONFIG_BYTES,
    Malformed,
    NotLoRA,
    other_method,
)
from lora_guard._reading.safetensors import (
    DuplicateKey,
    NonFinite,
    json_value_bound,
    strict_json,
)

FEATURES: Mapping[str, str] = types.MappingProxyType({
    "dora": "use_dora",
    "lora_bias": "lora_bias",
    "bias": "bias",
    "modules_to_save": "modules_to_save",
    "trainable_tokens": "trainable_token_indices",
    "peft_type": "peft_type",
    "alora": "alora_invocation_tokens",
    "layer_replication": "layer_replication",
    "qalora": "use_qalora",
    "bdlora": "use_bdlora",
    "added_tokens": ADDED_TOKENS_NAME,
})
"""Config features that change the forward pass, by the name ``ServingLimits(allow=...)``
takes, with the ``adapter_config.json`` field that turns each on (for ``added_tokens``, the
file of the folder)."""


INIT_METHODS: Mapping[str, str] = types.MappingProxyType({
    "pissa": "PiSSA", "olora": "OLoRA", "corda": "CorDA", "lora_ga": "LoRA-GA",
    "loftq": "LoftQ",
})
"""``init_lora_weights`` values whose initialisation rewrites the base weights (PiSSA also as
``pissa_niter_<n>``), with their names: such an adapter serves only on the rewritten base."""


def init_method(config: Mapping[str, Any]) -> str | None:
    """The name of the base-rewriting initialisation an adapter was saved with, or None
    (converted adapters say ``init_lora_weights: true``).

    Example:
        >>> from lora_guard._reading.adapters import init_method
        >>> init_method({"init_lora_weights": "pissa_niter_4"})
        'PiSSA'
        >>> init_method({"init_lora_weights": True}) is None
        True
    """
    value = config.get("init_lora_weights")
    if not isinstance(value, str):
        return None
    text = value.lower()
    if text.startswith("pissa"):
        return INIT_METHODS["pissa"]
    return INIT_METHODS.get(text)


class FrozenConfig(Mapping[str, Any]):
    """A read-only ``adapter_config.json``: what `AdapterSpec.config` holds.

    It reads like the dict it was built from (``[]``, ``get``, ``in``, iteration in the file's
    order, ``==`` with a dict, ``dict(config)`` for a copy) but cannot be changed: the
    adapters of one `Recipe` share one.

    A report keeps every adapter's config, so each is held compactly: its values in a tuple,
    beside the field names' positions, which the configs of one layout share (`Layout`, in
    `_LAYOUTS`: a fleet's configs have a few layouts, whatever their values); its strings,
    and those of a list of strings (``target_modules``), are Python's interned copies
    (`sys.intern`: one copy of each value, kept only while a config holds it). 100,000
    adapters that share no bytes keep about 0.7 KB of config each, not 4.2 KB (see the
    performance page).

    Example:
        >>> from lora_guard._reading.adapters import FrozenConfig
        >>> config = FrozenConfig({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]})
        >>> config["r"], config.get("bias", "none"), "lora_alpha" in config
        (8, 'none', True)
        >>> config == {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}
        True
    """

    __slots__ = ("_fields", "_values")

    def __init__(self, config: Mapping[str, Any]) -> None:
        names, values = tuple(config), list(config.values())
        layout = _LAYOUTS.get_or_make(names, lambda: _layout(names, values))
        for at in layout.texts:
            value = values[at]
            if type(value) is str:
                values[at] = _intern(value)
            elif type(value) is list:
                try:
                    values[at] = list(map(_intern, value))
                except TypeError:  # an item that is not a string: the list as it is
                    continue
        self._fields: dict[str, int] = layout.fields
        self._values: tuple[Any, ...] = tuple(values)

    def __getitem__(self, key: str) -> Any:
        return self._values[self._fields[key]]

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key``, or ``default`` when the config has no such field."""
        at = self._fields.get(key)
        return default if at is None else self._values[at]

    def __contains__(self, key: object) -> bool:
        return key in self._fields

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"FrozenConfig({self.copy()!r})"

    def fields(self, names: Iterable[str]) -> dict[str, Any]:
        """The fields of ``names`` the config has, in that order (a plain dict)."""
        at, values = self._fields, self._values
        return {name: values[at[name]] for name in names if name in at}

    def copy(self) -> dict[str, Any]:
        """A plain dict of the fields (a copy the caller may change)."""
        return dict(zip(self._fields, self._values, strict=True))

    def __or__(self, other: Mapping[str, Any]) -> dict[str, Any]:
        return {**self.copy(), **other}


_intern = sys.intern


class Layout(NamedTuple):
    """What the `FrozenConfig` of one sequence of field names shares with the others."""

    fields: dict[str, int]
    """Each field name (interned) -> its position in the values."""
    texts: tuple[int, ...]
    """The positions whose value is a string or a list in the first config of the layout:
    where the others' strings are interned (a value of another type there is kept as it
    is; a string elsewhere is kept uninterned: memory, never the value, differs)."""


def _layout(names: tuple[str, ...], values: list[Any]) -> Layout:
    return Layout({_intern(name) if type(name) is str else name: at
                   for at, name in enumerate(names)},
                  tuple(at for at, value in enumerate(values) if type(value) in (str, list)))


_LAYOUTS: Bounded[tuple[str, ...], Layout] = Bounded(
    256, "the field names of configs, in order, with their positions: what the compact "
    "configs of one layout share (a fleet's configs have a few layouts)")


_NO_STRINGS: Mapping[str, Any] = types.MappingProxyType({})


def read_config(folder: str | os.PathLike[str]) -> tuple[dict[str, Any], int]:
    """``adapter_config.json`` of an adapter folder as a dict, and its size in bytes.

    Read as strictly as `inspect_adapter` reads it (no symlink out of the folder, a size cap,
    no duplicate keys or NaN), but not checked for LoRA's fields, so a caller can look at
    ``peft_type`` first. Raises `Malformed` when it cannot be read.
    """
    raw = _config_bytes(folder if isinstance(folder, pathlib.Path) else pathlib.Path(folder))
    return parse_config(raw), len(raw)


def parse_config(raw: bytes) -> dict[str, Any]:
    """``adapter_config.json``'s bytes as a dict, as strictly as `read_config` reads a file
    (the size cap, no duplicate keys or NaN); raises `Malformed`. Remote reads use it too."""
    if len(raw) > MAX_CONFIG_BYTES:
        raise Malformed(CONFIG_NAME, f"larger than {MAX_CONFIG_BYTES} bytes")
    return parse_json_config(raw, CONFIG_NAME)


MAX_CONFIG_VALUES = 200_000
"""Most JSON values a config may hold (an upper bound counted before parsing): a real one has
a few hundred, a big ``rank_pattern`` a few thousand. Bounds the parse to about 20 MB."""


def parse_json_config(raw: bytes, file: str) -> dict[str, Any]:
    """A JSON object from ``raw`` (a config file's bytes), bounded and strict: no duplicate
    keys, no NaN, at most `MAX_CONFIG_VALUES` values, every failure a `Malformed`."""
    colons = raw.count(b":")
    values = json_value_bound(raw, colons) if len(raw) >= MAX_CONFIG_VALUES else 0
    if values > MAX_CONFIG_VALUES:  # (a shorter text holds fewer values than bytes)
        raise Malformed(file, f"holds up to {values:,} JSON values, more than the "
                        f"{MAX_CONFIG_VALUES:,} a config may (memory bound)")
    try:
        config = strict_json(raw.decode("utf-8"), colons)
    except DuplicateKey as exc:
        raise Malformed(file, f"duplicate key {exc.key!r}") from None
    except NonFinite as exc:  # NaN/Infinity: not JSON; a NaN alpha is NaN output
        raise Malformed(file, f"non-standard JSON constant {exc.name}; every number must be "
                        "finite") from None
    except UnicodeDecodeError:
        raise Malformed(file, "not UTF-8 text") from None
    except RecursionError:
        raise Malformed(file, "JSON nested too deeply") from None
    except ValueError as exc:  # also an integer past Python's digit limit
        raise Malformed(file, f"invalid JSON ({str(exc)[:200]})") from None
    if not isinstance(config, dict):
        raise Malformed(file, f"not a JSON object but a {type(config).__name__}")
    return config


def _read_config(
    folder: pathlib.Path, defaults: Mapping[str, Any] | None = None, dir_fd: int | None = None
) -> tuple[FrozenConfig, bytes | None, int]:
    """The folder's checked config, its bytes (None when ``defaults`` filled fields in: the
    config is then not the bytes' alone) and its size."""
    raw = _config_bytes(folder, dir_fd)
    if defaults:
        return FrozenConfig(checked_config(parse_config(raw), defaults)), None, len(raw)
    return _CONFIGS.get_or_make(
        raw, lambda: FrozenConfig(checked_config(parse_config(raw)))), raw, len(raw)


_CONFIGS: Bounded[bytes, FrozenConfig] = Bounded(
    256, "checked configs by their bytes: the adapters of a fleet share a few configs")


def checked_config(config: dict[str, Any],
                   defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A parsed config with the loader's defaults filled in, checked for LoRA's fields
    (`NotLoRA` for another PEFT method)."""
    if other_method(config.get("peft_type")):  # LoRA's spellings: the engine's rule (LG117)
        raise NotLoRA(config["peft_type"])
    if defaults:
        config = {**defaults, **config}
    _validate_config(config)
    return config


_MAX_PATTERN_KEY = 512


_MAX_PATTERN_REPEATS = 2


_MAX_PATTERN_KEYS = 10_000


MATCH_BUDGET = 2_000_000_000
"""Worst-case backtracking steps all ``rank_pattern``/``alpha_pattern`` keys of one adapter
may cost against its module names (a key with ``k`` unbounded repeats costs about
``len(name) ** (k + 1)`` per name under PEFT's ``(.*\\.)?(key)$`` wrapper); about two
seconds of matching. Over it, the adapter is LG108 before anything is matched."""


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def _repeats(parsed: Any, inside_repeat: bool = False) -> tuple[int, bool]:
    """(unbounded repeats, whether one is nested in another) of a parsed regex."""
    count, nested = 0, False
    for op, arg in parsed:
        children: list[Any] = []
        repeat = str(op) in ("MAX_REPEAT", "MIN_REPEAT") and arg[1] > 1
        if repeat:
            count += 1
            nested = nested or inside_repeat
            children = [arg[2]]
        elif str(op) == "SUBPATTERN":
            children = [arg[-1]]
        elif str(op) == "BRANCH":
            children = list(arg[1])
            nested = nested or inside_repeat  # (a|aa)*: ambiguous alternatives, repeated
        elif str(op) in ("ASSERT", "ASSERT_NOT"):
            children = [arg[1]]
        for child in children:
            more, deeper = _repeats(child, inside_repeat or repeat)
            count, nested = count + more, nested or deeper
    return count, nested


def _regex_problem(key: object, max_repeats: int = _MAX_PATTERN_REPEATS) -> str | None:
    """Why a rank_pattern/alpha_pattern key must not be matched, or None.

    PEFT matches each key with ``re.match(rf"(.*\\.)?({key})$", module)``; Python's re
    backtracks without limit and holds the GIL, so a key with nested repetition such as
    ``(.*)*x`` would hang the checker (and the server). Keys are module names or suffixes in
    practice: a few ``.*`` at most.
    """
    if not isinstance(key, str):
        return "is not a string"
    if len(key) > _MAX_PATTERN_KEY:
        return f"is longer than {_MAX_PATTERN_KEY} characters"
    try:
        re.compile(key)
        count, nested = _repeats(_regex_parser().parse(key))
    except re.error as exc:
        return f"is not a regex ({exc})"
    if nested:
        return ("nests one repetition in another, which can take exponential time to match; "
                "use a module name or suffix such as 'q_proj' or 'layers\\.0\\..*'")
    _REPEATS.put(key, count)
    if count > max_repeats:
        return (f"repeats {count} times (at most {max_repeats}), which can take "
                "polynomial time of high degree to match; use a module name or suffix")
    return None


_REPEATS: Bounded[str, int] = Bounded(
    50_000, "unbounded repeats of each rank_pattern/alpha_pattern key accepted (the ReDoS "
    "bound's count; a key not remembered is counted at the most allowed)")


def _pattern_cost(config: Mapping[str, Any], modules: Iterable[str]) -> int:
    """Worst-case matching steps of the config's pattern keys against ``modules``."""
    keys = [k for name in ("rank_pattern", "alpha_pattern")
            for k in (config.get(name) or {})]
    if not keys:
        return 0
    lengths = [len(m) + 64 for m in modules]  # the name PEFT matches can be a little longer
    total = 0
    for key in keys:
        count = _REPEATS.get(key)
        reps = (_MAX_PATTERN_REPEATS if count is None else count) + 1  # the wrapper's (.*\.)?
        total += sum(n ** reps for n in lengths)
        if total > MATCH_BUDGET:
            break
    return total


_PLAIN = re.compile(r"[\w.-]+")  # a key with no regex syntax but '.' (any character)


_Matcher = tuple[str, "re.Pattern[str] | None", str, int]


def _prepared(keys: tuple[str, ...]) -> list[_Matcher]:
    """Each key's matcher: for a plain key (the usual module name or suffix) the literal end
    it must have and its length, so most names are rejected by one ``endswith``; otherwise
    PEFT's regex, compiled once."""
    return _PREPARED.get_or_make(keys, lambda: [_matcher(key) for key in keys])


def _matcher(key: str) -> _Matcher:
    try:
        if _PLAIN.fullmatch(key):
            return key, re.compile(key), key.rsplit(".", 1)[-1], len(key)
        return key, re.compile(rf"(.*\.)?({key})$"), "", -1
    except re.error:
        return key, None, "", -1


_PREPARED: Bounded[tuple[str, ...], list[_Matcher]] = Bounded(
    256, "matchers of a config's rank_pattern/alpha_pattern keys (one per pattern of a fleet)")


def _regex_parser() -> Any:
    try:
        return importlib.import_module("re._parser")  # Python >= 3.11
    except ImportError:  # pragma: no cover - Python 3.10
        return importlib.import_module("sre_parse")


def _validate_config(config: Mapping[str, Any]) -> None:
    _required_fields(config)
    for name in ("rank_pattern", "alpha_pattern"):
        _pattern_field(config, name)
    _list_fields(config)


def _bad(config: Mapping[str, Any], field_: str, want: str) -> Malformed:
    return Malformed(CONFIG_NAME, f"field {field_!r} is {config[field_]!r}, {want}")


def _required_fields(config: Mapping[str, Any]) -> None:
    """``r``, ``lora_alpha`` and ``target_modules`` (or ``target_parameters``), well typed."""
    for required in ("r", "lora_alpha"):
        if required not in config:
            raise Malformed(CONFIG_NAME, f"no {required!r} field (PEFT writes it; vLLM "
                            "requires r, lora_alpha and target_modules)")
    if "target_modules" not in config and not config.get("target_parameters"):
        raise Malformed(CONFIG_NAME, "no 'target_modules' field")
    r = config["r"]
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise _bad(config, "r", "not a positive integer")
    alpha = config["lora_alpha"]
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise _bad(config, "lora_alpha", "not a finite number")


def _pattern_field(config: Mapping[str, Any], name: str) -> None:
    """``rank_pattern`` / ``alpha_pattern``: module regex -> a number, each regex safe."""
    pattern = config.get(name)
    if pattern is None:
        return
    if not isinstance(pattern, dict):
        raise _bad(config, name, "not an object of module-regex -> value")
    if len(pattern) > _MAX_PATTERN_KEYS:
        raise Malformed(CONFIG_NAME, f"{name} has {len(pattern):,} keys (at most "
                        f"{_MAX_PATTERN_KEYS:,}); name fewer modules or use a suffix")
    for key, value in pattern.items():
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (
            math.isfinite(value))
        if name == "rank_pattern":
            ok = ok and isinstance(value, int) and value >= 1
        if not ok:
            want = "positive integer" if name == "rank_pattern" else "finite number"
            raise Malformed(CONFIG_NAME, f"{name}[{key!r}] is {value!r}, not a {want}")
        problem = _regex_problem(key)
        if problem:
            raise Malformed(CONFIG_NAME, f"{name} key {_clip(key)!r} {problem}")


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(t, str) for t in value)


def _list_fields(config: Mapping[str, Any]) -> None:
    """``target_modules``, ``exclude_modules`` (a regex, each safe to match),
    ``target_parameters``, ``bias`` and ``modules_to_save``."""
    targets = config.get("target_modules")
    if targets is not None and not isinstance(targets, str) and not _strings(targets):
        raise _bad(config, "target_modules", "not a list of module names or a regex string")
    for name in ("target_modules", "exclude_modules"):
        regex = config.get(name)
        if isinstance(regex, str):  # PEFT: re.fullmatch(regex, every module name)
            problem = _regex_problem(regex, _MAX_PATTERN_REPEATS + 1)
            if problem:
                raise Malformed(CONFIG_NAME, f"{name} regex {_clip(regex)!r} {problem}")
    parameters = config.get("target_parameters")
    if parameters is not None and not _strings(parameters):
        raise _bad(config, "target_parameters", "not a list of parameter names")
    if "bias" in config and config["bias"] not in ("none", "all", "lora_only"):
        raise _bad(config, "bias", "not one of 'none', 'all', 'lora_only'")
    saved = config.get("modules_to_save")
    if saved is not None and not _strings(saved):
        raise _bad(config, "modules_to_save", "not a list of module names")


def pattern_value(pattern: Mapping[str, Any], module: str) -> Any:
    """PEFT's first-match rule: the value of the first key with
    ``re.match(rf"(.*\\.)?({key})$", module)``, or None.

    Example:
        >>> from lora_guard._reading.adapters import pattern_value
        >>> pattern_value({"k_proj": 4, "layers.1.self_attn.q_proj": 16},
        ...               "model.layers.1.self_attn.q_proj")
        16
    """
    if not pattern:
        return None
    keys = tuple(k for k in pattern if isinstance(k, str))
    for key, regex, end, size in _prepared(keys):
        if regex is None:
            continue
        if size >= 0:  # plain: the last ``size`` characters, after a '.' or the start
            if not module.endswith(end) or len(module) < size or (
                    len(module) > size and module[-size - 1] != "."):
                continue
            if regex.fullmatch(module, len(module) - size):
                return pattern[key]
        elif regex.match(module):
            return pattern[key]
    return None


_FEATURE_FIELDS = ("use_dora", "lora_bias", "modules_to_save", "alora_invocation_tokens",
                   "layer_replication", "use_qalora", "use_bdlora", "trainable_token_indices",
                   "bias")
"""The config fields `_features` reads."""


def _features(frozen: FrozenConfig, extra: Mapping[str, str],
              added_tokens: Mapping[str, int] | None = None) -> dict[str, Any]:
    config = frozen.fields(_FEATURE_FIELDS)  # (a plain dict: read a dozen times below)
    found: dict[str, Any] = {}
    kinds = set(extra.values())
    if config.get("use_dora") or "dora" in kinds:
        found["dora"] = config.get("use_dora", "magnitude vectors in the weights")
    if config.get("lora_bias") or "lora_bias" in kinds:
        found["lora_bias"] = config.get("lora_bias", "lora_B.bias in the weights")
    if config.get("bias", "none") != "none" or "bias" in kinds:
        found["bias"] = config.get("bias")
    if config.get("modules_to_save") or "modules_to_save" in kinds:
        found["modules_to_save"] = config.get("modules_to_save")
    if config.get("trainable_token_indices") is not None or "trainable_tokens" in kinds:
        found["trainable_tokens"] = config.get("trainable_token_indices")
    for name in ("alora", "layer_replication", "qalora", "bdlora"):
        value = config.get(FEATURES[name])
        if value:
            found[name] = value
    if added_tokens:
        found["added_tokens"] = types.MappingProxyType(added_tokens)
    return found


def added_tokens_of(raw: bytes) -> dict[str, int]:
    """The token -> id map of ``added_tokens.json``'s bytes (local or remote), checked."""
    if len(raw) > MAX_CONFIG_BYTES:  # it grew since fstat, or a store sent more
        raise Malformed(ADDED_TOKENS_NAME, f"larger than {MAX_CONFIG_BYTES} bytes")
    tokens = parse_json_config(raw, ADDED_TOKENS_NAME)
    for token, token_id in tokens.items():
        if not isinstance(token_id, int) or isinstance(token_id, bool) or token_id < 0:
            raise Malformed(ADDED_TOKENS_NAME, f"token {_clip(token)!r} has id {token_id!r}, "
                            "not a non-negative integer")
    return tokens


def _read_only(found: dict[str, Any]) -> Mapping[str, Any]:
    if not found:
        return _NO_STRINGS
    return FrozenConfig(found) if len(found) <= 8 else types.MappingProxyType(found)
