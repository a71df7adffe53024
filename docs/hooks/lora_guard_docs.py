"""MkDocs hook: pages generated from the package itself, in the repository and at build time.

Each generated part of a page sits between an opening and a closing marker
(``<!-- lora-guard: NAME -->`` ... ``<!-- /lora-guard: NAME -->``). In the repository the part
holds plain Markdown that reads without a site build (the invariants' full text, the table of
codes, a table of every public name and submodule); ``python docs/hooks/lora_guard_docs.py``
rewrites it (``tests/test_docs.py`` fails, naming that command, when a page is out of date).
At build time the part is rendered again, the API and modules parts as mkdocstrings blocks:

- ``<!-- lora-guard: invariants -->`` becomes one section per code of ``lora_guard.INVARIANTS``,
  each the text of ``Invariant.explain()`` (what ``lora-guard explain CODE`` prints), under a
  heading anchored at the lower-case code (``#lg001``), which is what each entry's ``docs``
  field points at.
- ``<!-- lora-guard: api -->`` becomes the API reference: a mkdocstrings block for every name in
  ``lora_guard.__all__``, grouped by topic; a name no group knows yet still gets its block
  under "More", so a new public name can never be missing from the reference.
- ``<!-- lora-guard: modules -->`` becomes a block per public submodule that exists
  (``lora_guard.testing``, ``lora_guard.strategies``, the integrations).
- ``<!-- lora-guard: codes -->`` becomes the overview's table of every code: its title and
  what reports it (``Invariant.raised_by``).

``tests/test_docs.py`` imports this module to check the rendered text.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import re
import sys
from pathlib import Path
from typing import Any

_SRC = Path(__file__).resolve().parents[2] / "src"

_ROOT = Path(__file__).resolve().parents[2]
INVARIANTS_MARKER = "<!-- lora-guard: invariants -->"
API_MARKER = "<!-- lora-guard: api -->"
MODULES_MARKER = "<!-- lora-guard: modules -->"
CODES_MARKER = "<!-- lora-guard: codes -->"
GENERATED_PAGES = ("docs/index.md", "docs/reference/invariants.md", "docs/reference/api.md",
                   "docs/reference/modules.md")
"""The pages whose generated parts are kept in the repository."""

# Topic -> (introduction, names). Names not (yet) in lora_guard.__all__ are skipped; names in
# __all__ that no topic lists go under "More".
API_GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "Guarding pools: shapes frozen at first allocation",
        "Declare each tensor argument's dims; freeze the pool's dims at the first call (LG001, "
        "LG004).",
        ("shapes", "frozen_dims", "unfreeze"),
    ),
    (
        "Guarding adapter loads: one MoE layout per pool",
        "Classify MoE adapters and keep one layout per pool (LG002).",
        ("MoELayout", "detect_moe_layout", "LayoutRegistry", "guard_adapter_load"),
    ),
    (
        "Guarding weight caches",
        "Cache keys that cannot collide (LG003).",
        ("GuardedCache", "guard_cache_lookup", "weight_cache_key"),
    ),
    (
        "Predicates for custom servers",
        "Each invariant as a plain function that returns a bool and raises nothing, plus the "
        "slot-map assertion. Names follow one rule: a predicate returns a bool, a `check_*` "
        "returns a report, an `assert_*` raises (through the mode), a `guard_*` is a "
        "decorator.",
        (
            "pool_shapes_stable",
            "layouts_uniform",
            "cache_entry_matches",
            "shapes_conform",
            "slot_maps_consistent",
            "assert_slot_maps_consistent",
            "check_slot_maps",
            "is_lora_guard_error",
        ),
    ),
    (
        "Adapters on disk",
        "Read adapters from their headers only and check them against what a server serves "
        "(LG101-LG110).",
        (
            "inspect_adapter",
            "AdapterSpec",
            "LoRAModuleSpec",
            "TensorInfo",
            "ServingLimits",
            "check_adapters",
            "check_adapter",
            "Report",
            "adapter_servable",
        ),
    ),
    (
        "Tensor-parallel ranks",
        "Compare pool state across `torch.distributed` ranks (LG301).",
        ("assert_rank_consistent", "guard_rank_consistency", "rank_fingerprint",
         "rank_consistent"),
    ),
    (
        "Modes and recording",
        "How every guard reacts to a violation, and how to collect what was observed.",
        ("configure", "get_mode", "recording", "Recording"),
    ),
    (
        "Errors, warnings and violations",
        "Every error is a `LoRAGuardError` and also the builtin class engines raise.",
        (
            "Violation",
            "LoRAGuardError",
            "PoolShapeDriftError",
            "MixedMoELayoutError",
            "CacheKeyCollisionError",
            "ShapeContractError",
            "AdapterError",
            "RegistryError",
            "RankDivergenceError",
            "LoRAGuardWarning",
        ),
    ),
    (
        "The catalogue",
        "The single source of every code's text; see the [invariants reference](invariants.md).",
        ("INVARIANTS", "Invariant"),
    ),
)

PUBLIC_MODULES: tuple[str, ...] = (
    "lora_guard.testing",
    "lora_guard.strategies",
    "lora_guard.integrations",
    "lora_guard.integrations.peft",
    "lora_guard.integrations.sglang",
    "lora_guard.integrations.vllm",
)


def _lora_guard() -> Any:
    try:
        return importlib.import_module("lora_guard")
    except ImportError:  # building from a checkout without an installed package
        sys.path.insert(0, str(_SRC))
        return importlib.import_module("lora_guard")


def render_invariants() -> str:
    """Every invariant: a table of codes, then each code's `explain()` under its own anchor."""
    lg = _lora_guard()
    rows = [
        "| code | slug | raised as | what it guards |",
        "|---|---|---|---|",
    ]
    for inv in lg.INVARIANTS.values():
        rows.append(
            f"| [{inv.code}](#{inv.code.lower()}) | `{inv.slug}` | `{inv.error}` | {inv.title} |"
        )
    sections = ["\n".join(rows)]
    for inv in lg.INVARIANTS.values():
        text = inv.explain()
        heading, _, rest = text.partition("\n")
        if not heading.startswith("## "):
            raise ValueError(f"{inv.code}: explain() must start with a '## ' heading")
        sections.append(f"{heading} {{ #{inv.code.lower()} }}\n{rest}")
    return "\n\n".join(sections) + "\n"


def api_names() -> list[tuple[str, str, list[str]]]:
    """The API reference's topics, each with the names of ``lora_guard.__all__`` it documents."""
    public = list(_lora_guard().__all__)
    placed: set[str] = set()
    groups: list[tuple[str, str, list[str]]] = []
    for title, intro, names in API_GROUPS:
        present = [n for n in names if n in public]
        placed.update(present)
        if present:
            groups.append((title, intro, present))
    rest = [n for n in public if n not in placed]
    if rest:
        groups.append(("More", "Other public names.", rest))
    return groups


def _first_line(obj: Any) -> str:
    import inspect

    doc = inspect.getdoc(obj) or ""
    first = doc.split("\n\n")[0].replace("\n", " ").strip()
    return first.replace("|", "\\|")


def _kind(obj: Any) -> str:
    import inspect

    if inspect.isclass(obj):
        return "exception" if issubclass(obj, BaseException) else "class"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return "function"
    return "function" if callable(obj) else "constant"


def render_api_source() -> str:
    """The API reference as it reads in the repository: per topic, a table of its names."""
    lg = _lora_guard()
    parts = []
    for title, intro, names in api_names():
        rows = ["| name | kind | what it does |", "|---|---|---|"]
        rows += [f"| `lg.{n}` | {_kind(getattr(lg, n))} | {_first_line(getattr(lg, n))} |"
                 for n in names]
        parts.append(f"## {title}\n\n{intro}\n\n" + "\n".join(rows))
    return "\n\n".join(parts) + "\n"


def render_modules_source() -> str:
    """The modules reference as it reads in the repository: each module's first paragraph."""
    parts = []
    for name in public_modules():
        try:
            module = importlib.import_module(name)
        except ImportError:  # an optional dependency is missing: named, not described
            parts.append(f"## `{name}`")
            continue
        parts.append(f"## `{name}`\n\n{_first_line(module)}")
    return "\n\n".join(parts) + "\n" if parts else "No public submodules yet.\n"


def render_codes() -> str:
    """The overview's table: every code, what goes wrong, and what reports it."""
    lg = _lora_guard()
    rows = ["| code | what goes wrong | reported by |", "|---|---|---|"]
    for inv in lg.INVARIANTS.values():
        by = ", ".join(f"`{r}`" for r in inv.raised_by) or "-"
        rows.append(f"| [{inv.code}](reference/invariants.md#{inv.code.lower()}) | "
                    f"{inv.title} | {by} |")
    return "\n".join(rows) + "\n"


def render_api() -> str:
    """A mkdocstrings block per public name, grouped by topic."""
    parts = []
    for title, intro, names in api_names():
        parts.append(f"## {title}\n\n{intro}")
        parts.extend(f"::: lora_guard.{name}" for name in names)
    return "\n\n".join(parts) + "\n"


def public_modules() -> list[str]:
    """The public submodules that exist in this checkout."""
    _lora_guard()
    found = []
    for name in PUBLIC_MODULES:
        try:
            if importlib.util.find_spec(name) is not None:
                found.append(name)
        except ModuleNotFoundError:
            continue
    return found


def render_modules() -> str:
    """A mkdocstrings block per public submodule."""
    modules = public_modules()
    if not modules:
        return "No public submodules yet.\n"
    return "\n\n".join(
        f"## `{name}`\n\n::: {name}\n    options:\n      show_root_heading: false"
        for name in modules
    ) + "\n"


def _fill(markdown: str, marker: str, text: str, *, keep_markers: bool) -> str:
    """``marker``'s part of ``markdown`` (up to its closing marker, or the bare marker) as
    ``text``: between the markers for the repository, without them for the site."""
    close = marker.replace("<!-- ", "<!-- /", 1)
    part = re.compile(re.escape(marker) + r"(?:.*?" + re.escape(close) + r")?", re.DOTALL)
    body = f"{marker}\n{text}{close}" if keep_markers else text
    return part.sub(lambda _: body, markdown, count=1)


def render_markers(markdown: str) -> str:
    """Every generated part of one page as the site shows it."""
    for marker, render in ((INVARIANTS_MARKER, render_invariants), (API_MARKER, render_api),
                           (MODULES_MARKER, render_modules), (CODES_MARKER, render_codes)):
        if marker in markdown:
            markdown = _fill(markdown, marker, render(), keep_markers=False)
    return markdown


def render_source(markdown: str) -> str:
    """Every generated part of one page as the repository keeps it (reads without a build)."""
    for marker, render in ((INVARIANTS_MARKER, render_invariants),
                           (API_MARKER, render_api_source),
                           (MODULES_MARKER, render_modules_source),
                           (CODES_MARKER, render_codes)):
        if marker in markdown:
            markdown = _fill(markdown, marker, render(), keep_markers=True)
    return markdown


def stale_pages() -> list[str]:
    """The generated pages whose text in the repository is not what the package gives."""
    return [page for page in GENERATED_PAGES
            if (text := (_ROOT / page).read_text(encoding="utf-8")) != render_source(text)]


def write_pages() -> list[str]:
    """Rewrite the generated parts of the pages in the repository; the pages changed."""
    changed = stale_pages()
    for page in changed:
        path = _ROOT / page
        path.write_text(render_source(path.read_text(encoding="utf-8")), encoding="utf-8")
    return changed


def on_config(config: Any, **kwargs: Any) -> Any:
    """MkDocs event: keep ``--strict`` strict under ``-q``.

    ``mkdocs build --strict -q`` (what CI runs) raises the ``mkdocs`` logger to ERROR, so a
    warning is never emitted and strict mode, which counts emitted warnings, passes a build
    with broken links or docstrings. In strict mode, let warnings through again.
    """
    logger = logging.getLogger("mkdocs")
    if config.get("strict") and logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)
    return config


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """MkDocs event: render the markers of the page being built."""
    return render_markers(markdown)


if __name__ == "__main__":  # python docs/hooks/lora_guard_docs.py: refresh the pages
    for changed in write_pages():
        print(f"rewrote {changed}")
