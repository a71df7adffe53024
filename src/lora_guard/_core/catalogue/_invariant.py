"""`Invariant`: one entry of the catalogue, and `entry`, which each code's module calls."""

from __future__ import annotations

import string
import types
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["Invariant", "entry", "fix_as_documented"]


@dataclass(frozen=True)
class Invariant:
    """One invariant of LoRA serving, as the catalogue `lora_guard.INVARIANTS` holds it.

    Example:
        >>> import lora_guard as lg
        >>> inv = lg.INVARIANTS["LG001"]
        >>> inv.slug
        'pool-shape-drift'
        >>> inv.hint == inv.fixes[0]
        True
    """

    code: str
    """Stable code, ``LG`` and three digits; never renumbered."""
    slug: str
    """Short kebab-case name, also ``error.invariant``."""
    title: str
    """One line for tables and summaries."""
    summary: str
    """What the invariant guards and why breaking it hurts."""
    triggers: tuple[str, ...]
    """The calls or inputs that break it."""
    fixes: tuple[str, ...]
    """Ways to fix it, the most common first; ``fixes[0]`` is the hint."""
    error: str
    """Name of the exception class that raises it."""
    messages: Mapping[str, str]
    """Message templates by variant, formatted with ``subject`` and the violation's details."""
    situations: tuple[str, ...] = ()
    """Situations in the field that usually lead to it."""
    example: str = ""
    """A before/after fix, as code."""
    raised_by: tuple[str, ...] = ()
    """The guards, checks and integrations that report it."""
    variant_fixes: Mapping[str, int] = field(default_factory=dict)
    """For a message variant whose best fix is not the first: variant -> index in `fixes`."""
    docs: str = field(default="")
    """Anchor of its section in the invariants reference."""
    severity: str = "error"
    """``error``: a violation fails ``lora-guard check`` (exit 1) and raises in ``raise``
    mode. Every built-in code is an error (SARIF's ``level`` and ``lora-guard codes`` show it)."""

    @property
    def hint(self) -> str:
        """The first fix, one line."""
        return self.fixes[0]

    def hint_for(self, variant: str) -> str:
        """The fix that fits a message variant best (the first fix unless the entry says)."""
        return self.fixes[self.variant_fixes.get(variant, 0)]

    def explain(self) -> str:
        """The whole entry as Markdown: what ``lora-guard explain`` prints and the docs show.

        Example:
            >>> import lora_guard as lg
            >>> print(lg.INVARIANTS["LG003"].explain().splitlines()[0])
            ## LG003 cache-key-collision: One cache key maps to tensors of different shape or dtype
        """
        def bullets(items: tuple[str, ...]) -> str:
            return "\n".join(f"- {item}" for item in items)

        parts = [
            f"## {self.code} {self.slug}: {self.title}",
            f"Raised as `lora_guard.{self.error}`.",
            self.summary,
            f"**When it happens**\n\n{bullets(self.triggers)}",
        ]
        if self.situations:
            parts.append(f"**Common situations**\n\n{bullets(self.situations)}")
        parts.append(
            "**How to fix it**\n\n"
            + "\n".join(f"{i}. {fix_as_documented(fix)}" for i, fix in enumerate(self.fixes, 1))
        )
        if self.example:
            parts.append(f"**Example**\n\n```python\n{self.example.rstrip()}\n```")
        parts.append(
            "**What you see**\n\n"
            + "\n".join(f"- ``{text}``" for text in dict.fromkeys(self.messages.values()))
        )
        if self.raised_by:
            parts.append("**Reported by**: " + ", ".join(f"`{r}`" for r in self.raised_by))
        return "\n\n".join(parts) + "\n"


def fix_as_documented(fix: str) -> str:
    """A fix template as the docs show it: ``{allow_name}`` as ``<allow_name>``."""
    if "{" not in fix:
        return fix
    try:
        parts = list(string.Formatter().parse(fix))
    except ValueError:
        return fix
    return "".join(text + (f"<{name}>" if name is not None else "")
                   for text, name, _, _ in parts)


def entry(**kwargs: object) -> Invariant:
    """An `Invariant` from its fields as keywords: ``docs`` defaults to the code's section
    of the invariants reference, ``messages`` is frozen."""
    code = str(kwargs["code"])
    kwargs.setdefault("docs", f"reference/invariants.md#{code.lower()}")
    messages = kwargs["messages"]
    assert isinstance(messages, dict)
    kwargs["messages"] = types.MappingProxyType(messages)
    return Invariant(**kwargs)  # type: ignore[arg-type]
