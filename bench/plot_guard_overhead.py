"""Plot guard overhead from the guard benchmark's own output.

    python bench/bench_guards.py --json bench/guard_overhead.json
    python bench/plot_guard_overhead.py bench/guard_overhead.json

reads ``{"rows": [{"group": ..., "name": ..., "ns_per_call": ...}, ...]}`` (``group`` and a
``meta`` mapping optional) and writes ``docs/assets/guard_overhead.png`` (``--out`` to change
it): one panel per group, one bar per row, nanoseconds per call on a shared log scale,
coloured by what the row measures (no check, hand-written checks, lora_guard, jaxtyping with
beartype, other wrappers), each labelled with its time and its ratio to the group's row that
does no check.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "assets" / "guard_overhead.png"

# (category, colour, words that put a row in it), first match wins; the rest is lora_guard.
CATEGORIES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("no check", "#9e9e9e", ("plain", "no check", "unguarded", "baseline", "dict.get")),
    ("hand-written checks", "#4caf50", ("hand",)),
    ("jaxtyping + beartype", "#e53935", ("jaxtyping", "beartype")),
    ("other wrappers", "#8d6e63", ("wrapt", "functools")),
)
LORA_GUARD = ("lora_guard", "#3f51b5")


@dataclass(frozen=True)
class Row:
    """One benchmark row."""

    group: str
    name: str
    ns: float


def category(name: str) -> tuple[str, str]:
    """The (category, colour) of a benchmark row, from its name."""
    lowered = name.lower()
    for label, colour, words in CATEGORIES:
        if any(word in lowered for word in words):
            return label, colour
    return LORA_GUARD


def read_rows(path: Path) -> list[Row]:
    """The rows of a benchmark JSON file; ValueError says what is wrong with it."""
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise ValueError(
            f'{path}: expected {{"rows": [{{"name": ..., "ns_per_call": ...}}, ...]}} as written '
            "by bench/bench_guards.py --json FILE"
        )
    out = []
    for i, row in enumerate(rows):
        name = row.get("name") if isinstance(row, dict) else None
        ns = row.get("ns_per_call") if isinstance(row, dict) else None
        if not isinstance(name, str) or isinstance(ns, bool) or not isinstance(ns, (int, float)):
            raise ValueError(
                f"{path}: row {i} must have a string 'name' and a number 'ns_per_call', got {row!r}"
            )
        if not math.isfinite(ns) or ns <= 0:
            raise ValueError(f"{path}: row {i} ({name}) has ns_per_call {ns}; expected > 0")
        group = row.get("group")
        out.append(Row(group if isinstance(group, str) else "", name, float(ns)))
    return out


def plot(rows: list[Row], out: Path, *, title: str = "Cost of a guarded call") -> Path:
    """One panel per group of rows, bars on a shared log scale; save a PNG to ``out``.

    In each panel, every bar is labelled with its time and, when the panel has a row that
    does no check (the plain call, ``dict.get``), its ratio to that row.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.group, []).append(row)
    lo = min(r.ns for r in rows) / 2
    hi = max(r.ns for r in rows) * 20
    heights = [len(g) + 0.8 for g in groups.values()]
    fig, axes = plt.subplots(
        len(groups), 1, figsize=(10, 0.42 * sum(heights) + 1.4), dpi=120, sharex=True,
        gridspec_kw={"height_ratios": heights}, squeeze=False,
    )
    legend: dict[str, str] = {}
    for ax, (group, members) in zip(axes[:, 0], groups.items(), strict=True):
        cats = [category(r.name) for r in members]
        base = next(
            (r.ns for r, (label, _) in zip(members, cats, strict=True) if label == "no check"),
            None,
        )
        y = list(range(len(members)))[::-1]  # first row at the top
        ax.barh(y, [r.ns for r in members], color=[c for _, c in cats], height=0.62)
        ax.set_yticks(y, [r.name for r in members], fontsize=8)
        ax.set_ylim(-0.6, len(members) - 0.4)
        if group:
            ax.set_title(group, fontsize=9, loc="left")
        ax.grid(axis="x", which="major", alpha=0.3)
        for yi, r in zip(y, members, strict=True):
            label = f"{r.ns:,.0f} ns"
            if base is not None and r.ns != base:
                label += f"  ({r.ns / base:,.1f}x)"
            ax.text(r.ns * 1.1, yi, label, va="center", fontsize=7.5)
        for label, colour in cats:
            legend.setdefault(label, colour)
    last = axes[-1, 0]
    last.set_xscale("log")
    last.set_xlim(lo, hi)
    last.set_xlabel("nanoseconds per call, log scale (lower is better); (Nx) = N times no check")
    fig.suptitle(title, fontsize=11)
    fig.legend(
        handles=[Patch(color=c, label=lbl) for lbl, c in legend.items()],
        loc="lower center", ncol=len(legend), fontsize=8, frameon=False,
    )
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="the JSON written by bench_guards.py --json")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"the PNG to write (default: {DEFAULT_OUT.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    try:
        rows = read_rows(args.results)
    except ValueError as exc:
        parser.error(str(exc))  # exit status 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        parser.error("matplotlib is missing: pip install -e '.[bench]'")
    data = json.loads(args.results.read_text(encoding="utf-8"))
    meta = data.get("meta") if isinstance(data.get("meta"), dict) else {}
    title = "Cost of a guarded call"
    if meta:
        title += " (" + ", ".join(
            f"{k} {meta[k]}" for k in ("python", "torch", "machine") if k in meta
        ) + ")"
    written = plot(rows, args.out, title=title)
    print(f"wrote {written} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
