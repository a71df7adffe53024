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

import sys
import threading
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import pytest

from . import pytest_plugin, testing
from ._catalogue import INVARIANTS
from ._config import Mode, Recording, add_sink, configure, get_mode, remove_sink
from ._errors import Violation

__all__ = ["REPORT_ATTRIBUTE", "LoRAGuardPlugin", "install"]

REPORT_ATTRIBUTE = "lora_guard_violations"
PLUGIN_NAME = "lora_guard_session"
_OUTSIDE = "<outside any test>"
_WORKER_KEY = "lora_guard_outside"
_MAX_TESTS_LISTED = 5

# Sessions installed in this process, innermost last (pytester runs sessions in-process):
# only the innermost one observes, so a nested run's violations do not fail the outer test.
# The list lives in the pytest11 module, the one module a nested run never re-imports.
_SESSIONS: list[object] = pytest_plugin._SESSIONS


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
    failed_by_us: set[str] = field(default_factory=set)
    problem: str = ""

    def status(self, item: _Observed) -> str:
        code = item.violation.code
        if item.handled:
            return "captured"
        if code in self.expect:
            return "expected"
        if code in self.allow:
            return "allowed"
        return "failed"


_STATE_KEY = pytest.StashKey[_TestState]()
_MARKS_KEY = pytest.StashKey[tuple[frozenset[str], frozenset[str]]]()


def _parse_instrument(value: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip().lower() for n in value.split(",") if n.strip()))
    if not names:
        return ()
    from . import integrations  # light: imports no guarded library

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
    from . import integrations

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
        loaded.append((name, cast(_Instrumentable, integration)))
    return loaded


def _marker_codes(item: pytest.Item) -> tuple[frozenset[str], frozenset[str]]:
    """``allow`` and ``expect`` of every ``lora_guard`` marker on the item; ValueError if bad."""
    allow: set[str] = set()
    expect: set[str] = set()
    for mark in item.iter_markers("lora_guard"):
        if mark.args:
            raise ValueError(
                f"@pytest.mark.lora_guard takes keywords only, got positional {mark.args!r}; "
                "write @pytest.mark.lora_guard(allow=('LG003',), expect=('LG001',))"
            )
        unknown = sorted(set(mark.kwargs) - {"allow", "expect"})
        if unknown:
            raise ValueError(
                f"@pytest.mark.lora_guard: unknown keyword(s) {unknown}; it takes allow=(...) "
                "(codes that may occur) and expect=(...) (codes that must occur)"
            )
        for key, target in (("allow", allow), ("expect", expect)):
            if key in mark.kwargs:
                target.update(testing.check_codes(
                    mark.kwargs[key], where=f"@pytest.mark.lora_guard({key}=...)"))
    return frozenset(allow), frozenset(expect)


def _format(observed: Iterable[tuple[str, dict[str, Any]]]) -> str:
    lines = []
    for status, v in observed:
        tag = "" if status == "failed" else f" [{status}]"
        lines.append(f"{v['code']} {v['invariant']}{tag}: {v['message']}")
        lines.append(f"    fix: {v['hint']}")
        if v.get("location"):
            lines.append(f"    at:  {v['location']}")
    return "\n".join(lines)


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
        self.current: _TestState | None = None
        self.outside: list[dict[str, Any]] = []
        # code -> nodeid -> statuses (one per violation), filled from reports on the controller
        self.totals: dict[str, dict[str, list[str]]] = {}
        self._lock = threading.Lock()

    # -- the sink -----------------------------------------------------------------------

    def sink(self, violation: Violation) -> None:
        if not _SESSIONS or _SESSIONS[-1] is not self:
            return
        # The testing module the test imported (a nested run may have re-imported it).
        capturing = sys.modules.get("lora_guard.testing")
        handled = bool(capturing is not None and getattr(capturing, "_ACTIVE", None))
        state = self.current
        if state is None:
            data = _as_dict(_Observed("outside", violation, handled),
                            "captured" if handled else "observed")
            with self._lock:
                self.outside.append(data)
            return
        state.observed.append(_Observed(state.when, violation, handled))
        state.recording._add(violation)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        for name, module in self.integrations:
            module.instrument()
            self.instrumented.append((name, module))
        if self.enabled:
            self.previous_mode = get_mode()
            configure(mode="raise")
            _SESSIONS.append(self)
            add_sink(self.sink)

    def stop(self) -> None:
        if self.enabled:
            remove_sink(self.sink)
            if self in _SESSIONS:
                _SESSIONS.remove(self)
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

    # -- collection: validate markers -----------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(
        self, collector: pytest.Collector
    ) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
        # A bad marker is a collection error of the module (or class) that holds the test:
        # the run stops before any test, names the test and the code, in xdist workers too.
        report = yield
        if not self.enabled or not report.passed:
            return report
        problems = []
        for node in report.result:
            if isinstance(node, pytest.Item):
                try:
                    node.stash[_MARKS_KEY] = _marker_codes(node)
                except (ValueError, TypeError) as exc:
                    problems.append(f"{node.nodeid}: {exc}")
        if problems:
            report.outcome = "failed"
            report.longrepr = (
                "lora_guard: @pytest.mark.lora_guard cannot be honoured:\n  "
                + "\n  ".join(problems)
            )
        return report

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
        self.current = state
        try:
            return (yield)
        finally:
            self.current = None

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
            lines.append(_format((s, o.violation.to_dict()) for s, o in failing))
            lines.append(
                "Fix the code, or declare it: @pytest.mark.lora_guard(allow=(...)) lets a "
                "code pass, expect=(...) requires it; lora_guard.testing.assert_violations "
                "checks it inside the test."
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
            setattr(report, REPORT_ATTRIBUTE, [_as_dict(o, s) for s, o in mine])
            if report.failed and call.when not in state.failed_by_us:
                report.sections.append((
                    f"lora_guard violations ({call.when})",
                    _format((s, o.violation.to_dict()) for s, o in mine),
                ))
        return report

    # -- gathering (on the controller under xdist) ---------------------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        found = getattr(report, REPORT_ATTRIBUTE, None)
        if not found:
            return
        with self._lock:
            for v in found:
                by_test = self.totals.setdefault(v["code"], {})
                by_test.setdefault(report.nodeid, []).append(v["status"])

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None and self.outside:
            workeroutput[_WORKER_KEY] = list(self.outside)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        outside = getattr(node, "workeroutput", {}).get(_WORKER_KEY, [])
        with self._lock:
            self.outside.extend(outside)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.enabled or hasattr(self.config, "workerinput"):
            return
        for v in self.outside:
            self.totals.setdefault(v["code"], {}).setdefault(_OUTSIDE, []).append(v["status"])
        if not self.totals:
            return
        tr = terminalreporter
        tr.write_sep("=", "lora_guard summary")
        rows = [("code", "invariant", "count", "tests", "failed", "allowed")]
        for code in sorted(self.totals):
            by_test = self.totals[code]
            statuses = [s for per in by_test.values() for s in per]
            failed = statuses.count("failed")
            rows.append((code, INVARIANTS[code].slug if code in INVARIANTS else "?",
                         str(len(statuses)), str(len(by_test)), str(failed),
                         str(len(statuses) - failed)))
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
        tr.write_line(
            "allowed: by @pytest.mark.lora_guard, by lora_guard.testing, or outside tests; "
            "`lora-guard explain CODE` for fixes"
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
