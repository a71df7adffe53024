"""`pytest --lora-guard`: a user's suite, run by pytest's own pytester, as its author sees it."""

from __future__ import annotations

import json
import sys
import textwrap
import types

# Imported here, once: pytester's in-process runs drop the modules they import, and
# importing torch (which @lg.shapes loads) a second time in one process crashes it.
import hypothesis  # noqa: F401
import pytest
import torch  # noqa: F401

import lora_guard as lg
from lora_guard._core import config as _config

# These tests run other pytest sessions that break invariants on purpose.
pytestmark = pytest.mark.lora_guard(allow=tuple(lg.INVARIANTS))

# The user's server: a pool whose loader catches every exception, as sglang's does. The
# tensors are shape-only stand-ins; `slots` needs no torch at all (for the subprocess runs).
SERVER = '''
import lora_guard as lg
from slots import Meta


class Pool:
    @lg.shapes(a="slots rank hidden", frozen=("slots", "rank"))
    def set_lora_info(self, a):
        self.a = a


def load(pool, rank):
    try:
        pool.set_lora_info(Meta(2, rank, 8))
        return True
    except Exception:
        return False   # swallowed: the caller only sees success=False


def swallow_lg001():
    pool = Pool()
    assert load(pool, 16)
    assert not load(pool, 8)
'''

SET_LINE = SERVER.strip().splitlines().index("        pool.set_lora_info(Meta(2, rank, 8))") + 1

SLOTS = '''
import lora_guard as lg


class Meta:
    def __init__(self, *shape, dtype="bfloat16"):
        self.shape, self.dtype = shape, dtype


def swallow_lg201():
    try:
        lg.assert_slot_maps_consistent({"a": 0}, ["b"])
    except RuntimeError:
        pass


def swallow_lg003():
    pinned = lg.GuardedCache({})
    pinned["layers.0.q_proj#tp0"] = Meta(16, 64)
    try:
        pinned["layers.0.q_proj#tp0"] = Meta(8, 64)
    except ValueError:
        pass
'''


# Subprocess runs leave out the plugins of this environment that are unrelated and slow to
# start (hypothesis' plugin imports hypothesis, ~1 s per process).
QUIET = ("-p", "no:hypothesispytest", "-p", "no:jaxtyping", "-p", "no:anyio")


# Each point of the plugin's behaviour holds in one process and under pytest-xdist's workers
# (where violations travel to the controller and the summary is printed once).
XDIST = pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["in-process", "xdist"])


def run(suite: pytest.Pytester, xdist: tuple[str, ...], *args: str) -> pytest.RunResult:
    """``pytest ARGS`` in process, or with ``-n 2`` in a subprocess (xdist's workers are
    processes of their own)."""
    if xdist:
        return suite.runpytest_subprocess(*args, *xdist, *QUIET)
    return suite.runpytest(*args)


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(server=SERVER, slots=SLOTS)
    pytester.syspathinsert()
    return pytester


SWALLOWING_TEST = """
    from server import swallow_lg001

    def test_hot_swap_to_a_smaller_rank():
        swallow_lg001()
"""


def test_a_swallowed_lg001_passes_without_the_flag(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_swap=SWALLOWING_TEST)
    result = suite.runpytest()
    result.assert_outcomes(passed=1)
    assert "lora_guard" not in result.stdout.str()


def test_a_swallowed_lg001_fails_the_test_under_the_flag(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_swap=SWALLOWING_TEST)
    result = suite.runpytest("--lora-guard")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*lora_guard: LG001 pool-shape-drift during call*swallowed*",
        "LG001 pool-shape-drift: Pool.set_lora_info: dim 'rank' was frozen at 16 by the first "
        "call and is now 8*",
        f"    fix: {lg.INVARIANTS['LG001'].hint}",
        f"    at:  *server.py:{SET_LINE} in load",
        "FAILED test_swap.py::test_hot_swap_to_a_smaller_rank - Failed: lora_guard: LG*",
    ])


def test_the_ini_option_enables_it_too(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_swap=SWALLOWING_TEST)
    suite.makeini("[pytest]\nlora_guard = true\n")
    suite.runpytest().assert_outcomes(failed=1)


def test_the_header_says_it_is_on(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_swap=SWALLOWING_TEST)
    result = suite.runpytest("--lora-guard")
    result.stdout.fnmatch_lines(["lora_guard: violations fail tests*"])


def test_allow_lets_a_code_pass_and_only_that_code(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_allow="""
        import pytest
        from server import swallow_lg001
        from slots import swallow_lg201

        @pytest.mark.lora_guard(allow=("LG001",))
        def test_allowed():
            swallow_lg001()

        @pytest.mark.lora_guard(allow="LG001")
        def test_another_code_still_fails():
            swallow_lg001()
            swallow_lg201()
    """)
    result = suite.runpytest("--lora-guard", "-rA")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "FAILED test_allow.py::test_another_code_still_fails - Failed: lora_guard*",
    ])
    failure = result.stdout.str().split("test_another_code_still_fails")[1]
    assert "LG201 registry-inconsistent: slot map: adapter 'a' maps to slot 0" in failure
    assert "LG001 pool-shape-drift:" not in failure.split("short test summary")[0]


def test_expect_requires_the_code_and_allows_it(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_expect="""
        import pytest
        from server import swallow_lg001

        @pytest.mark.lora_guard(expect=("LG001",))
        def test_the_guard_catches_the_swap():
            swallow_lg001()

        @pytest.mark.lora_guard(expect=("LG001", "LG003"))
        def test_the_cache_collision_never_happened():
            swallow_lg001()
    """)
    result = suite.runpytest("--lora-guard")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "lora_guard: the test expects LG003 (cache-key-collision) but it was not reported*",
    ])
    assert "expects LG001" not in result.stdout.str()


def test_class_and_module_markers_add_up(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_marks="""
        import pytest
        from server import swallow_lg001
        from slots import swallow_lg201

        pytestmark = pytest.mark.lora_guard(allow=("LG201",))

        @pytest.mark.lora_guard(allow=("LG001",))
        class TestPool:
            def test_both_allowed(self):
                swallow_lg001()
                swallow_lg201()
    """)
    suite.runpytest("--lora-guard").assert_outcomes(passed=1)


@pytest.mark.parametrize(
    ("marker", "expected"),
    [
        ('allow=("LG01",)', "*'LG01' is not a lora_guard code (did you mean 'LG001'?)*"),
        ('expect="LG999"', "*'LG999' is not a lora_guard code; valid codes: LG001, LG002*"),
        ('"LG001"', "*takes keywords only*allow=('LG003',), expect=('LG001',)*"),
        ('allows=("LG001",)', "*unknown keyword(s) [[]'allows'[]]*"),
    ],
)
@pytest.mark.parametrize("flag", [(), ("--lora-guard",)], ids=["without-flag", "with-flag"])
def test_a_bad_marker_is_a_collection_error_that_names_the_valid_codes(
    suite: pytest.Pytester, marker: str, expected: str, flag: tuple[str, ...]
) -> None:
    suite.makepyfile(test_typo=f"""
        import pytest

        def test_fine():
            pass

        @pytest.mark.lora_guard({marker})
        def test_misspelled():
            pass
    """)
    result = suite.runpytest(*flag)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([
        "*ERROR collecting test_typo.py*",
        "lora_guard: @pytest.mark.lora_guard cannot be honoured:",
        "  test_typo.py::test_misspelled: @pytest.mark.lora_guard*",
    ])
    result.stdout.fnmatch_lines([expected])


def test_a_failing_test_keeps_its_failure_and_gains_the_violations(
    suite: pytest.Pytester,
) -> None:
    suite.makepyfile(test_both="""
        from server import swallow_lg001

        def test_broken():
            swallow_lg001()
            assert 1 + 1 == 3, "the test's own failure"
    """)
    result = suite.runpytest("--lora-guard")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*AssertionError: the test's own failure*",
        "*- lora_guard violations (call) -*",
        "LG001 pool-shape-drift: Pool.set_lora_info*",
        "FAILED test_both.py::test_broken - AssertionError: the test's own failure*",
    ])


def test_violations_in_fixtures_fail_setup_and_teardown(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_phases="""
        import pytest
        from server import swallow_lg001
        from slots import swallow_lg201

        @pytest.fixture
        def server_started_badly():
            swallow_lg001()
            yield

        @pytest.fixture
        def server_stopped_badly():
            yield
            swallow_lg201()

        def test_setup(server_started_badly):
            pass

        def test_teardown(server_stopped_badly):
            pass
    """)
    result = suite.runpytest("--lora-guard")
    result.assert_outcomes(passed=1, errors=2)
    result.stdout.fnmatch_lines([
        "*ERROR at setup of test_setup*",
        "*LG001 pool-shape-drift during setup*",
        "*ERROR at teardown of test_teardown*",
        "*LG201 registry-inconsistent during teardown*",
    ])


def test_a_violation_in_a_background_thread_fails_the_test(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_thread="""
        import threading
        from server import swallow_lg001

        def test_scheduler_thread():
            worker = threading.Thread(target=swallow_lg001)
            worker.start()
            worker.join()
    """)
    result = suite.runpytest("--lora-guard")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*LG001 pool-shape-drift during call*"])


def test_an_xfail_test_with_a_violation_is_xfailed(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_known="""
        import pytest
        from server import swallow_lg001

        @pytest.mark.xfail(reason="issue 1234: hot swap to a smaller rank")
        def test_known_bug():
            swallow_lg001()
    """)
    suite.runpytest("--lora-guard").assert_outcomes(xfailed=1)


def test_lora_violations_is_live_with_and_without_the_flag(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_fixture="""
        import pytest
        from server import swallow_lg001

        @pytest.mark.lora_guard(expect=("LG001",))
        def test_reads_them(lora_violations):
            assert lora_violations.codes == []
            swallow_lg001()
            assert lora_violations.codes == ["LG001"]
            assert "frozen at 16" in lora_violations.violations[0].message
    """)
    suite.runpytest("--lora-guard").assert_outcomes(passed=1)
    suite.runpytest().assert_outcomes(passed=1)


def test_assert_violations_inside_a_test_handles_them(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_handled="""
        from lora_guard.testing import assert_violations, capture_violations
        from server import swallow_lg001
        from slots import swallow_lg201

        def test_asserted():
            with assert_violations("LG001"):
                swallow_lg001()

        def test_captured():
            with capture_violations() as seen:
                swallow_lg201()
            assert seen.codes == ["LG201", "LG201"]
    """)
    result = suite.runpytest("--lora-guard")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        "*lora_guard summary*",
        "code   invariant              violations  unhandled  handled  no test  tests  tests failed",  # noqa: E501
        "LG001  pool-shape-drift                1          0        1        0      1             0",  # noqa: E501
        "LG201  registry-inconsistent           2          0        2        0      1             0",  # noqa: E501
    ])


SUMMARY_SUITE = {
    "test_one": """
        import pytest
        from slots import swallow_lg003, swallow_lg201

        def test_twice():
            swallow_lg003()
            swallow_lg003()

        def test_once():
            swallow_lg003()

        @pytest.mark.lora_guard(allow=("LG201",))
        def test_slots():
            swallow_lg201()

        def test_clean():
            pass
    """,
    "test_two": """
        import pytest
        from slots import swallow_lg003

        @pytest.mark.parametrize("n", range(4))
        def test_many(n):
            swallow_lg003()
    """,
}

SUMMARY_LINES = [
    "*= lora_guard summary =*",
    "code   invariant              violations  unhandled  handled  no test  tests  tests failed",
    # seven LG003 violations in six tests, all six failed by lora_guard
    "LG003  cache-key-collision             7          7        0        0      6             6",
    "LG201  registry-inconsistent           2          0        2        0      1             0",
    "LG003 in: test_one.py::test_once, test_one.py::test_twice, test_two.py::test_many[[]0[]], "
    "test_two.py::test_many[[]1[]], test_two.py::test_many[[]2[]] and 1 more",
    "LG201 in: test_one.py::test_slots",
]


def test_the_summary_counts_each_code_and_its_tests(suite: pytest.Pytester) -> None:
    suite.makepyfile(**SUMMARY_SUITE)
    result = suite.runpytest("--lora-guard", "-p", "no:randomly")
    result.assert_outcomes(passed=2, failed=6)
    result.stdout.fnmatch_lines([*SUMMARY_LINES, "6 tests failed by lora_guard.*"])


def test_under_xdist_workers_violations_are_counted_once_on_the_controller(
    suite: pytest.Pytester,
) -> None:
    suite.makepyfile(**SUMMARY_SUITE)
    result = suite.runpytest_subprocess("-n", "2", "--lora-guard", *QUIET)
    result.assert_outcomes(passed=2, failed=6)
    result.stdout.fnmatch_lines([*SUMMARY_LINES, "6 tests failed by lora_guard.*"])
    assert result.stdout.str().count("lora_guard summary") == 1


def test_violations_outside_any_test_are_in_the_summary(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_import_time="""
        from slots import swallow_lg201

        swallow_lg201()   # at import, during collection

        def test_fine():
            pass
    """)
    result = suite.runpytest("--lora-guard")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "LG201  registry-inconsistent           2          0        0        2      0             0",  # noqa: E501
        "LG201 in: <outside any test>",
    ])


def test_the_session_leaves_mode_and_sinks_as_it_found_them(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_swap=SWALLOWING_TEST)
    before = (lg.get_mode(), _config.STATE.sinks)
    lg.configure(mode="record")
    try:
        suite.runpytest("--lora-guard").assert_outcomes(failed=1)
        assert lg.get_mode() == "record"
        assert _config.STATE.sinks == before[1]
    finally:
        lg.configure(mode=before[0])


def test_make_adapter_writes_real_adapters_with_or_without_the_flag(
    suite: pytest.Pytester,
) -> None:
    suite.makepyfile(test_adapters="""
        import json
        import lora_guard as lg
        from lora_guard.testing import DEFECTS

        def test_healthy_and_broken(make_adapter, tmp_path):
            healthy = make_adapter(rank=16, targets=("q_proj", "v_proj"))
            broken = make_adapter(name="broken", defects=("orphan-b",))
            assert healthy == tmp_path / "adapter0" and broken == tmp_path / "broken"
            assert json.loads((healthy / "adapter_config.json").read_text())["r"] == 16
            assert lg.inspect_adapter(healthy).rank == 16
            assert DEFECTS["orphan-b"] == "LG103"
    """)
    suite.runpytest().assert_outcomes(passed=1)
    suite.runpytest("--lora-guard").assert_outcomes(passed=1)


# -- --lora-guard-instrument ---------------------------------------------------------------


def test_instrument_names_the_known_libraries_for_an_unknown_one(
    suite: pytest.Pytester,
) -> None:
    result = suite.runpytest("--lora-guard-instrument=peft,tensorrt")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "*--lora-guard-instrument: unknown 'tensorrt'; known libraries: lmdeploy, peft, sglang, "
        "vllm*",
    ])


def test_instrument_without_the_integration_is_a_usage_error_naming_it(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "lora_guard.integrations.vllm", None)  # not importable
    before = (lg.get_mode(), _config.STATE.sinks)
    result = suite.runpytest("--lora-guard", "--lora-guard-instrument=vllm")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "*--lora-guard-instrument=vllm: cannot import the vllm integration*"
        "no working vllm integration*",
    ])
    assert (lg.get_mode(), _config.STATE.sinks) == before


def test_instrument_instruments_for_the_session_and_undoes_it(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    fake = types.ModuleType("lora_guard.integrations.sglang")
    fake.calls = calls  # type: ignore[attr-defined]
    fake.instrument = lambda: calls.append("instrument")  # type: ignore[attr-defined]
    fake.uninstrument = lambda: calls.append("uninstrument")  # type: ignore[attr-defined]
    fake.INTEGRATION = fake  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lora_guard.integrations.sglang", fake)
    suite.makepyfile(test_calls="""
        import sys

        def test_runs_instrumented():
            assert sys.modules["lora_guard.integrations.sglang"].calls == ["instrument"]
    """)
    result = suite.runpytest("--lora-guard-instrument=sglang")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["lora_guard: instrumented: sglang"])
    assert calls == ["instrument", "uninstrument"]


def test_a_third_party_integration_from_its_entry_point_is_instrumented(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package that registers under the entry-point group ``lora_guard.integrations``
    (say, for its own LoRA server) is instrumented by name like the built-in ones."""
    import importlib.metadata

    from lora_guard import integrations

    calls: list[str] = []
    plugin_module = types.ModuleType("myserver_lora_guard")
    plugin_module.integration = types.SimpleNamespace(  # type: ignore[attr-defined]
        instrument=lambda: calls.append("instrument"),
        uninstrument=lambda: calls.append("uninstrument"))
    monkeypatch.setitem(sys.modules, "myserver_lora_guard", plugin_module)
    entry_point = importlib.metadata.EntryPoint(
        name="myserver", value="myserver_lora_guard:integration",
        group=integrations.ENTRY_POINT_GROUP)
    monkeypatch.setattr(integrations, "_entry_points", lambda: {"myserver": entry_point})
    suite.makepyfile(test_calls="""
        def test_runs():
            pass
    """)
    result = suite.runpytest("--lora-guard-instrument=myserver")
    result.assert_outcomes(passed=1)
    assert calls == ["instrument", "uninstrument"]


# -- the pytest11 module stays light -------------------------------------------------------

PROBE = """
    import json, os, sys

    def test_probe():
        with open(os.environ["LG_PROBE"], "w") as f:
            json.dump(sorted(sys.modules), f)
"""


def _modules_seen(pytester: pytest.Pytester, *args: str) -> set[str]:
    out = pytester.path / "modules.json"
    pytester.makepyfile(test_probe=PROBE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LG_PROBE", str(out))
        pytester.runpytest_subprocess(*QUIET, *args).assert_outcomes(passed=1)
    return set(json.loads(out.read_text()))


def test_the_plugin_imports_nothing_heavy_unless_enabled(pytester: pytest.Pytester) -> None:
    without = _modules_seen(pytester, "-p", "no:lora_guard")
    installed = _modules_seen(pytester)
    added = installed - without
    assert "lora_guard.pytest_plugin" in added
    heavy = {"torch", "hypothesis", "numpy", "safetensors", "peft", "lora_guard._frontends.plugin",
             "lora_guard.testing", "lora_guard.strategies", "lora_guard._testing.adapter_writer"}
    assert not added & heavy, sorted(added & heavy)
    assert not any(m.startswith(("torch.", "lora_guard.integrations")) for m in added)
    enabled = _modules_seen(pytester, "--lora-guard")
    assert "lora_guard._frontends.plugin" in enabled
    assert not enabled & {"torch", "hypothesis", "numpy"}


@XDIST
@pytest.mark.parametrize("flag", [(), ("--lora-guard",)], ids=["without-flag", "with-flag"])
def test_a_misspelled_marker_code_is_a_collection_error_with_or_without_the_flag(
    suite: pytest.Pytester, flag: tuple[str, ...], xdist: tuple[str, ...],
) -> None:
    suite.makepyfile(test_typo=textwrap.dedent("""
        import pytest

        @pytest.mark.lora_guard(expect=("LG9999",))
        def test_misspelled():
            pass

        @pytest.mark.lora_guard(allow=("LG01",))
        def test_close_to_a_code():
            pass
    """))
    result = run(suite, xdist, *flag)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([
        "*test_typo.py::test_misspelled: @pytest.mark.lora_guard(expect=...): 'LG9999' is not "
        "a lora_guard code*",
        "*test_typo.py::test_close_to_a_code: *'LG01' is not a lora_guard code (did you mean "
        "'LG001'?)*",
    ])


def test_the_plugin_imports_no_other_lora_guard_module_unless_enabled(
    pytester: pytest.Pytester,
) -> None:
    added = _modules_seen(pytester) - _modules_seen(pytester, "-p", "no:lora_guard")
    assert sorted(m for m in added if m.startswith("lora_guard")) == [
        "lora_guard", "lora_guard.pytest_plugin"]


HANDLED_SUITE = """
    import warnings

    import pytest
    import lora_guard as lg
    from slots import swallow_lg201


    def reconcile():
        lg.assert_slot_maps_consistent({"a": 0}, ["b"])


    def test_raises_the_class():
        with pytest.raises(lg.RegistryError):
            reconcile()


    def test_raises_a_base_with_match():
        with pytest.raises(RuntimeError, match="slot 0 holds 'b'"):
            reconcile()


    def test_raises_the_function_form():
        pytest.raises(lg.RegistryError, reconcile)


    def test_an_exception_group_member():
        def many():
            errors = []
            for _ in range(2):
                try:
                    reconcile()
                except lg.RegistryError as e:
                    errors.append(e)
            raise ExceptionGroup("two loads failed", errors)
        with pytest.RaisesGroup(lg.RegistryError, lg.RegistryError):
            many()
        with pytest.raises(ExceptionGroup):
            many()


    def test_warns_in_warn_mode():
        lg.configure(mode="warn")
        try:
            with pytest.warns(lg.LoRAGuardWarning, match="slot 0 holds"):
                reconcile()
        finally:
            lg.configure(mode="raise")


    def test_swallowed_by_the_code_under_test():
        swallow_lg201()


    def test_raises_with_a_match_that_does_not_match():
        with pytest.raises(lg.RegistryError, match="no such text"):
            reconcile()


    def test_warns_of_another_category_does_not_cover_it():
        lg.configure(mode="warn")
        try:
            with pytest.warns(DeprecationWarning):
                warnings.warn("old option", DeprecationWarning)
                reconcile()
        finally:
            lg.configure(mode="raise")
"""


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["in-process", "xdist"])
def test_a_violation_caught_by_pytest_raises_or_warns_is_handled(
    suite: pytest.Pytester, xdist: tuple[str, ...],
) -> None:
    suite.makepyfile(test_handled=HANDLED_SUITE)
    if xdist:
        result = suite.runpytest_subprocess("--lora-guard", *xdist, *QUIET)
    else:
        result = suite.runpytest("--lora-guard")
    result.assert_outcomes(passed=5, failed=3)
    result.stdout.fnmatch_lines_random([
        "FAILED test_handled.py::test_swallowed_by_the_code_under_test - Failed: lora_*",
        "FAILED test_handled.py::test_raises_with_a_match_that_does_not_match - Assert*",
        "FAILED test_handled.py::test_warns_of_another_category_does_not_cover_it - *",
    ])


@XDIST
def test_lora_violations_is_a_sequence_like_recwarn(
    suite: pytest.Pytester, xdist: tuple[str, ...],
) -> None:
    suite.makepyfile(test_seq="""
        import pytest
        from slots import swallow_lg003, swallow_lg201

        @pytest.mark.lora_guard(expect=("LG201", "LG003"))
        def test_reads_them(lora_violations):
            swallow_lg201()
            swallow_lg003()
            assert len(lora_violations) == 3
            assert [v.code for v in lora_violations] == ["LG201", "LG201", "LG003"]
            assert lora_violations[-1].code == "LG003"
            assert lora_violations.pop("LG003").code == "LG003"
            assert lora_violations.codes == ["LG201", "LG201"]
            with pytest.raises(AssertionError, match="LG003 violation was not recorded"):
                lora_violations.pop("LG003")
            lora_violations.clear()
            assert list(lora_violations) == []
    """)
    run(suite, xdist, "--lora-guard").assert_outcomes(passed=1)
    run(suite, xdist).assert_outcomes(passed=1)


@XDIST
def test_a_thread_started_by_a_test_is_charged_to_it_and_a_late_one_to_no_other_test(
    suite: pytest.Pytester, xdist: tuple[str, ...],
) -> None:
    suite.makepyfile(test_threads="""
        import threading
        from concurrent.futures import ThreadPoolExecutor
        from slots import swallow_lg201, swallow_lg003

        POOL = ThreadPoolExecutor(max_workers=1)
        late = threading.Event()
        LATE = []

        def test_a_starts_work_that_outlives_it():
            def background():
                late.wait(10)
                swallow_lg003()
            t = threading.Thread(target=background)
            t.start()
            LATE.append(t)

        def test_b_unrelated():
            late.set()
            LATE[0].join()

        def test_c_executor_work_is_charged_to_its_submitter():
            POOL.submit(swallow_lg201).result()

        def test_d_the_same_worker_thread_later_is_clean():
            POOL.submit(lambda: None).result()
    """)
    # One file's tests run in order on one worker (--dist loadfile), as the suite needs.
    result = run(suite, xdist and (*xdist, "--dist", "loadfile"), "--lora-guard", "-p",
                 "no:randomly")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines([
        "FAILED test_threads.py::test_c_executor_work_is_charged_to_its_submitter - *",
    ])
    result.stdout.fnmatch_lines([
        "LG003 in: <from test_threads.py::test_a_starts_work_that_outlives_it, after it ended>",
    ])


@XDIST
def test_a_thread_no_test_started_is_unattributed_never_charged_to_the_running_test(
    suite: pytest.Pytester, xdist: tuple[str, ...],
) -> None:
    suite.makepyfile(test_daemon="""
        import threading
        from slots import swallow_lg201

        # The user's module starts a background loader at import, before any test runs.
        go = threading.Event()
        LOADER = threading.Thread(target=lambda: (go.wait(10), swallow_lg201()))
        LOADER.start()

        def test_runs_while_the_loader_reconciles():
            go.set()
            LOADER.join()
    """)
    result = run(suite, xdist, "--lora-guard")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "LG201  registry-inconsistent           2          0        0        2      0             0",  # noqa: E501
        "LG201 in: <unattributed thread>",
        "0 tests failed by lora_guard.*",
    ])


@XDIST
def test_a_dtype_violation_is_recorded_once(
    suite: pytest.Pytester, xdist: tuple[str, ...],
) -> None:
    suite.makepyfile(test_dtype="""
        import pytest
        import torch
        import lora_guard as lg

        @lg.shapes(a="rank hidden", dtypes=(torch.bfloat16,))
        def set_lora_info(a):
            return a

        def test_a_float32_weight(lora_violations):
            with pytest.raises(lg.ShapeContractError):
                set_lora_info(torch.empty(4, 8, device="meta"))
            assert lora_violations.codes == ["LG004"]
    """)
    result = run(suite, xdist, "--lora-guard")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "LG004  *  1          0        1        0      1             0"])
