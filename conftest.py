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
