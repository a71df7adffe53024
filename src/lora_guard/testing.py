"""Helpers for your own tests: capture and assert violations, write real adapters.

Import it in tests, not in servers (as ``structlog.testing``). It works with or without
pytest: `capture_violations` and `assert_violations` are plain context managers,
`AdapterFactory` writes PEFT-format adapter folders into a directory you give it.

Under ``pytest --lora-guard`` a violation observed inside `capture_violations` or
`assert_violations` counts as handled by the test: it does not fail the test (the plugin's
summary still counts it, as ``captured``).

Example:
    >>> import lora_guard as lg
    >>> from lora_guard.testing import assert_violations
    >>> with assert_violations("LG201") as seen:
    ...     lg.assert_slot_maps_consistent({"a": 0}, ["b"])
    >>> seen.codes
    ['LG201', 'LG201']
"""

from __future__ import annotations

import contextvars
import itertools
import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._core.catalogue import INVARIANTS
from ._core.codes import check_codes
from ._core.config import Recording, add_sink, remove_sink
from ._core.errors import LoRAGuardError

if TYPE_CHECKING:  # re-exported lazily, see __getattr__: the writer imports heavier things
    from ._testing.adapter_writer import DEFECTS, write_adapter

__all__ = [
    "DEFECTS",
    "AdapterFactory",
    "assert_violations",
    "capture_violations",
    "check_codes",
    "write_adapter",
]

# Captures open right now, in any thread, each with the context it was opened in. The pytest
# plugin reads it: what a capture sees, the test that opened it has handled (the context says
# which test: a capture left open by one test, in a thread of its own, handles nothing of the
# next test's).
_ACTIVE: list[tuple[Recording, contextvars.Context]] = []
_ACTIVE_LOCK = threading.Lock()


def __getattr__(name: str) -> Any:
    if name in ("write_adapter", "DEFECTS"):
        from ._testing import adapter_writer as _adapter_writer

        return getattr(_adapter_writer, name)
    raise AttributeError(f"module 'lora_guard.testing' has no attribute {name!r}")


@contextmanager
def capture_violations() -> Iterator[Recording]:
    """Collect every violation reported inside the block, from any thread, as handled.

    Like `lora_guard.recording`, but it also tells ``pytest --lora-guard`` that the test
    looks at these violations itself, so they do not fail the test. Exceptions are not
    suppressed: in ``raise`` mode wrap the call in ``pytest.raises`` or use
    `assert_violations`.

    Example:
        >>> import lora_guard as lg
        >>> from lora_guard.testing import capture_violations
        >>> with capture_violations() as seen:
        ...     try:
        ...         lg.assert_slot_maps_consistent({"a": 1}, ["a", None])
        ...     except lg.RegistryError:
        ...         pass          # as a server's own try/except would
        >>> seen.codes
        ['LG201', 'LG201']
    """
    rec = Recording()
    entry = (rec, contextvars.copy_context())
    with _ACTIVE_LOCK:
        _ACTIVE.append(entry)
    add_sink(rec._add)
    try:
        yield rec
    finally:
        remove_sink(rec._add)
        with _ACTIVE_LOCK:
            _ACTIVE.remove(entry)


@contextmanager
def assert_violations(codes: str | Iterable[str], *, only: bool = True) -> Iterator[Recording]:
    """Assert that the block reports each of ``codes`` (and, with ``only``, nothing else).

    A lora_guard error raised in the block whose codes are all in ``codes`` is suppressed
    (as ``pytest.raises`` would), so the same test works in every mode but ``off``; one
    about another code fails the assertion, which names it. Any other exception propagates.
    The recording yielded holds every violation seen, for checks on messages and details.
    Pass ``codes=()`` to assert that nothing was reported.

    Raises:
        ValueError: at entry, for an unknown code (before the block runs).
        AssertionError: at exit, naming the codes missing or unexpected and what was seen.

    Example:
        >>> import lora_guard as lg
        >>> from lora_guard.testing import assert_violations
        >>> with assert_violations("LG201") as seen:
        ...     lg.assert_slot_maps_consistent({"a": 0}, ["b"])
        >>> "adapter 'a' maps to slot 0, but slot 0 holds 'b'" in seen.violations[0].message
        True
        >>> with assert_violations("LG003"):
        ...     lg.assert_slot_maps_consistent({"a": 0}, ["b"])
        Traceback (most recent call last):
        ...
        AssertionError: expected LG003 (cache-key-collision) but it was not reported; ...
    """
    __tracebackhide__ = True  # pytest shows the user's block, not this helper
    expected = check_codes(codes, where="assert_violations(codes)")
    if not isinstance(only, bool):
        raise TypeError(f"assert_violations(only=...) must be True or False, got {only!r}")
    wanted = set(expected)
    raised: LoRAGuardError | None = None
    with capture_violations() as rec:
        try:
            yield rec
        except LoRAGuardError as exc:  # expected: suppressed; otherwise the assertion says it
            raised = exc
    seen = rec.codes
    problems = []
    missing = [c for c in expected if c not in seen]
    if missing:
        problems.append(
            "expected " + ", ".join(f"{c} ({INVARIANTS[c].slug})" for c in missing)
            + " but it was not reported"
        )
    extra = sorted({c for c in seen if c not in wanted}) if only else []
    if extra:
        problems.append("unexpected " + ", ".join(f"{c} ({INVARIANTS[c].slug})" for c in extra))
    if problems:
        lines = [str(v) for v in rec.violations] or ["nothing"]
        raise AssertionError(
            "; ".join(problems) + "; reported in the block:\n  " + "\n  ".join(lines)
        ) from raised
    if raised is not None and not wanted.issuperset(v.code for v in raised.violations):
        raise raised  # only=False and the error is about a code not asked for


class AdapterFactory:
    """Write real PEFT-format adapter folders into one directory: ``make_adapter``'s engine.

    Call it with ``write_adapter``'s keyword arguments (``rank``, ``targets``, ``layers``,
    ``dtype``, ``moe_layout``, ``defects`` ...); each call writes a new folder and returns
    its path. Without ``name``, folders are named ``adapter0``, ``adapter1``, ... A name
    already used in the directory is refused, so one test cannot overwrite its own adapter.

    Example:
        >>> import tempfile
        >>> from lora_guard.testing import AdapterFactory
        >>> make_adapter = AdapterFactory(tempfile.mkdtemp())
        >>> path = make_adapter(rank=4)
        >>> path.name, sorted(p.name for p in path.iterdir())
        ('adapter0', ['adapter_config.json', 'adapter_model.safetensors'])
        >>> make_adapter(name="adapter0")
        Traceback (most recent call last):
        ...
        FileExistsError: make_adapter: ...adapter0 already exists; pass another name=...
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        """Where the folders are written."""
        self.made: list[Path] = []
        """The folders written so far, in order."""
        self._counter = itertools.count()

    def __call__(self, name: str | None = None, **options: Any) -> Path:
        """Write one adapter folder under `directory`; return its path."""
        from ._testing.adapter_writer import write_adapter

        if name is None:
            while True:
                name = f"adapter{next(self._counter)}"
                if not (self.directory / name).exists():
                    break
        elif not isinstance(name, str) or not name or Path(name).name != name:
            raise ValueError(
                f"make_adapter(name=...) must be a plain folder name such as 'a', got {name!r}"
            )
        path = self.directory / name
        if path.exists():
            raise FileExistsError(
                f"make_adapter: {path} already exists; pass another name=... "
                "(or omit name to get adapter0, adapter1, ...)"
            )
        written = Path(write_adapter(path, **options))
        self.made.append(written)
        return written

    def __repr__(self) -> str:
        return f"<AdapterFactory {str(self.directory)!r}: {len(self.made)} written>"
