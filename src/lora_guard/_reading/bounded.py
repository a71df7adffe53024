"""`Bounded`: the one cache type of the reader and the checker, least recently used out.

Every memory the reader and the checker keep across adapters is a `Bounded` with a size and
a sentence that says what it bounds; `forget_all` empties every one of them (benchmarks
measure a first read with it; nothing else needs it, since an entry is only ever reused for
the same key, and a key is the bytes or the values the entry was computed from).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

__all__ = ["Bounded", "ValueKey", "caches", "forget_all"]

K = TypeVar("K")
V = TypeVar("V")

_MISSING: Any = object()
_ALL: weakref.WeakSet[Bounded[object, object]] = weakref.WeakSet()
_ALL_LOCK = threading.Lock()
"""Held to add to `_ALL` and to list it: a run in one thread makes its caches while another
lists them (a set that grows while it is listed raises)."""


class Bounded(Generic[K, V]):
    """At most ``size`` entries; a new one pushes out the least recently used.

    ``what`` says what the cache holds and why it is bounded at ``size`` (shown by
    ``repr``, listed in the performance page).

    Example:
        >>> from lora_guard._reading.bounded import Bounded
        >>> squares = Bounded[int, int](2, "squares of small numbers (an example)")
        >>> squares.get_or_make(3, lambda: 9), squares.get_or_make(4, lambda: 16)
        (9, 16)
        >>> _ = squares.get(3)  # 3 used: 4 is now the least recently used
        >>> _ = squares.get_or_make(5, lambda: 25)
        >>> squares.get(4) is None, len(squares)
        (True, 2)
    """

    __slots__ = ("__weakref__", "_entries", "size", "what")

    def __init__(self, size: int, what: str) -> None:
        if size < 1:
            raise ValueError(f"Bounded(size=...) takes a positive size, got {size!r}")
        self.size = size
        self.what = what
        self._entries: OrderedDict[K, V] = OrderedDict()
        with _ALL_LOCK:
            _ALL.add(self)  # type: ignore[arg-type]

    # Threads share these caches (an engine's loads, a checker's workers) and take no lock:
    # another thread may push an entry out between two steps of one call (found, then marked
    # used; put, then the oldest dropped). That entry's value is still right, so each step
    # that finds its key gone lets it go.

    def get(self, key: K) -> V | None:
        """The entry of ``key`` (now the most recently used), or None."""
        value = self._found(key)
        return None if value is _MISSING else value

    def put(self, key: K, value: V) -> V:
        """Remember ``value`` for ``key`` (the least recently used entry goes when full)."""
        entries = self._entries
        entries[key] = value
        try:
            entries.move_to_end(key)
            while len(entries) > self.size:
                entries.popitem(last=False)
        except KeyError:  # another thread pushed it out, or emptied the cache, meanwhile
            pass
        return value

    def get_or_make(self, key: K, make: Callable[[], V]) -> V:
        """The entry of ``key``, made by ``make()`` and remembered when there is none (an
        exception from ``make`` is raised and nothing is remembered; None is an entry)."""
        value = self._found(key)
        return self.put(key, make()) if value is _MISSING else value

    def _found(self, key: K) -> Any:
        """The entry of ``key``, now the most recently used, or `_MISSING`."""
        value = self._entries.get(key, _MISSING)
        if value is not _MISSING:
            try:  # noqa: SIM105 (contextlib.suppress costs a call on every hit)
                self._entries.move_to_end(key)
            except KeyError:  # pushed out by another thread since: the value still stands
                pass
        return value

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Bounded({len(self._entries)}/{self.size}: {self.what})"


class ValueKey:
    """A key made of a value that is costly to hash (a header's tensor entries): hashed once,
    when it is made, instead of at each look-up (`Bounded.get_or_make` looks a key up twice:
    to find the entry and to mark it used). Equal when the values are equal.

    Example:
        >>> from lora_guard._reading.bounded import ValueKey
        >>> ValueKey((("a", 1), ("b", 2))) == ValueKey((("a", 1), ("b", 2)))
        True
        >>> len({ValueKey((1, 2)), ValueKey((1, 2)), ValueKey((2, 1))})
        2
    """

    __slots__ = ("_hash", "value")

    def __init__(self, value: Hashable) -> None:
        self.value = value
        self._hash = hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return (type(other) is ValueKey and self._hash == other._hash
                and self.value == other.value)

    def __repr__(self) -> str:
        return f"ValueKey({self.value!r})"

    def __reduce__(self) -> tuple[type[ValueKey], tuple[Hashable]]:
        return ValueKey, (self.value,)  # hashed again where it is unpickled (str hashes differ)


def caches() -> list[Bounded[Any, Any]]:
    """Every live `Bounded` cache of the process (the reader's, the checker's of a run in
    progress), for a look at what is remembered and how much."""
    with _ALL_LOCK:
        return list(_ALL)


def forget_all() -> None:
    """Empty every `Bounded` cache of the process."""
    for cache in caches():
        cache.clear()
