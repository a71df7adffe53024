"""The engines lora_guard knows: one registration line per engine module."""

from __future__ import annotations

from lora_guard._checking.engines import lmdeploy, peft, sglang, vllm
from lora_guard._checking.engines.spec import Engine, EngineProfile

__all__ = ["ENGINES", "SPECS", "register"]

SPECS: dict[str, Engine] = {}
"""Engine -> its flags and rules, each with the releases it holds for."""

ENGINES: dict[str, tuple[EngineProfile, ...]] = {}
"""Engine -> the profile of each supported release, newest first (views of `SPECS`)."""


def register(engine: Engine) -> None:
    """Make ``engine`` known to ``--engine``, ``ServingLimits.for_engine``, pasted serve
    commands (its `ServeSpec`) and the integrations."""
    SPECS[engine.name] = engine
    ENGINES[engine.name] = tuple(engine.at(v) for v in engine.releases)


for _module in (vllm, sglang, lmdeploy, peft):  # an engine: its module, and its name on this line
    register(_module.ENGINE)
