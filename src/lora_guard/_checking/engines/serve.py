"""A pasted serve command (``vllm serve MODEL ...``, ``python -m sglang.launch_server ...``):
which engine it runs, by each registered engine's `ServeSpec`, and what it serves."""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from dataclasses import dataclass

from lora_guard._checking.engines.options import EngineSettings, engine_settings, parse_flags
from lora_guard._checking.engines.registry import SPECS
from lora_guard._checking.engines.releases import profile
from lora_guard._checking.engines.spec import EngineOptionError, ServeSpec

__all__ = ["ServeCommand", "is_serve_command", "parse_serve_command"]


@dataclass(frozen=True)
class ServeCommand:
    """What a pasted serve command says: the engine release and its settings, the adapters,
    the model and the base config the limits are checked against."""

    settings: EngineSettings
    adapters: tuple[tuple[str, str], ...]
    """(name, path) of each adapter the command serves."""
    model: str | None
    """The model the command serves (vLLM's MODEL, sglang's --model-path), as given."""
    base_config: object = None
    """The base config given, else MODEL's config.json when it could be had."""
    skipped: tuple[str, ...] = ()
    """Checks that cannot run, each with why: the base-model check when MODEL's config.json
    could not be had (a Hub model not in the cache while offline, a folder without one)."""


def _engine_of(argv: Sequence[str]) -> tuple[str, ServeSpec, list[str]] | None:
    words = [str(w) for w in argv]
    for name, engine in SPECS.items():
        rest = None if engine.serve is None else engine.serve.match(words)
        if rest is not None and engine.serve is not None:
            return name, engine.serve, rest
    return None


def is_serve_command(argv: Sequence[str]) -> bool:
    """True when argv is the serve command of a registered engine."""
    return _engine_of(argv) is not None


def parse_serve_command(argv: Sequence[str], *, version: str | None = None,
                        base_config: object = None) -> ServeCommand:
    """Engine, settings, adapters and model of ``vllm serve ...`` / ``python -m
    sglang.launch_server ...``; unless ``base_config`` is given, MODEL's config.json is the
    base config: from MODEL's folder, or for a Hub model id through huggingface_hub (the local
    cache first; only the cache with ``HF_HUB_OFFLINE``; never weights). Where it cannot be
    had, ``skipped`` says the base-model check was skipped and why.

    Example:
        >>> import os, tempfile
        >>> from lora_guard._checking.engines import parse_serve_command
        >>> os.environ["HF_HUB_OFFLINE"], os.environ["HF_HUB_CACHE"] = "1", tempfile.mkdtemp()
        >>> cmd = parse_serve_command(["vllm", "serve", "meta-llama/Llama-3.1-8B",
        ...     "--enable-lora", "--lora-modules", "sql=/a/sql", "--max-lora-rank", "64"])
        >>> cmd.settings.release.label, cmd.settings.fields["max_rank"], cmd.adapters
        ('vllm==0.34.0', 64, (('sql', '/a/sql'),))
        >>> print(cmd.skipped[0])  # offline, and not in the (empty) cache  # doctest: +ELLIPSIS
        the base-model check was skipped: config.json of Hub model 'meta-llama/...' is not in
        the local cache (...) and HF_HUB_OFFLINE is set; ...
        >>> del os.environ["HF_HUB_OFFLINE"], os.environ["HF_HUB_CACHE"]
    """
    found = _engine_of(argv)
    if found is None:
        engines = " or ".join(f"{' '.join(s.serve.programs[0])} ..." for s in SPECS.values()
                              if s.serve is not None)
        raise EngineOptionError(
            f"after -- give a serve command ({engines}; or python -m MODULE ...), or give "
            "PATHs and --engine")
    engine, spec, rest = found
    release = profile(engine, version)
    options, positional = parse_flags(release, rest)
    model = positional[0] if spec.model_positional and positional else None
    model = model or next((v for v in map(lambda f: _option(rest, f), spec.model_flags) if v),
                          None)
    adapters = tuple(options.get(spec.adapters) or ())
    skipped: tuple[str, ...] = ()
    if base_config is None and model:
        base_config, skipped = _model_config(model, _option(rest, "--revision"))
    settings = engine_settings(release.label, *rest)
    missing = [n for n in spec.needs_without_adapters if not settings.options.get(n)]
    if not adapters and missing:
        needed = " and ".join("--" + n.replace("_", "-") for n in spec.needs_without_adapters)
        raise EngineOptionError(
            f"{engine} without --{spec.adapters.replace('_', '-')} needs {needed} "
            "(it refuses to start)")
    return ServeCommand(settings=settings, adapters=adapters, model=model,
                        base_config=base_config, skipped=skipped)


def _model_config(model: str, revision: str | None) -> tuple[str | None, tuple[str, ...]]:
    """MODEL's config.json (a local folder's, or a Hub model's), or why the base-model check
    is skipped."""
    from lora_guard._reading.hub_config import hub_base_config, looks_like_hub_id

    folder = pathlib.Path(model)
    if (folder / "config.json").is_file():
        return str(folder / "config.json"), ()
    if looks_like_hub_id(model):
        found = hub_base_config(model, revision=revision)
        return found.path, (() if found.skipped is None else (found.skipped,))
    why = "has no config.json" if folder.is_dir() else "is neither a local folder nor a Hub id"
    return None, (f"the base-model check was skipped: MODEL {model!r} {why}; pass "
                  "--base-config with the base model's config.json",)


def _option(words: Sequence[str], name: str) -> str | None:
    for i, word in enumerate(words):
        if word == name and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None
