"""An engine release's LoRA flags read as its own argument parser reads them, and the
`EngineSettings` they come to: the release, the options and the `ServingLimits` fields (built
into limits by `lora_guard._checking.limits`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lora_guard._checking.engines.releases import profile
from lora_guard._checking.engines.spec import EngineOptionError, EngineProfile, Flag

__all__ = ["EngineSettings", "engine_settings", "parse_flags", "resolve_options"]


@dataclass(frozen=True)
class EngineSettings:
    """What an engine release serves with the options given: the `ServingLimits` fields."""

    release: EngineProfile
    options: Mapping[str, Any]
    """Every LoRA option of the release with its value (the adapters' lists left out)."""
    fields: Mapping[str, Any]
    """`ServingLimits` keywords from the release's ``build`` (``max_rank``, ``engine_rules``...)."""


def _bad(flag: Flag, raw: Any, why: str) -> EngineOptionError:
    return EngineOptionError(f"{flag.name} {raw!r}: {why}")


def _bool_value(flag: Flag, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise _bad(flag, raw, "expected true or false")


def _int_value(flag: Flag, raw: Any) -> int:
    try:
        value = raw if isinstance(raw, int) and not isinstance(raw, bool) else int(str(raw))
    except ValueError:
        raise _bad(flag, raw, "expected an integer") from None
    if value < 1:
        raise _bad(flag, raw, "expected a positive integer")
    if flag.choices and value not in flag.choices:
        raise _bad(flag, raw, f"not one of {', '.join(map(str, flag.choices))}")
    return value


def _choice_value(flag: Flag, raw: Any) -> str:
    if str(raw) not in flag.choices:
        raise _bad(flag, raw, f"not one of {', '.join(map(str, flag.choices))}")
    return str(raw)


def _list_value(flag: Flag, raw: Any) -> list[str]:
    names = [str(i) for i in ([raw] if isinstance(raw, str) else list(raw))]
    if not names:
        raise _bad(flag, raw, "expected one or more names")
    unknown = [n for n in names if flag.choices and n not in flag.choices]
    if unknown:
        raise _bad(flag, raw, f"{unknown[0]!r} is not one of {', '.join(flag.choices)}")
    return names


def _value(flag: Flag, raw: Any) -> Any:
    """``raw`` as the engine's parser reads ``flag``; `EngineOptionError` naming the flag."""
    if flag.kind == "bool":
        return _bool_value(flag, raw)
    if flag.kind == "int" or (flag.kind == "choice" and isinstance(flag.choices[0], int)):
        return _int_value(flag, raw)
    if flag.kind == "choice":
        return _choice_value(flag, raw)
    if flag.kind == "list":
        return _list_value(flag, raw)
    items = [raw] if isinstance(raw, str) else list(raw)
    return [_adapter_item(flag, item) for item in items]


def _adapter_item(flag: Flag, item: Any) -> tuple[str, str]:
    """An adapter of --lora-modules / --lora-paths as (name, path)."""
    if isinstance(item, Mapping):
        data: Mapping[str, Any] = item
    elif isinstance(item, str) and item.lstrip().startswith("{"):
        try:
            data = json.loads(item)
        except json.JSONDecodeError:
            raise EngineOptionError(f"{flag.name}: invalid JSON {item!r}") from None
        if not isinstance(data, Mapping):
            raise EngineOptionError(f"{flag.name}: expected a JSON object, got {item!r}")
    elif isinstance(item, str) and "=" in item and "," not in item:
        name, path = item.split("=", 1)
        return name, path
    elif isinstance(item, str) and flag.dest == "lora_paths":
        return item, item
    elif isinstance(item, str) and flag.dest == "adapters":  # lmdeploy: one PATH alone
        return "default", item
    else:
        raise EngineOptionError(f"{flag.name}: expected NAME=PATH, got {item!r}")
    name = data.get("name", data.get("lora_name"))
    path = data.get("path", data.get("lora_path"))
    if not isinstance(name, str) or not isinstance(path, str):
        keys = "name/path" if flag.dest == "lora_modules" else "lora_name/lora_path"
        raise EngineOptionError(f"{flag.name}: {item!r} needs a name and a path ({keys})")
    return name, path


def _flag_at(release: EngineProfile, word: str) -> tuple[Flag | None, bool]:
    """The LoRA flag ``word`` names (``--flag`` or ``--flag=value``), and whether it is the
    ``--no-`` form of a boolean flag."""
    name = word.partition("=")[0]
    flag = release.flag(name)
    for off, on in (("--no-", "--"), ("--disable-", "--enable-")):  # BooleanOptionalAction
        if flag is None and name.startswith(off):
            negated = release.flag(on + name[len(off):])
            if negated is not None and negated.kind == "bool":
                return negated, True
    return flag, False


def _flag_value(flag: Flag, word: str, words: Sequence[str], i: int) -> tuple[Any, int]:
    """The value of ``flag`` given as ``word`` (words[i:] follow it), and the next index."""
    _, eq, inline = word.partition("=")
    if flag.kind == "bool":
        return (_value(flag, inline) if eq else True), i
    if flag.kind in ("list", "adapters"):
        values = [inline] if eq else []
        while not eq and i < len(words) and not words[i].startswith("--"):
            values.append(words[i])
            i += 1
        if flag.kind == "list" and not values:
            raise EngineOptionError(f"{flag.name} expects one or more values")
        return _value(flag, values), i
    if eq:
        return _value(flag, inline), i
    if i < len(words):
        return _value(flag, words[i]), i + 1
    raise EngineOptionError(f"{flag.name} expects a value")


def parse_flags(release: EngineProfile, argv: Sequence[str]) -> tuple[dict[str, Any],
                                                                       list[str]]:
    """The release's LoRA flags found in argv (others ignored) and the positional words."""
    found: dict[str, Any] = {}
    positional: list[str] = []
    words = [str(w) for w in argv]
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("--") or word == "--":
            positional.append(word)
            continue
        flag, negated = _flag_at(release, word)
        if flag is None:  # not a LoRA flag: skip it and its values
            while i < len(words) and not words[i].startswith("-"):
                i += 1
        elif negated:
            found[flag.dest] = False
        else:
            value, i = _flag_value(flag, word, words, i)
            # --lora-modules / --lora-paths may be given more than once: they add up
            found[flag.dest] = [*found.get(flag.dest, []), *value] \
                if flag.kind == "adapters" else value
    return found, positional


def resolve_options(release: EngineProfile, argv: Sequence[str] = (),
                    options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every LoRA flag of the release with its value: from argv, then keywords, else default."""
    found, _ = parse_flags(release, argv)
    by_dest = {f.dest: f for f in release.flags}
    for key, raw in (options or {}).items():
        flag = by_dest.get(key)
        if flag is None:
            known = ", ".join(by_dest) or "none"
            raise EngineOptionError(
                f"{release.engine} has no LoRA option {key!r}; its options: {known}")
        if raw is not None:
            found[key] = _value(flag, raw)
    resolved = {f.dest: found.get(f.dest, f.default) for f in release.flags}
    release.validate(resolved)
    return resolved


def engine_settings(name: str, *argv: str | Sequence[str], version: str | None = None,
                    **options: Any) -> EngineSettings:
    """The settings of one engine release (`profile`) from its flags: ``argv`` as on its
    command line (strings, or lists of them), ``options`` by their Python names.

    Example:
        >>> settings = engine_settings("vllm==0.31.0", "--max-lora-rank", "64")
        >>> settings.release.label, settings.fields["max_rank"], settings.options["max_loras"]
        ('vllm==0.31.0', 64, 1)
    """
    release = profile(name, version)
    flat: list[str] = []
    for item in argv:
        if isinstance(item, (list, tuple)):
            flat.extend(str(i) for i in item)
        elif isinstance(item, str):
            flat.append(item)
        else:
            raise EngineOptionError(
                f"for_engine takes the engine's flags as strings such as '--max-lora-rank', "
                f"'64', got {item!r}")
    resolved = resolve_options(release, flat, options)
    shown = {k: v for k, v in resolved.items()
             if not any(f.dest == k and f.kind == "adapters" for f in release.flags)}
    return EngineSettings(release, shown, release.build(resolved, release))
