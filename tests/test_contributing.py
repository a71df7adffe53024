"""CONTRIBUTING.md's worked examples (an invariant, an engine profile, an integration) run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import lora_guard as lg
from lora_guard._checking.engines import ENGINES, SPECS
from lora_guard._checking.registry import remove_invariant
from test_docs import ROOT, run_page


@pytest.fixture
def undo_registrations() -> Iterator[None]:
    engines, specs = dict(ENGINES), dict(SPECS)
    codes = set(lg.INVARIANTS)
    try:
        yield
    finally:
        for code in set(lg.INVARIANTS) - codes:
            remove_invariant(code)
        for name in set(ENGINES) - set(engines):
            del ENGINES[name]
        for name in set(SPECS) - set(specs):
            del SPECS[name]


@pytest.mark.usefixtures("undo_registrations")
@pytest.mark.lora_guard(expect=("LG101",), reason="the integration example refuses a load")
def test_the_worked_examples_in_contributing_run() -> None:
    run_page(ROOT / "CONTRIBUTING.md")
    assert "LG150" in lg.INVARIANTS  # registered by the example, removed by the fixture
