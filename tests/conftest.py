"""Shared test setup: pytester drives the pytest plugin's own tests."""

import importlib
import pkgutil

import lora_guard

pytest_plugins = ["pytester"]

# pytester's in-process runs (tests/test_plugin.py) drop from sys.modules every module first
# imported inside them; a later test would then import a second copy of, say, the shape guard,
# whose frozen-dims store is not the one `lg.frozen_dims` reads. The layers below the front
# ends are imported once here, so every test shares one copy of them.
for _module in pkgutil.walk_packages(lora_guard.__path__, "lora_guard."):
    if _module.name.split(".")[1] in ("_core", "_reading", "_checking", "_guarding"):
        importlib.import_module(_module.name)
