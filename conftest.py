"""Every test and doctest starts in the default mode with no frozen surprises."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import lora_guard as lg


@pytest.fixture(autouse=True)
def _lora_guard_default_mode() -> Iterator[None]:
    lg.configure(mode="raise")
    yield
    lg.configure(mode="raise")


# Docstring examples that show a refusal on purpose: the example catches the error itself
# (``try``/``except``, as a server would) or runs in record mode, so under ``--lora-guard`` they
# say which code they break, as a test would with @pytest.mark.lora_guard(expect=...).
_EXAMPLES_THAT_BREAK_AN_INVARIANT = {
    "lora_guard.LoRAGuardError": "LG201",
    "lora_guard.RegistryError": "LG201",
    "lora_guard.PoolShapeDriftError": "LG001",
    "lora_guard.MixedMoELayoutError": "LG002",
    "lora_guard.CacheKeyCollisionError": "LG003",
    "lora_guard.ShapeContractError": "LG004",
    "lora_guard._core.config.Recording": "LG201",
    "lora_guard._core.config.recording": "LG201",
    "lora_guard._guarding.predicates.is_lora_guard_error": "LG201",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        code = _EXAMPLES_THAT_BREAK_AN_INVARIANT.get(item.name)
        if code is not None and type(item).__name__ == "DoctestItem":
            item.add_marker(pytest.mark.lora_guard(
                expect=[code], reason="the docstring example shows the refusal"))
