"""``[tool.lora-guard]`` in ``pyproject.toml`` (or another ``.toml``): each long option of
``lora-guard check`` is a key, whose value becomes the option's default (flags given still win).

The keys are the options the parser recorded when it added them (`ConfigKeys`), not read back
from argparse's internals; an option whose metavar is ``FILE`` or ``DIR`` is resolved relative
to the config file.
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import sys
from collections.abc import Mapping
from typing import Any

from lora_guard._frontends._usage import UsageError

__all__ = ["CONFIG_SECTION", "ConfigKeys", "apply_config", "find_config", "load_config"]

CONFIG_SECTION = "tool.lora-guard"
_NOT_CONFIG = {"config", "isolated", "help"}  # options that make no sense in a config file


class ConfigKeys:
    """The long options of one subcommand, recorded as they are added: each is a config key.

    ``add(group, "--max-rank", type=int)`` adds the option to ``group`` (a parser or an
    argument group) and records it under ``max-rank``.
    """

    def __init__(self) -> None:
        self.actions: dict[str, argparse.Action] = {}

    def add(self, group: Any, *flags: str, **options: Any) -> argparse.Action:
        action: argparse.Action = group.add_argument(*flags, **options)
        for flag in flags:
            if flag.startswith("--") and flag[2:] not in _NOT_CONFIG:
                self.actions[flag[2:]] = action
        return action


def find_config(start: pathlib.Path) -> pathlib.Path | None:
    """The nearest ``pyproject.toml`` with a ``[tool.lora-guard]`` table, from ``start`` up."""
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            try:
                table = _read_toml(candidate)
            except UsageError:
                with contextlib.suppress(OSError, UnicodeDecodeError):
                    if "[tool.lora-guard]" in candidate.read_text("utf-8"):
                        raise  # ours, and broken
                continue  # another tool's broken file is not ours to refuse
            if isinstance(table.get("tool"), dict) and "lora-guard" in table["tool"]:
                return candidate
    return None


def _read_toml(path: pathlib.Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}") from None


def load_config(path: pathlib.Path) -> dict[str, Any]:
    """The lora-guard table of a config file (``[tool.lora-guard]`` of a pyproject.toml)."""
    data = _read_toml(path)
    if path.name != "pyproject.toml":
        return data
    tool = data.get("tool", {})
    table = tool.get("lora-guard", {}) if isinstance(tool, dict) else {}
    if not isinstance(table, dict):
        raise UsageError(f"{path}: [{CONFIG_SECTION}] must be a table")
    return table


def apply_config(parser: argparse.ArgumentParser, keys: ConfigKeys,
                 table: Mapping[str, Any], source: pathlib.Path) -> None:
    """Make each key of ``table`` the default of its option: flags given still override."""
    actions = keys.actions
    where = f"{source} [{CONFIG_SECTION}]" if source.name == "pyproject.toml" else str(source)
    for key, value in table.items():
        action = actions.get(key)
        if action is None:
            known = ", ".join(sorted(actions))
            raise UsageError(f"{where}: unknown key {key!r}; keys are the long options of "
                             f"lora-guard check: {known}")
        parser.set_defaults(**{action.dest: _config_value(action, key, value, source, where)})


def _config_value(action: argparse.Action, key: str, value: Any, source: pathlib.Path,
                  where: str) -> Any:
    if action.nargs == 0:  # a flag
        if not isinstance(value, bool):
            raise UsageError(f"{where}: {key} takes true or false, not {value!r}")
        return value if action.const is True or action.const is None else not value
    if isinstance(value, list):
        if not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value):
            raise UsageError(f"{where}: {key} takes a list of names or numbers, not {value!r}")
        text = ",".join(str(v) for v in value)
    elif isinstance(value, (str, int)) and not isinstance(value, bool):
        text = str(value)
    else:
        raise UsageError(f"{where}: {key} takes a string, a number or a list, not {value!r}")
    if action.metavar in ("FILE", "DIR") and "://" not in text:
        text = str(source.parent / pathlib.Path(text).expanduser())
    if action.choices is not None and text not in action.choices:
        raise UsageError(f"{where}: {key} = {value!r} is not one of "
                         f"{', '.join(map(str, action.choices))}")
    convert = action.type
    if callable(convert):
        try:
            return convert(text)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise UsageError(f"{where}: {key}: {exc}") from None
    return text
