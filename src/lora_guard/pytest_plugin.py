"""The module registered under ``pytest11``: options, markers and fixtures only.

It imports nothing heavy: with the plugin installed but neither ``--lora-guard`` nor
``--lora-guard-instrument`` given, a pytest run imports no torch, and no part of lora_guard
beyond what ``import lora_guard`` itself loads. The work lives in ``_plugin``; the fixtures
import what they need when a test asks for them, so they work with or without the flag.

Example:
    >>> from lora_guard import pytest_plugin
    >>> sorted(n for n in vars(pytest_plugin) if n in ("lora_violations", "make_adapter"))
    ['lora_violations', 'make_adapter']
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from ._core.config import Recording
    from .testing import AdapterFactory

__all__ = ["lora_violations", "make_adapter"]


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    # Markers are checked whenever the plugin is installed, with or without --lora-guard, as
    # --strict-markers checks names: a misspelled code is a collection error of the module
    # (or class) holding the test, naming the test, the code and the closest code. Not a
    # UsageError: under xdist a worker's UsageError is lost; a collection error reaches the
    # controller and stops the run before any test.
    report = yield
    if not report.passed:
        return report
    problems = []
    for node in report.result:
        if isinstance(node, pytest.Item) and node.get_closest_marker("lora_guard") is not None:
            # Shared with the plugin's work; imported only here, so that a run with no
            # lora_guard marker and no --lora-guard imports no other lora_guard module.
            from ._frontends._plugin_state import MARKS_KEY, marker_codes

            try:
                node.stash[MARKS_KEY] = marker_codes(node)
            except (ValueError, TypeError) as exc:
                problems.append(f"{node.nodeid}: {exc}")
    if problems:
        report.outcome = "failed"
        report.longrepr = (
            "lora_guard: @pytest.mark.lora_guard cannot be honoured:\n  "
            + "\n  ".join(problems)
        )
    return report


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
    parser.addini("lora_guard_instrument",
                  "libraries to instrument for the session (as --lora-guard-instrument)",
                  type="string", default="")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "lora_guard(allow=(), expect=(), reason=''): codes this test allows, and codes it "
        "expects to occur (checked at collection)",
    )
    enabled = config.getoption("--lora-guard")
    if enabled is None:
        enabled = config.getini("lora_guard")
    instrument = config.getoption("--lora-guard-instrument") or config.getini(
        "lora_guard_instrument")
    if enabled or instrument:
        from ._frontends import plugin as _plugin

        _plugin.install(config, enabled=bool(enabled))


@pytest.fixture
def lora_violations(request: pytest.FixtureRequest) -> Iterator[Recording]:
    """This test's lora_guard violations so far, live: a `lora_guard.Recording`.

    Under ``--lora-guard`` it holds every violation of the test since its setup began
    (swallowed ones included); without the flag it records from the moment the fixture is
    set up. Either way, reading it does not stop the plugin from failing the test: declare
    the codes with ``@pytest.mark.lora_guard(expect=...)`` or use
    `lora_guard.testing.assert_violations`.

    Example:
        >>> from lora_guard import recording
        >>> with recording() as lora_violations:   # what the fixture gives a test
        ...     pass
        >>> lora_violations.codes
        []
    """
    plugin = request.config.pluginmanager.get_plugin("lora_guard_session")
    live = None if plugin is None else plugin.recording_for(request.node)
    if live is not None:
        yield live
        return
    from ._core.config import recording

    with recording() as rec:
        yield rec


@pytest.fixture
def make_adapter(tmp_path: Path) -> AdapterFactory:
    """A factory writing real PEFT-format adapter folders under the test's ``tmp_path``.

    ``make_adapter(name=None, **options) -> Path`` takes ``lora_guard.testing.write_adapter``'s
    options (``rank``, ``targets``, ``layers``, ``dtype``, ``moe_layout``, ``defects`` from
    ``lora_guard.testing.DEFECTS`` ...). It works with or without ``--lora-guard``.

    Example:
        >>> import tempfile
        >>> from lora_guard.testing import AdapterFactory
        >>> make_adapter = AdapterFactory(tempfile.mkdtemp())   # what the fixture gives a test
        >>> make_adapter(name="r16", rank=16).name
        'r16'
    """
    from .testing import AdapterFactory

    return AdapterFactory(tmp_path)
