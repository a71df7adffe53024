"""The module registered under ``pytest11``: options and markers only.

It imports nothing heavy: with the plugin installed but ``--lora-guard`` not given, a pytest
run imports neither torch nor the rest of lora_guard. The work lives in ``_plugin``.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("lora-guard", "lora_guard: fail tests that break a LoRA invariant")
    group.addoption(
        "--lora-guard",
        action="store_true",
        default=None,
        help="fail every test in which a lora_guard invariant was violated, even if swallowed",
    )
    group.addoption(
        "--lora-guard-instrument",
        default=None,
        metavar="LIBS",
        help="comma-separated libraries to instrument for the session: peft,sglang,vllm",
    )
    parser.addini("lora_guard", "enable lora_guard's plugin (as --lora-guard)", type="bool",
                  default=False)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "lora_guard(allow=(), expect=()): codes this test allows, and codes it expects to occur",
    )
    enabled = config.getoption("--lora-guard")
    if enabled is None:
        enabled = config.getini("lora_guard")
    if enabled:
        from . import _plugin

        _plugin.install(config)
