"""The state the light pytest11 module and the plugin's work share: the enabled sessions and
the validated ``lora_guard`` markers of each test. It imports pytest and nothing else at import
time (the catalogue's code check only when a marker is read), so the pytest11 module, which
every pytest run loads, may import it when it meets a ``lora_guard`` marker; the plugin
imports it too, and never imports the pytest11 module (no import cycle).

A nested in-process run (pytester) finds this module already imported when the outer run is
enabled or has read a marker, and so the same list of sessions; otherwise the nested run
imports its own copy together with its own plugin, and the two agree.
"""

from __future__ import annotations

import pytest

__all__ = ["MARKS_KEY", "SESSIONS", "marker_codes"]

# The enabled sessions of this process, innermost last; see lora_guard._frontends.plugin;
# only the innermost one observes.
SESSIONS: list[object] = []
# allow/expect of each item's lora_guard markers, validated at collection.
MARKS_KEY = pytest.StashKey[tuple[frozenset[str], frozenset[str]]]()


def marker_codes(item: pytest.Item) -> tuple[frozenset[str], frozenset[str]]:
    """``allow`` and ``expect`` of every ``lora_guard`` marker on the item; ValueError if bad."""
    from lora_guard._core.codes import check_codes  # the catalogue only: no torch, no guard

    allow: set[str] = set()
    expect: set[str] = set()
    for mark in item.iter_markers("lora_guard"):
        if mark.args:
            raise ValueError(
                f"@pytest.mark.lora_guard takes keywords only, got positional {mark.args!r}; "
                "write @pytest.mark.lora_guard(allow=('LG003',), expect=('LG001',))"
            )
        unknown = sorted(set(mark.kwargs) - {"allow", "expect", "reason"})
        if unknown:
            raise ValueError(
                f"@pytest.mark.lora_guard: unknown keyword(s) {unknown}; it takes allow=(...) "
                "(codes that may occur), expect=(...) (codes that must occur) and reason=..."
            )
        for key, target in (("allow", allow), ("expect", expect)):
            if key in mark.kwargs:
                target.update(check_codes(
                    mark.kwargs[key], where=f"@pytest.mark.lora_guard({key}=...)"))
    return frozenset(allow), frozenset(expect)
