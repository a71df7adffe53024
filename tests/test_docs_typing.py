"""The user examples in the docs type-check, and no docs page sends users to a private module.

A user who copies an example into a project checked with ``mypy --strict`` must not get an
error from lora_guard's types (the documented ``ServingLimits(allow={"dora"})`` once failed
because the field was typed ``frozenset``). Every Python block of README.md and docs/**/*.md
that the docs tests run (blocks after ``<!-- docs-test: skip -->`` are sketches, not run, and
not checked here either) is extracted, a page's blocks in order into one module (they share a
namespace), and checked with ``mypy --strict`` against this checkout's sources, with torch,
peft and transformers as untyped third-party packages.

Four relaxations, each about the user's own code on a docs page rather than lora_guard's API:
untyped helper functions are allowed (``def weights(rank):`` on a page is not lora_guard's to
type, and their bodies are still checked), subclassing an untyped ``torch.nn.Module`` is
allowed, a page may redefine a name in a later block (``no-redef``), and ``server`` and
``adapterhub`` stand for the reader's own modules.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from test_docs import ROOT, doc_pages, python_blocks

_CONFIG = """\
[mypy]
strict = True
python_version = 3.11
mypy_path = {src}
cache_dir = {cache}
disallow_untyped_defs = False
disallow_incomplete_defs = False
disallow_untyped_calls = False
disallow_subclassing_any = False
disable_error_code = no-redef

[mypy-lora_guard.*]
follow_imports = silent

[mypy-torch.*,peft.*,transformers.*,safetensors.*,wrapt.*,hypothesis.*,numpy.*]
follow_imports = skip
ignore_missing_imports = True

[mypy-server.*,adapterhub.*]
ignore_missing_imports = True
"""

_PROMPT = re.compile(r"^\s*(>>>|\.\.\.)( |$)")


def example_source(source: str) -> str:
    """A block as Python: a doctest's ``>>>``/``...`` lines without prompts and output."""
    lines = source.splitlines()
    if not any(line.lstrip().startswith(">>>") for line in lines):
        return source
    return "\n".join(_PROMPT.sub("", line, count=1) for line in lines if _PROMPT.match(line))


def write_examples(out: Path) -> list[Path]:
    """One module per page with the page's checked blocks, each headed by its location."""
    written = []
    for page in doc_pages():
        parts = [
            f"# {page.relative_to(ROOT)}:{block.lineno}\n{example_source(block.source)}\n"
            for block in python_blocks(page) if not block.skipped
        ]
        if parts:
            target = out / (re.sub(r"\W", "_", str(page.relative_to(ROOT))) + ".py")
            target.write_text("\n".join(parts), encoding="utf-8")
            written.append(target)
    return written


def test_the_extractor_turns_a_doctest_into_code() -> None:
    block = ">>> x = 1\n>>> for i in range(2):\n...     x += i\n>>> x\n2\n"
    assert example_source(block) == "x = 1\nfor i in range(2):\n    x += i\nx"


def test_the_user_examples_in_the_docs_type_check(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    files = write_examples(tmp_path)
    assert len(files) >= 5, "the docs' Python examples were not found"
    config = tmp_path / "mypy.ini"
    config.write_text(_CONFIG.format(src=ROOT / "src", cache=tmp_path / ".mypy_cache"))
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config), *map(str, files)],
        capture_output=True, text=True, cwd=tmp_path, check=False,
    )
    assert result.returncode == 0, (
        "user examples in the docs fail mypy --strict (file names are the pages):\n"
        + result.stdout + result.stderr
    )


_PRIVATE = re.compile(r"lora_guard[./]_[a-z]\w*|\bfrom \.+_[a-z]\w* import")


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_docs_page_names_a_private_module(page: Path) -> None:
    found = sorted(set(_PRIVATE.findall(page.read_text(encoding="utf-8"))))
    assert not found, (
        f"{page.relative_to(ROOT)} names private modules {found}: point users at the public "
        "name (lora_guard.X, lora_guard.testing, lora_guard.integrations) instead"
    )
