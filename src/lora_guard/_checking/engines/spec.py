"""The types of an engine profile: `Flag`, `Rule`, `Engine` (every release), `EngineProfile`
(one release) and `ServeSpec` (how the engine's serve command is recognised), with the release
arithmetic they share. Pure data: nothing here knows a particular engine."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lora_guard._core.catalogue import INVARIANTS

__all__ = ["Engine", "EngineOptionError", "EngineProfile", "Flag", "ReleaseWarning", "Rule",
           "ServeSpec", "in_range", "version_key"]


class EngineOptionError(ValueError):
    """An engine name, release or LoRA flag that cannot be used (a usage error)."""


class ReleaseWarning(UserWarning):
    """The installed engine release is outside the supported range: the nearest supported
    release's profile is used."""


def version_key(version: str) -> tuple[int, ...]:
    """``"0.31.0"`` -> (0, 31, 0); a piece that is not a number ends the key (``0.34.0rc1``,
    ``0.5.20.post1`` compare as their release)."""
    key: list[int] = []
    for piece in version.split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        key.append(int(digits.group()))
        if digits.group() != piece:
            break
    return tuple(key)


@dataclass(frozen=True)
class Flag:
    """One LoRA flag of an engine's serve command, as its argument parser defines it."""

    name: str
    """The flag, e.g. ``--max-lora-rank``."""
    dest: str
    """The option's name in Python, e.g. ``max_lora_rank``."""
    kind: str
    """``int``, ``bool``, ``choice`` (one of `choices`), ``list`` or ``adapters``."""
    default: Any
    """The engine's default for that release."""
    help: str
    """What it means for the check."""
    choices: tuple[Any, ...] = ()
    """For ``choice`` (and ``list``): the values the engine's parser accepts."""
    since: str | None = None
    """The first release that has the flag (None: every supported release)."""
    until: str | None = None
    """The first release without it (None: still there)."""

    def applies(self, version: str) -> bool:
        """Whether release ``version`` has this flag."""
        return in_range(version, self.since, self.until)


@dataclass(frozen=True)
class Rule:
    """One rule of an engine, with the releases it holds for and its source in them."""

    code: str
    """The code lora_guard reports for it."""
    text: str
    """The rule, one sentence."""
    source: str
    """``file:function`` of the release's source it is read from."""
    engine_refuses: bool = True
    """False where the engine loads the adapter without a word and serves it wrongly (the
    profile refuses what the engine does not)."""
    since: str | None = None
    """The first release with this behaviour (None: every supported release)."""
    until: str | None = None
    """The first release without it (None: still there)."""
    uses: tuple[str, ...] = ()
    """The checker's engine rules (`ServingLimits.engine_rules`) this behaviour turns on."""
    checked: bool = True
    """False for a behaviour the check does not model yet (documented, never silent)."""

    def __post_init__(self) -> None:
        if self.code not in INVARIANTS:  # a code of the catalogue, checked as profiles load
            raise ValueError(f"Rule({self.code!r}, {self.text!r}): not a lora_guard code; "
                             "its entry goes in lora_guard/_core/catalogue/")

    def applies(self, version: str) -> bool:
        """Whether release ``version`` behaves so."""
        return in_range(version, self.since, self.until)

    @property
    def releases(self) -> str:
        """The releases it holds for, for people: ``0.32.0+``, ``< 0.32.0``, ``all``."""
        if self.since and self.until:
            return f"{self.since} to < {self.until}"
        if self.since:
            return f"{self.since}+"
        return f"< {self.until}" if self.until else "all"


def in_range(version: str, since: str | None, until: str | None) -> bool:
    """Whether ``version`` is at or after ``since`` and before ``until`` (None: open)."""
    key = version_key(version)
    return ((since is None or key >= version_key(since))
            and (until is None or key < version_key(until)))


@dataclass(frozen=True)
class ServeSpec:
    """How a pasted serve command of the engine is recognised and read: data, not code, so
    that an engine's recognizer is one entry of its `Engine`.

    Example:
        >>> spec = ServeSpec(programs=(("vllm", "serve"),), modules=("vllm.entrypoints.cli.main",),
        ...                  module_subcommand="serve", model_positional=True,
        ...                  model_flags=("--model",), adapters="lora_modules")
        >>> spec.match(["/usr/bin/vllm", "serve", "m", "--enable-lora"])
        ['m', '--enable-lora']
        >>> spec.match(["python", "-m", "vllm.entrypoints.cli.main", "serve", "m"])
        ['m']
    """

    programs: tuple[tuple[str, ...], ...]
    """Executable (matched by its file name) and the sub-command words after it:
    ``("vllm", "serve")``, ``("lmdeploy", "serve", "api_server")``."""
    modules: tuple[str, ...]
    """Modules run with ``python -m`` that start the server."""
    adapters: str
    """The flag (by its Python name) that lists the adapters served."""
    model_flags: tuple[str, ...] = ("--model",)
    """Flags naming the model, tried in order."""
    model_positional: bool = False
    """The model is the first positional word (``vllm serve MODEL``), before `model_flags`."""
    module_subcommand: str | None = None
    """A sub-command word that may follow the ``-m`` module (``serve``), skipped."""
    needs_without_adapters: tuple[str, ...] = ()
    """Options (Python names) the server needs to start when no adapter is given."""

    def match(self, argv: list[str]) -> list[str] | None:
        """The words after the engine's serve command in ``argv``, or None if it is not one."""
        for i, word in enumerate(argv):
            if word == "-m" and i + 1 < len(argv) and argv[i + 1] in self.modules:
                rest = argv[i + 2:]
                skip = self.module_subcommand is not None and rest[:1] == [self.module_subcommand]
                return rest[1:] if skip else rest
            for program in self.programs:
                end = i + len(program)
                if (os.path.basename(word) == program[0]
                        and argv[i + 1:end] == list(program[1:])):
                    return argv[end:]
        return None


@dataclass(frozen=True)
class EngineProfile:
    """One release of one engine: its LoRA flags and its own rules (those that hold for it)."""

    engine: str
    version: str
    flags: tuple[Flag, ...]
    rules: tuple[Rule, ...]
    build: Callable[[Mapping[str, Any], EngineProfile], dict[str, Any]] = field(
        repr=False, compare=False)
    """Resolved options and the release -> `ServingLimits` keywords."""
    validate: Callable[[Mapping[str, Any]], None] = field(repr=False, compare=False,
                                                        default=lambda options: None)
    """Raises `EngineOptionError` for options the engine itself refuses at start-up."""

    @property
    def label(self) -> str:
        return f"{self.engine}=={self.version}"

    def flag(self, name: str) -> Flag | None:
        name = "--" + name.lstrip("-").replace("_", "-")
        return next((f for f in self.flags if f.name == name), None)

    def uses(self) -> tuple[str, ...]:
        """The checker's engine rules this release's behaviours turn on (in rule order)."""
        return tuple(dict.fromkeys(u for r in self.rules if r.checked for u in r.uses))


@dataclass(frozen=True)
class Engine:
    """One engine: its supported releases, and every flag and rule with the releases it holds
    for. A release's `EngineProfile` is the flags and rules that hold for it (`at`): one rule
    per behaviour, never a copy of a profile per release."""

    name: str
    releases: tuple[str, ...]
    """Supported releases, newest first: exactly those the engine tier can run."""
    flags: tuple[Flag, ...]
    rules: tuple[Rule, ...]
    build: Callable[[Mapping[str, Any], EngineProfile], dict[str, Any]] = field(
        repr=False, compare=False)
    validate: Callable[[Mapping[str, Any]], None] = field(repr=False, compare=False,
                                                        default=lambda options: None)
    """Raises `EngineOptionError` for options the engine itself refuses at start-up."""
    serve: ServeSpec | None = None
    """How its serve command is recognised (None: it has none, e.g. PEFT)."""

    def at(self, version: str) -> EngineProfile:
        """The profile of one supported release."""
        return EngineProfile(self.name, version,
                             tuple(f for f in self.flags if f.applies(version)),
                             tuple(r for r in self.rules if r.applies(version)),
                             self.build, self.validate)

    @property
    def supported_range(self) -> str:
        """``0.29.0 to 0.34.0``."""
        return f"{self.releases[-1]} to {self.releases[0]}"

