"""Modes, recording and the single place where a violation is reported."""

from __future__ import annotations

import inspect
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Literal, NoReturn, overload

from lora_guard._core.catalogue import INVARIANTS
from lora_guard._core.errors import LoRAGuardWarning, Violation, error_class

__all__ = ["Mode", "Recording", "configure", "get_mode", "recording", "report"]

Mode = Literal["raise", "warn", "record", "off"]
MODES: tuple[Mode, ...] = ("raise", "warn", "record", "off")
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _State:
    """Process-wide settings, read on every guarded call, so plain attributes."""

    __slots__ = ("lock", "mode", "off", "sinks")

    def __init__(self) -> None:
        self.mode: Mode = "raise"
        self.off = False
        # Recorders and observers (the pytest plugin): everything reported goes to each.
        self.sinks: tuple[Callable[[Violation], None], ...] = ()
        self.lock = threading.Lock()


STATE = _State()


def _check_mode(mode: object, source: str) -> Mode:
    if mode not in MODES:
        raise ValueError(
            f"{source} must be one of {', '.join(map(repr, MODES))}, got {mode!r}; "
            "use 'raise' in production, 'warn' or 'record' to observe without refusing."
        )
    return mode


def configure(*, mode: Mode) -> None:
    """Set how every guard reacts to a violation, process-wide.

    ``raise`` (default) refuses the call with the invariant's error; ``warn`` issues a
    `LoRAGuardWarning` and lets the call proceed; ``record`` proceeds silently (see
    `recording`); ``off`` makes decorators applied from now on return the undecorated
    function, and turns every other guard into a pass-through. The environment variable
    ``LORA_GUARD_MODE`` sets the mode at import.

    Example:
        >>> import lora_guard as lg
        >>> lg.configure(mode="warn")
        >>> lg.get_mode()
        'warn'
        >>> lg.configure(mode="raise")
    """
    checked = _check_mode(mode, "lora_guard.configure(mode=...)")
    STATE.mode = checked
    STATE.off = checked == "off"


def get_mode() -> Mode:
    """The current mode: ``"raise"``, ``"warn"``, ``"record"`` or ``"off"``.

    Example:
        >>> import lora_guard as lg
        >>> lg.get_mode() in ("raise", "warn", "record", "off")
        True
    """
    return STATE.mode


def _mode_from_environment() -> None:
    value = os.environ.get("LORA_GUARD_MODE")
    if value is None or value == "":
        return
    try:
        configure(mode=_check_mode(value.strip().lower(), "LORA_GUARD_MODE"))
    except ValueError as exc:  # a bad variable must not stop a server from importing us
        text = f"{exc} Using 'raise'."
        try:
            warnings.warn(text, UserWarning, stacklevel=2)
        except Warning:  # python -W error: still say it, but never fail the import
            sys.stderr.write(f"lora_guard: warning: {text}\n")


class Recording(Sequence[Violation]):
    """The violations reported while a `recording` block is open, from any thread.

    A sequence, as pytest's ``recwarn``: iterate it, index it, take its ``len``; `pop`
    removes and returns the first violation of a code, `clear` forgets them all, `codes`
    lists their codes in order.

    Example:
        >>> import lora_guard as lg
        >>> lg.configure(mode="record")
        >>> with lg.recording() as rec:
        ...     lg.assert_slot_maps_consistent({"a": 0}, ["b"])
        >>> len(rec), rec[0].code, [v.code for v in rec]
        (2, 'LG201', ['LG201', 'LG201'])
        >>> rec.pop("LG201").subject
        'slot map'
        >>> rec.clear(); rec.codes
        []
        >>> lg.configure(mode="raise")
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._violations: list[Violation] = []

    def _add(self, violation: Violation) -> None:
        with self._lock:
            self._violations.append(violation)

    @property
    def violations(self) -> list[Violation]:
        """A copy of the violations so far, in the order they were reported."""
        with self._lock:
            return list(self._violations)

    @property
    def codes(self) -> list[str]:
        """The codes of `violations`, in order."""
        return [v.code for v in self.violations]

    def __len__(self) -> int:
        with self._lock:
            return len(self._violations)

    @overload
    def __getitem__(self, index: int) -> Violation: ...

    @overload
    def __getitem__(self, index: slice) -> list[Violation]: ...

    def __getitem__(self, index: int | slice) -> Violation | list[Violation]:
        with self._lock:
            return self._violations[index]

    def __iter__(self) -> Iterator[Violation]:
        return iter(self.violations)  # a snapshot: other threads may add while you iterate

    def pop(self, code: str | None = None) -> Violation:
        """Remove and return the first violation of ``code`` (of any code if None).

        Raises `AssertionError` naming the codes recorded when there is none, as
        ``recwarn.pop`` does; `ValueError` for a string that is not a lora_guard code.
        """
        __tracebackhide__ = True
        if code is not None and code not in INVARIANTS:
            raise ValueError(
                f"Recording.pop(code=...): {code!r} is not a lora_guard code; "
                f"valid codes: {', '.join(INVARIANTS)}"
            )
        with self._lock:
            for i, v in enumerate(self._violations):
                if code is None or v.code == code:
                    return self._violations.pop(i)
            seen = [v.code for v in self._violations]
        wanted = "a violation" if code is None else f"a {code} violation"
        raise AssertionError(f"{wanted} was not recorded; recorded: {seen or 'nothing'}")

    def clear(self) -> None:
        """Forget every violation recorded so far."""
        with self._lock:
            self._violations.clear()

    def __repr__(self) -> str:
        return f"<Recording {self.codes}>"


def add_sink(sink: Callable[[Violation], None]) -> None:
    with STATE.lock:
        STATE.sinks = (*STATE.sinks, sink)


def remove_sink(sink: Callable[[Violation], None]) -> None:
    with STATE.lock:
        sinks = list(STATE.sinks)
        if sink in sinks:
            sinks.remove(sink)
        STATE.sinks = tuple(sinks)


@contextmanager
def recording() -> Iterator[Recording]:
    """Collect every violation raised or observed inside the block, from any thread.

    Works in every mode but ``off``; in ``raise`` mode the errors still propagate (and are
    recorded even when the code under the block catches them).

    Example:
        >>> import lora_guard as lg
        >>> lg.configure(mode="record")
        >>> with lg.recording() as rec:
        ...     lg.assert_slot_maps_consistent({"a": 0}, {0: "b"})
        >>> rec.codes   # 'a' -> 0 but 0 holds 'b'; and 'b' sits in 0 but maps nowhere
        ['LG201', 'LG201']
        >>> lg.configure(mode="raise")
    """
    rec = Recording()
    add_sink(rec._add)
    try:
        yield rec
    finally:
        remove_sink(rec._add)


def _is_ours(filename: str) -> bool:
    return filename.startswith("<lora_guard") or os.path.dirname(
        os.path.abspath(filename)).startswith(_PACKAGE_DIR)


def _caller() -> tuple[str, int]:
    """Where the user's code hit the guard (``file:line in function``), and the stacklevel
    that points a warning there: the first frame outside lora_guard and its generated code."""
    here = inspect.currentframe()
    frame = here.f_back if here is not None else None
    depth = 1
    while frame is not None and _is_ours(frame.f_code.co_filename):
        frame = frame.f_back
        depth += 1
    if frame is None:
        return "", 2
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}", depth


def _observe(violations: Sequence[Violation]) -> tuple[list[Violation], int]:
    """Stamp where the user's code hit the guard and feed every sink (recorders, plugin)."""
    location, stacklevel = _caller()
    stamped = [v if v.location else replace(v, location=location) for v in violations]
    for sink in STATE.sinks:
        for v in stamped:
            sink(v)
    return stamped, stacklevel  # counted from _observe; its caller is one frame less


def report(violations: Sequence[Violation]) -> None:
    """Report violations according to the mode; raises in ``raise`` mode.

    Every guard ends here, so the mode, the recorders and the pytest plugin see one stream.
    """
    if STATE.off or not violations:
        return
    stamped, stacklevel = _observe(violations)
    if STATE.mode == "raise":
        raise error_class(stamped[0].code)(stamped)
    if STATE.mode == "warn":
        for v in stamped:
            warnings.warn(LoRAGuardWarning(v), stacklevel=stacklevel - 1)


def refuse(violations: Sequence[Violation]) -> NoReturn:
    """Raise regardless of mode: for calls that cannot return anything useful otherwise."""
    stamped, _ = _observe(violations)
    raise error_class(stamped[0].code)(stamped)


_mode_from_environment()
