"""Engine profiles: what vLLM, sglang and PEFT serve, per release, from their own flags.

A profile is data (the engine's LoRA flags with their names and defaults, as its argument
parser for that release defines them) plus the few rules that are the engine's own. Each rule
cites the release's source file and function. `ServingLimits.for_engine`
(`lora_guard._checking.limits`) builds the limits from a profile's `EngineSettings`; the CLI's
``--engine`` and a pasted serve command go through the same code, so the checker and the
runtime integrations read one profile.

The verdict a profile gives is not "what the engine's loader says": it passes only what the
engine loads *and serves correctly*. Where an engine loads an adapter without a word and then
serves it wrongly, the profile still refuses it; each such rule says ``engine_refuses=False``.

The package: `spec` (the types: `Flag`, `Rule`, `Engine`, `EngineProfile`, `ServeSpec`), one
module per engine (`vllm`, `sglang`, `peft`: its flags, rules and serve command), `registry`
(the engines known: one line per engine), `releases` (which release a check is for),
`options` (flags read as the engine's parser reads them) and `serve` (a pasted serve command).
Adding an engine is one module with its `ENGINE` and its name on `registry`'s line.
"""

from lora_guard._checking.engines.options import EngineSettings, engine_settings, resolve_options
from lora_guard._checking.engines.registry import ENGINES, SPECS, register
from lora_guard._checking.engines.releases import installed_version, nearest_release, profile
from lora_guard._checking.engines.serve import (
    ServeCommand,
    is_serve_command,
    parse_serve_command,
)
from lora_guard._checking.engines.spec import (
    Engine,
    EngineOptionError,
    EngineProfile,
    Flag,
    ReleaseWarning,
    Rule,
    ServeSpec,
    version_key,
)

__all__ = [
    "ENGINES",
    "SPECS",
    "Engine",
    "EngineOptionError",
    "EngineProfile",
    "EngineSettings",
    "Flag",
    "ReleaseWarning",
    "Rule",
    "ServeCommand",
    "ServeSpec",
    "engine_settings",
    "installed_version",
    "is_serve_command",
    "nearest_release",
    "parse_serve_command",
    "profile",
    "register",
    "resolve_options",
    "version_key",
]
