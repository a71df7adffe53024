"""The pytest plugin's work, installed by `lora_guard.pytest_plugin` when it is enabled.

One sink, registered with `_config.add_sink` for the session, receives every violation any
guard reports, in any thread, including the ones the code under test catches and swallows.
Each violation is filed under the test phase (setup, call, teardown) that was running. At the
end of the phase, the violations that the test neither allows, expects, nor captured with
`lora_guard.testing.capture_violations` fail it: the phase raises ``pytest.fail`` with the
list, so xfail, ``--pdb`` and the reports treat it as any other failure.

The violations of a phase travel on its report (attribute ``lora_guard_violations``, a list
of plain dicts) so that under xdist the controller, which sees every report once, builds the
session summary.
"""

from __future__ import annotations

import contextvars
import sys
import threading
from collections import Counter
from collections.abc import Generator, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import pytest

from lora_guard._core.catalogue import INVARIANTS
from lora_guard._core.config import Mode, Recording, add_sink, configure, get_mode, remove_sink
from lora_guard._core.errors import Violation
from lora_guard._frontends import _plugin_state

__all__ = ["REPORT_ATTRIBUTE", "REPORT_COUNTS", "LoRAGuardPlugin", "install"]

REPORT_ATTRIBUTE = "lora_guard_violations"
PLUGIN_NAME = "lora_guard_session"
_OUTSIDE = "<outside any test>"
_UNATTRIBUTED = "<unattributed thread>"
_WORKER_KEY = "lora_guard_outside"
_MAX_TESTS_LISTED = 5
# A test that reports 10,000 violations (swallowed in a loop) gets a failure that lists the
# first _MAX_LISTED and counts the rest; its report carries the first _MAX_KEPT as dicts and
# every one in the counts (REPORT_COUNTS), which the summary adds up.
_MAX_LISTED = 20
_MAX_KEPT = 100
REPORT_COUNTS = "lora_guard_counts"

# Sessions installed in this process, innermost last (pytester runs sessions in-process):
# only the innermost one observes, so a nested run's violations do not fail the outer test.
# The list lives in _plugin_state, shared with the pytest11 module (see its docstring).
_SESSIONS: list[object] = _plugin_state.SESSIONS


class _Instrumentable(Protocol):
    def instrument(self) -> Any: ...

    def uninstrument(self) -> Any: ...


@dataclass
class _Observed:
    when: str
    violation: Violation
    handled: bool


@dataclass
class _TestState:
    allow: frozenset[str] = frozenset()
    expect: frozenset[str] = frozenset()
    when: str = "setup"
    recording: Recording = field(default_factory=Recording)
    observed: list[_Observed] = field(default_factory=list)
    # id() of each violation observed: a catch by pytest.raises is one lookup, not a scan
    # (a test with 10,000 catches stays linear).
    observed_ids: set[int] = field(default_factory=set)
    failed_by_us: set[str] = field(default_factory=set)
    problem: str = ""
    # id() of the violations whose exception reached a matching pytest.raises, or whose
    # warning a pytest.warns matched: the test handled them as pytest itself decided.
    caught: set[int] = field(default_factory=set)
    nodeid: str = ""
    finished: bool = False
    example_start: int = 0  # index in observed where the running doctest example began

    def status(self, item: _Observed) -> str:
        code = item.violation.code
        if item.handled:
            return "captured"
        if id(item.violation) in self.caught:
            return "caught"
        if code in self.expect:
            return "expected"
        if code in self.allow:
            return "allowed"
        return "failed"


_STATE_KEY = pytest.StashKey[_TestState]()
_MARKS_KEY = _plugin_state.MARKS_KEY
_marker_codes = _plugin_state.marker_codes


def _parse_instrument(value: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip().lower() for n in value.split(",") if n.strip()))
    if not names:
        return ()
    from lora_guard import integrations  # light: imports no guarded library

    known = integrations.available()  # built in, and third parties' entry points
    unknown = [n for n in names if n not in known]
    if unknown:
        raise pytest.UsageError(
            f"--lora-guard-instrument: unknown {', '.join(map(repr, unknown))}; "
            f"known libraries: {', '.join(known)} (comma-separated, e.g. "
            "--lora-guard-instrument=peft,vllm)"
        )
    return names


def _load_integrations(names: Iterable[str]) -> list[tuple[str, _Instrumentable]]:
    from lora_guard import integrations

    loaded: list[tuple[str, _Instrumentable]] = []
    for name in names:
        try:
            integration = integrations.get(name)
        except ImportError as exc:
            raise pytest.UsageError(
                f"--lora-guard-instrument={name}: cannot import the {name} integration "
                f"({exc}); this lora_guard install has no working {name} integration: "
                f"upgrade lora_guard or drop {name!r} from the option."
            ) from exc
        except (AttributeError, TypeError, ValueError) as exc:
            raise pytest.UsageError(f"--lora-guard-instrument={name}: {exc}") from exc
        loaded.append((name, integration))
    return loaded


def _violations_in(exc: BaseException) -> list[object]:
    """The violations carried by an exception that reached ``pytest.raises``, and by the
    members of an exception group (nested groups included); not by its cause or context:
    an error the code under test converted into another one was handled by that code."""
    found: list[object] = []
    stack: list[BaseException] = [exc]
    seen: set[int] = set()
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        carried = getattr(e, "violations", None)
        if isinstance(carried, list):
            found.extend(carried)
        members = getattr(e, "exceptions", None)  # an ExceptionGroup (or its backport)
        if isinstance(members, tuple):
            stack.extend(m for m in members if isinstance(m, BaseException))
    return found


def _mark_caught(violations: Iterable[object]) -> None:
    """Tell the innermost session that the test caught these violations with pytest."""
    if not _SESSIONS:
        return
    session = _SESSIONS[-1]
    mark = getattr(session, "mark_caught", None)
    if mark is not None:
        mark(violations)


def _wrap_raises_exit(original: Any) -> Any:
    def __exit__(self: Any, exc_type: Any, exc_val: Any, exc_tb: Any) -> Any:
        __tracebackhide__ = True
        suppressed = original(self, exc_type, exc_val, exc_tb)
        if suppressed and exc_val is not None:  # pytest matched it: the test handled it
            _mark_caught(_violations_in(exc_val))
        return suppressed

    __exit__.__wrapped__ = original  # type: ignore[attr-defined]
    __exit__.__lora_guard__ = True  # type: ignore[attr-defined]
    return __exit__


def _wrap_warns_exit(original: Any) -> Any:
    def __exit__(self: Any, exc_type: Any, exc_val: Any, exc_tb: Any) -> Any:
        __tracebackhide__ = True
        try:
            return original(self, exc_type, exc_val, exc_tb)
        finally:  # the warnings pytest.warns matched (it re-emits the others)
            _mark_caught(getattr(w.message, "violation", None) for w in list(self)
                         if self.matches(w))

    __exit__.__wrapped__ = original  # type: ignore[attr-defined]
    __exit__.__lora_guard__ = True  # type: ignore[attr-defined]
    return __exit__


def _doctest_start(original: Any) -> Any:
    def report_start(self: Any, out: Any, test: Any, example: Any) -> Any:
        if _SESSIONS:
            getattr(_SESSIONS[-1], "example_started", lambda: None)()
        return original(self, out, test, example)

    report_start.__wrapped__ = original  # type: ignore[attr-defined]
    report_start.__lora_guard__ = True  # type: ignore[attr-defined]
    return report_start


def _doctest_success(original: Any) -> Any:
    def report_success(self: Any, out: Any, test: Any, example: Any, got: Any) -> Any:
        # An example whose expected output is the traceback it raised: doctest's own
        # pytest.raises. What that example reported, the doctest expected.
        if example.exc_msg is not None and _SESSIONS:
            getattr(_SESSIONS[-1], "example_raised_as_expected", lambda: None)()
        return original(self, out, test, example, got)

    report_success.__wrapped__ = original  # type: ignore[attr-defined]
    report_success.__lora_guard__ = True  # type: ignore[attr-defined]
    return report_success


def _pytest_catchers() -> list[tuple[type, Any]]:
    from _pytest import raises as raises_module
    from _pytest import recwarn

    return [(raises_module.RaisesExc, _wrap_raises_exit),
            (raises_module.RaisesGroup, _wrap_raises_exit),
            (recwarn.WarningsChecker, _wrap_warns_exit)]


def _doctest_catchers() -> list[tuple[type, str, Any]]:
    import doctest

    return [(doctest.DocTestRunner, "report_start", _doctest_start),
            (doctest.DocTestRunner, "report_success", _doctest_success)]


def _observe_pytest_catchers() -> None:
    """Wrap ``__exit__`` of pytest.raises / RaisesGroup / pytest.warns, once per process.

    The wrapper lets pytest decide exactly as it always does, then files the violations of
    what pytest accepted as caught by the test. (A nested pytester run finds them wrapped.)
    """
    for cls, wrap in _pytest_catchers():
        current = cls.__dict__["__exit__"]
        if not getattr(current, "__lora_guard__", False):
            cls.__exit__ = wrap(current)  # type: ignore[attr-defined]
    for cls, name, wrap in _doctest_catchers():
        current = cls.__dict__[name]
        if not getattr(current, "__lora_guard__", False):
            setattr(cls, name, wrap(current))


def _restore_pytest_catchers() -> None:
    for cls, _ in _pytest_catchers():
        current = cls.__dict__["__exit__"]
        if getattr(current, "__lora_guard__", False):
            cls.__exit__ = current.__wrapped__  # type: ignore[attr-defined]
    for cls, name, _ in _doctest_catchers():
        current = cls.__dict__[name]
        if getattr(current, "__lora_guard__", False):
            setattr(cls, name, current.__wrapped__)


def _thread_start(original: Any) -> Any:
    def start(self: threading.Thread) -> None:
        # The thread runs in a copy of the starter's context: a test's identity goes with it.
        context = contextvars.copy_context()
        run = self.run
        self.run = lambda: context.run(run)  # type: ignore[method-assign]
        original(self)

    start.__wrapped__ = original  # type: ignore[attr-defined]
    start.__lora_guard__ = True  # type: ignore[attr-defined]
    return start


def _executor_submit(original: Any) -> Any:
    def submit(self: Any, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        # Each work item runs in the submitter's context, whichever worker thread takes it.
        return original(self, contextvars.copy_context().run, fn, *args, **kwargs)

    submit.__wrapped__ = original  # type: ignore[attr-defined]
    submit.__lora_guard__ = True  # type: ignore[attr-defined]
    return submit


def _carriers() -> list[tuple[type, str, Any]]:
    return [(threading.Thread, "start", _thread_start),
            (ThreadPoolExecutor, "submit", _executor_submit)]


def _carry_test_into_threads(carry: bool) -> None:
    """Copy the starter's context into threads and executor work started while observing."""
    for cls, name, wrap in _carriers():
        current = cls.__dict__[name]
        wrapped = getattr(current, "__lora_guard__", False)
        if carry and not wrapped:
            setattr(cls, name, wrap(current))
        elif not carry and wrapped:
            setattr(cls, name, current.__wrapped__)


def _format(observed: list[tuple[str, _Observed]]) -> str:
    """The first `_MAX_LISTED` violations in full, then the others counted by code."""
    lines = []
    for status, item in observed[:_MAX_LISTED]:
        v = item.violation.to_dict()
        tag = "" if status == "failed" else f" [{status}]"
        lines.append(f"{v['code']} {v['invariant']}{tag}: {v['message']}")
        lines.append(f"    fix: {v['hint']}")
        if v.get("location"):
            lines.append(f"    at:  {v['location']}")
    rest = Counter(item.violation.code for _, item in observed[_MAX_LISTED:])
    if rest:
        counted = ", ".join(f"{code} x {n:,}" for code, n in sorted(rest.items()))
        lines.append(f"... and {sum(rest.values()):,} more ({counted}), not listed")
    return "\n".join(lines)


def _counts(observed: Iterable[tuple[str, _Observed]]) -> dict[str, dict[str, int]]:
    """code -> status -> how many."""
    counts: dict[str, dict[str, int]] = {}
    for status, item in observed:
        by_status = counts.setdefault(item.violation.code, {})
        by_status[status] = by_status.get(status, 0) + 1
    return counts


def _as_dict(item: _Observed, status: str) -> dict[str, Any]:
    data = item.violation.to_dict()
    data["when"] = item.when
    data["status"] = status
    return data


class LoRAGuardPlugin:
    """The session's observer: registered with pytest as ``lora_guard_session``."""

    def __init__(self, config: pytest.Config, *, enabled: bool,
                 integrations: list[tuple[str, _Instrumentable]]) -> None:
        self.config = config
        self.enabled = enabled
        self.integrations = integrations
        self.instrumented: list[tuple[str, _Instrumentable]] = []
        self.previous_mode: Mode | None = None
        # The running test, carried by contextvars into the threads and executor work it
        # starts (see _carry_test_into_threads); one variable per session (pytester nests).
        self.current: contextvars.ContextVar[_TestState | None] = contextvars.ContextVar(
            f"lora_guard_test_{id(self)}", default=None)
        # (code, where, status) -> how many, for violations outside any test: counted, not
        # kept, so a thread that reports forever costs no memory here.
        self.outside: Counter[tuple[str, str, str]] = Counter()
        # code -> nodeid -> status -> how many, filled from reports on the controller
        self.totals: dict[str, dict[str, Counter[str]]] = {}
        self._lock = threading.Lock()
        self.mode: Mode = "raise"  # the mode every test starts and ends in

    # -- the sink -----------------------------------------------------------------------

    def sink(self, violation: Violation) -> None:
        if not _SESSIONS or _SESSIONS[-1] is not self:
            return
        # The testing module the test imported (a nested run may have re-imported it).
        capturing = sys.modules.get("lora_guard.testing")
        state = self.current.get()
        # Handled when a capture opened by this same test (or, outside tests, by no test) is
        # open: a capture another test left open, in a thread of its own, handles nothing.
        handled = any(context.get(self.current) is state
                      for _, context in list(getattr(capturing, "_ACTIVE", ())))
        if state is None or state.finished:
            where = _OUTSIDE
            if state is not None:  # from work a test started, after that test ended
                where = f"<from {state.nodeid}, after it ended>"
            elif threading.current_thread() is not threading.main_thread():
                where = _UNATTRIBUTED  # a thread no test started
            with self._lock:
                self.outside[(violation.code, where, "captured" if handled else "observed")] += 1
            return
        state.observed.append(_Observed(state.when, violation, handled))
        state.observed_ids.add(id(violation))
        state.recording._add(violation)

    def example_started(self) -> None:
        state = self.current.get()
        if state is not None:
            state.example_start = len(state.observed)

    def example_raised_as_expected(self) -> None:
        state = self.current.get()
        if state is not None:
            state.caught.update(id(o.violation) for o in state.observed[state.example_start:])

    def mark_caught(self, violations: Iterable[object]) -> None:
        state = self.current.get()
        if state is None:
            return
        state.caught.update(i for i in map(id, violations) if i in state.observed_ids)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        for name, module in self.integrations:
            module.instrument()
            self.instrumented.append((name, module))
        if self.enabled:
            self.previous_mode = get_mode()
            configure(mode=self.mode)
            _SESSIONS.append(self)
            _observe_pytest_catchers()
            _carry_test_into_threads(True)
            add_sink(self.sink)

    def stop(self) -> None:
        if self.enabled:
            remove_sink(self.sink)
            if self in _SESSIONS:
                _SESSIONS.remove(self)
            if not _SESSIONS:
                _restore_pytest_catchers()
                _carry_test_into_threads(False)
            if self.previous_mode is not None:
                configure(mode=self.previous_mode)
        while self.instrumented:
            _, module = self.instrumented.pop()
            module.uninstrument()

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.stop()

    def pytest_report_header(self, config: pytest.Config) -> str:
        parts = []
        if self.enabled:
            parts.append("violations fail tests (mode 'raise', swallowed ones included)")
        if self.integrations:
            parts.append("instrumented: " + ", ".join(n for n, _ in self.integrations))
        return "lora_guard: " + "; ".join(parts)

    def state_of(self, item: pytest.Item) -> _TestState | None:
        return item.stash.get(_STATE_KEY, None)

    # -- running a test -----------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, object, object]:
        if not self.enabled:
            return (yield)
        marks = item.stash.get(_MARKS_KEY, None)
        problem = ""
        if marks is None:  # an item that was not collected from a Python module
            try:
                marks = _marker_codes(item)
            except (ValueError, TypeError) as exc:
                marks, problem = (frozenset(), frozenset()), str(exc)
        state = item.stash[_STATE_KEY] = _TestState(
            allow=marks[0], expect=marks[1], problem=problem)
        state.nodeid = item.nodeid
        self._restore_mode()  # whatever a test before switched (off, warn...) ends with it
        token = self.current.set(state)
        try:
            return (yield)
        finally:
            state.finished = True
            self.current.reset(token)
            self._restore_mode()
            # The reports are made: what the test observed is no longer needed (a session
            # of tests that each swallow thousands of violations keeps none of them).
            state.observed, state.observed_ids, state.caught = [], set(), set()
            state.recording = Recording()

    def _restore_mode(self) -> None:
        if get_mode() != self.mode:
            configure(mode=self.mode)

    def _phase(self, item: pytest.Item, when: str) -> Generator[None, None, None]:
        state = item.stash.get(_STATE_KEY, None)
        if state is None or not self.enabled:
            yield
            return
        state.when = when
        if state.problem and when == "setup":
            state.failed_by_us.add(when)
            pytest.fail(f"lora_guard: {state.problem}", pytrace=False)
        yield  # an exception from the phase propagates: makereport adds our section
        phases = ("setup", "call") if when == "call" else (when,)
        failing = [(state.status(o), o) for o in state.observed if o.when == when]
        failing = [(s, o) for s, o in failing if s == "failed"]
        missing = []
        if when == "call":
            seen = {o.violation.code for o in state.observed if o.when in phases}
            missing = sorted(state.expect - seen)
        if not failing and not missing:
            return
        lines = []
        if failing:
            codes = list(dict.fromkeys(o.violation.code for _, o in failing))
            lines.append(
                "lora_guard: " + ", ".join(f"{c} {INVARIANTS[c].slug}" for c in codes)
                + f" during {when}: {len(failing)} violation{'s' if len(failing) > 1 else ''}"
                ", raised or swallowed by the code under test"
            )
            lines.append(_format(failing))
            lines.append(
                "Fix the code, or say the test expects it: pytest.raises(...) around the "
                "call (pytest.warns in warn mode), @pytest.mark.lora_guard(expect=(...)) "
                "requires a code, allow=(...) lets it pass; a violation the code under test "
                "swallowed is seen only by the marker or lora_guard.testing.assert_violations."
            )
        for code in missing:
            lines.append(
                f"lora_guard: the test expects {code} ({INVARIANTS[code].slug}) but it was "
                "not reported during setup or call."
            )
        state.failed_by_us.add(when)
        pytest.fail("\n".join(lines), pytrace=False)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, None, None]:
        return (yield from self._phase(item, "setup"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        return (yield from self._phase(item, "call"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, None, None]:
        return (yield from self._phase(item, "teardown"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        state = item.stash.get(_STATE_KEY, None)
        if state is None or not self.enabled:
            return report
        mine = [(state.status(o), o) for o in state.observed if o.when == call.when]
        if mine:
            setattr(report, REPORT_ATTRIBUTE, [_as_dict(o, s) for s, o in mine[:_MAX_KEPT]])
            setattr(report, REPORT_COUNTS, _counts(mine))
            if report.failed and call.when not in state.failed_by_us:
                report.sections.append((f"lora_guard violations ({call.when})", _format(mine)))
        return report

    # -- gathering (on the controller under xdist) ---------------------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        counts = getattr(report, REPORT_COUNTS, None)
        if not counts:
            return
        with self._lock:
            for code, by_status in counts.items():
                by_test = self.totals.setdefault(code, {})
                by_test.setdefault(report.nodeid, Counter()).update(by_status)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None and self.outside:
            workeroutput[_WORKER_KEY] = [[*key, n] for key, n in self.outside.items()]

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        outside = getattr(node, "workeroutput", {}).get(_WORKER_KEY, [])
        with self._lock:
            for code, where, status, n in outside:
                self.outside[(code, where, status)] += n

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.enabled or hasattr(self.config, "workerinput"):
            return
        for (code, where, status), n in self.outside.items():
            self.totals.setdefault(code, {}).setdefault(where, Counter())[status] += n
        if not self.totals:
            return
        tr = terminalreporter
        tr.write_sep("=", "lora_guard summary")
        # Violations and tests are counted apart: a test with three LG001 is one test.
        rows = [("code", "invariant", "violations", "unhandled", "handled", "no test",
                 "tests", "tests failed")]
        failing_tests: set[str] = set()
        for code in sorted(self.totals):
            by_test = self.totals[code]
            statuses: Counter[str] = sum(by_test.values(), Counter())
            total, unhandled = statuses.total(), statuses["failed"]
            failed_here = {t for t, per in by_test.items() if per["failed"]}
            failing_tests |= failed_here
            tests = [t for t in by_test if not t.startswith("<")]
            rows.append((code, INVARIANTS[code].slug if code in INVARIANTS else "?",
                         str(total), str(unhandled),
                         str(total - unhandled - statuses["observed"]),
                         str(statuses["observed"]),
                         str(len(tests)), str(len(failed_here - {_OUTSIDE, _UNATTRIBUTED}))))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            cells = zip(r, widths, strict=True)
            tr.write_line("  ".join(
                c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(cells)
            ).rstrip())
        for code in sorted(self.totals):
            tests = sorted(self.totals[code])
            shown = ", ".join(tests[:_MAX_TESTS_LISTED])
            more = len(tests) - _MAX_TESTS_LISTED
            tr.write_line(f"{code} in: {shown}" + (f" and {more} more" if more > 0 else ""))
        n_failed = len(failing_tests - {_OUTSIDE, _UNATTRIBUTED})
        tr.write_line(
            f"{n_failed} test{'' if n_failed == 1 else 's'} failed by lora_guard. handled: "
            "caught by pytest.raises / pytest.warns, declared by @pytest.mark.lora_guard, "
            "asserted with lora_guard.testing; violations outside any test or from threads no "
            "test owns are listed, never charged to a test. `lora-guard explain CODE` for fixes"
        )

    def recording_for(self, item: pytest.Item) -> Recording | None:
        state = item.stash.get(_STATE_KEY, None)
        return None if state is None else state.recording


def install(config: pytest.Config, *, enabled: bool = True) -> LoRAGuardPlugin:
    """Enable the plugin for this session: called by ``pytest_plugin.pytest_configure``.

    Validates ``--lora-guard-instrument`` first (a usage error leaves nothing changed),
    then instruments the libraries, sets the guards to ``raise`` and starts observing.
    """
    option = config.getoption("lora_guard_instrument") or config.getini("lora_guard_instrument")
    integrations = _load_integrations(_parse_instrument(str(option or "")))
    plugin = LoRAGuardPlugin(config, enabled=enabled, integrations=integrations)
    plugin.start()
    config.pluginmanager.register(plugin, PLUGIN_NAME)
    return plugin
