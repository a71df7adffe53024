"""Griffe extension for the API reference: render ``Example:`` sections as examples.

lora_guard's docstrings are Google style with an ``Example:`` section of doctest lines (the
section pytest runs with ``--doctest-modules``). Griffe's Google parser knows ``Examples:``
(plural) as the examples section and would render ``Example:`` as an admonition whose ``>>>``
lines become nested block quotes; this extension renames the section before parsing, so the
examples render as highlighted Python sessions.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(?P<indent>[ \t]*)Example:[ \t]*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Rename a docstring's ``Example:`` section to ``Examples:``."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        docstring = obj.docstring
        if docstring is not None and "Example:" in docstring.value:
            docstring.value = _EXAMPLE.sub(r"\g<indent>Examples:", docstring.value)
