"""`pytest --lora-guard` at scale and across tests (hostile round 3, issue 27): a suite of the
user's, run by pytester, that swallows 10,000 violations in one test, catches 10,000 with
pytest.raises in another, and leaves state behind for the next test (an open capture in a
thread of its own, the guards switched off).

The suites need no torch (slot maps, `Meta` stand-ins); each runs in seconds.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import lora_guard as lg
from lora_guard._core.config import add_sink, remove_sink
from lora_guard._frontends import _plugin_state
from lora_guard._frontends.plugin import _MAX_KEPT, _MAX_LISTED, LoRAGuardPlugin, _TestState

pytestmark = pytest.mark.lora_guard(allow=tuple(lg.INVARIANTS))

SWALLOWED = 10_000

SERVER = '''
import lora_guard as lg


def swallow_lg201():
    try:
        lg.assert_slot_maps_consistent({"a": 0}, ["b"])   # two LG201
    except RuntimeError:
        pass
'''

# Writes what each report carries: how many violation dicts, and the counts.
REPORTS = '''
import json

def pytest_runtest_logreport(report):
    found = getattr(report, "lora_guard_violations", None)
    if found:
        with open("reports.jsonl", "a") as out:
            out.write(json.dumps({"when": report.when, "kept": len(found),
                                  "counts": report.lora_guard_counts}) + "\\n")
'''


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(server=SERVER)
    pytester.makeconftest(REPORTS)
    pytester.syspathinsert()
    return pytester


def test_ten_thousand_swallowed_violations_give_a_bounded_report(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_loop=f"""
        from server import swallow_lg201

        def test_a_loader_that_swallows_in_a_loop():
            for _ in range({SWALLOWED // 2}):
                swallow_lg201()
    """)
    result = suite.runpytest("--lora-guard")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    result.stdout.fnmatch_lines([
        f"*lora_guard: LG201 registry-inconsistent during call: {SWALLOWED} violations*",
        f"... and {SWALLOWED - _MAX_LISTED:,} more (LG201 x {SWALLOWED - _MAX_LISTED:,}), "
        "not listed",
        f"LG201  registry-inconsistent  *{SWALLOWED}  *{SWALLOWED}  *0  *0  *1  *1",
    ])
    assert out.count("LG201 registry-inconsistent: ") <= 2 * _MAX_LISTED  # failure + short
    assert len(out) < 40_000  # the whole session's output, for 10,000 violations
    reports = [json.loads(line) for line in
               (suite.path / "reports.jsonl").read_text().splitlines()]
    assert reports == [{"when": "call", "kept": _MAX_KEPT,
                        "counts": {"LG201": {"failed": SWALLOWED}}}]


def test_ten_thousand_catches_with_pytest_raises_in_one_test(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_catch=f"""
        import pytest
        import lora_guard as lg

        def test_every_broken_map_is_refused():
            for i in range({SWALLOWED // 2}):
                with pytest.raises(lg.RegistryError):
                    lg.assert_slot_maps_consistent({{"a": i}}, ["b"])
    """)
    result = suite.runpytest("--lora-guard")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"LG201  registry-inconsistent  *{SWALLOWED}  *0  *{SWALLOWED}*"])


class CountingList(list[Any]):
    """A list that counts the items its iterations visit."""

    visited = 0

    def __iter__(self) -> Any:
        for item in super().__iter__():
            CountingList.visited += 1
            yield item


def test_each_catch_costs_the_same_however_many_came_before() -> None:
    """pytest.raises -> the plugin's mark_caught: the work per catch does not grow with the
    violations the test observed before (it was a scan of all of them: quadratic)."""
    plugin = LoRAGuardPlugin(None, enabled=True, integrations=[])  # type: ignore[arg-type]
    state = _TestState(when="call")
    state.observed = CountingList()
    token = plugin.current.set(state)
    _plugin_state.SESSIONS.append(plugin)  # the innermost session: it observes
    add_sink(plugin.sink)
    try:
        for i in range(2_000):
            with pytest.raises(lg.RegistryError):
                lg.assert_slot_maps_consistent({"a": i}, ["b"])
    finally:
        remove_sink(plugin.sink)
        _plugin_state.SESSIONS.remove(plugin)
        plugin.current.reset(token)
    assert len(state.observed) == 4_000
    assert all(state.status(o) == "caught" for o in list.__iter__(state.observed))
    assert CountingList.visited == 0  # no catch scanned what the test had observed


def test_a_capture_left_open_in_a_thread_handles_nothing_of_the_next_test(
        suite: pytest.Pytester) -> None:
    suite.makepyfile(test_leak="""
        import threading
        from lora_guard.testing import capture_violations
        from server import swallow_lg201

        release = threading.Event()

        def test_one_opens_a_capture_in_a_thread_and_leaves_it_open():
            opened = threading.Event()

            def hold():
                with capture_violations():
                    opened.set()
                    release.wait(60)

            threading.Thread(target=hold, daemon=True).start()
            assert opened.wait(60)

        def test_two_swallows_a_violation():
            try:
                swallow_lg201()
            finally:
                release.set()
    """)
    result = suite.runpytest("--lora-guard", "-p", "no:randomly", "-rf")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["FAILED test_leak.py::test_two_swallows_a_violation*"])


def test_a_mode_switched_off_by_one_test_does_not_reach_the_next(
        suite: pytest.Pytester) -> None:
    suite.makepyfile(test_mode="""
        import lora_guard as lg
        from server import swallow_lg201

        def test_one_switches_the_guards_off():
            lg.configure(mode="off")

        def test_two_swallows_a_violation():
            swallow_lg201()

        def test_three_is_told_the_mode():
            assert lg.get_mode() == "raise"
    """)
    result = suite.runpytest("--lora-guard", "-p", "no:randomly", "-rf")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        ["FAILED test_mode.py::test_two_swallows_a_violation - Failed: lora_guard: LG*"])
