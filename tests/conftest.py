"""Shared test setup: pytester drives the pytest plugin's own tests; `zoo`, PEFT's adapters."""

import importlib
import pathlib
import pkgutil

import pytest

import lora_guard
from conftest_adapters import peft_zoo

pytest_plugins = ["pytester"]

# pytester's in-process runs (tests/test_plugin.py) drop from sys.modules every module first
# imported inside them; a later test would then import a second copy of, say, the shape guard,
# whose frozen-dims store is not the one `lg.frozen_dims` reads. The layers below the front
# ends are imported once here, so every test shares one copy of them.
for _module in pkgutil.walk_packages(lora_guard.__path__, "lora_guard."):
    if _module.name.split(".")[1] in ("_core", "_reading", "_checking", "_guarding"):
        importlib.import_module(_module.name)


@pytest.fixture(scope="session")
def zoo() -> dict[str, pathlib.Path]:
    """Real PEFT adapters by name (`conftest_adapters.ZOO`), saved once per process."""
    pytest.importorskip("peft")
    return peft_zoo()
