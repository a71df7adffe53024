"""Pages that show a small project (a server module and its test files) are run as one.

A ```python block whose first line is ``# path/to/file.py`` is a file of the page's project:
this test writes them into a fresh folder and runs pytest on it the way the page says, so the
outputs the page shows (what passes, what fails and with which code) cannot drift."""

from __future__ import annotations

import re
from pathlib import Path

import hypothesis  # noqa: F401 - imported once per process before pytester's in-process runs
import pytest
import torch  # noqa: F401 - likewise

DOCS = Path(__file__).resolve().parents[1] / "docs"
_BLOCK = re.compile(r"^```python\n# (?P<path>[\w/]+\.py)\n(?P<body>.*?)^```", re.S | re.M)


def project_files(page: Path) -> dict[str, str]:
    return {m["path"]: m["body"] for m in _BLOCK.finditer(page.read_text())}


@pytest.fixture
def testing_guide(pytester: pytest.Pytester) -> pytest.Pytester:
    files = project_files(DOCS / "guides" / "testing.md")
    assert {"server.py", "tests/test_server.py", "tests/test_properties.py"} <= set(files)
    for path, body in files.items():
        target = pytester.path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(body)
    pytester.syspathinsert(pytester.path)
    return pytester


@pytest.mark.lora_guard(expect=["LG001"], reason="the guide's server swallows LG001 in the "
                         "inner run; without the plugin its tests pass, which is the point")
def test_the_server_tests_pass_without_the_plugin_as_the_guide_shows(
    testing_guide: pytest.Pytester,
) -> None:
    testing_guide.runpytest("tests/test_server.py").assert_outcomes(passed=2)


def test_the_plugin_fails_the_test_whose_violation_was_swallowed(
    testing_guide: pytest.Pytester,
) -> None:
    result = testing_guide.runpytest("--lora-guard", "tests/test_server.py")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines([
        "*LG001 pool-shape-drift: LoRAPool.write: dim 'rank' was frozen at 16 by the first call"
        " and is now 8*",
        "*LG001  pool-shape-drift           1          1        0        0      1             1*",
    ])


def test_the_property_test_finds_the_bug_as_the_guide_shows(
    testing_guide: pytest.Pytester,
) -> None:
    result = testing_guide.runpytest("tests/test_properties.py")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*unexpected LG001 (pool-shape-drift)*"])
