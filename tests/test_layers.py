"""The layers hold: each subpackage imports only the layers below it (CONTRIBUTING.md, Layout).

The contracts live in pyproject.toml's ``[tool.importlinter]``; these tests run ``lint-imports``
on this checkout, and on a copy with one upward import planted to show the check catches it.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent  # this checkout, whatever is installed
PACKAGE = ROOT / "src" / "lora_guard"
PYPROJECT = ROOT / "pyproject.toml"


def _lint_imports(project: pathlib.Path, src: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with ``project``'s pyproject.toml, finding lora_guard under ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    code = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run(
        [sys.executable, "-c", code, "--config", str(project / "pyproject.toml"), "--no-cache"],
        cwd=project, env=env, capture_output=True, text=True, check=False, timeout=300,
    )


def _copy_with(tmp_path: pathlib.Path, module: str, source: str) -> pathlib.Path:
    """A copy of this checkout's package and pyproject.toml, plus one module of ``source``."""
    shutil.copy(PYPROJECT, tmp_path / "pyproject.toml")
    shutil.copytree(PACKAGE, tmp_path / "src" / "lora_guard",
                    ignore=shutil.ignore_patterns("__pycache__"))
    planted = tmp_path / "src" / pathlib.Path(*module.split(".")).with_suffix(".py")
    planted.write_text(source)
    return tmp_path


def test_every_import_contract_is_kept() -> None:
    result = _lint_imports(ROOT, PACKAGE.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "source", "contract"),
    [
        pytest.param("lora_guard._core.upward", "import lora_guard._guarding.layouts\n",
                     "Each layer imports only the layers below it", id="core-imports-a-guard"),
        pytest.param("lora_guard._reading.upward",
                     "def late() -> None:\n    import lora_guard.integrations.peft\n",
                     "Each layer imports only the layers below it", id="lazy-upward-import"),
        pytest.param("lora_guard._frontends.upward", "import lora_guard.pytest_plugin\n",
                     "does not import pytest_plugin back", id="plugin-cycle"),
    ],
)
def test_a_planted_upward_import_breaks_the_contract(
    tmp_path: pathlib.Path, module: str, source: str, contract: str
) -> None:
    project = _copy_with(tmp_path, module, source)
    result = _lint_imports(project, project / "src")
    assert result.returncode != 0, result.stdout
    assert contract in result.stdout
    assert module in result.stdout  # the report names the module that broke the layer


def test_a_heavy_import_in_the_pytest_entry_point_breaks_its_contract(
    tmp_path: pathlib.Path,
) -> None:
    project = _copy_with(tmp_path, "lora_guard.pytest_plugin",
                         (PACKAGE / "pytest_plugin.py").read_text() + "\nimport torch\n")
    result = _lint_imports(project, project / "src")
    assert result.returncode != 0, result.stdout
    assert "imports nothing heavy" in result.stdout
    assert "lora_guard.pytest_plugin -> torch" in result.stdout


def _layout_map() -> str:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1]


def test_the_contributing_layout_map_names_every_folder_and_module() -> None:
    """CONTRIBUTING.md's map matches the tree: a new module or folder must be added to it."""
    shown = _layout_map()
    missing = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if "__pycache__" not in path.parts
        and not (path.name == "__init__.py" and path.parent != PACKAGE)
        and path.name not in shown
        # one module per code: the map shows the pattern (lgNNN_<slug>.py) once per folder
        and not (re.fullmatch(r"lg\d{3}_[a-z0-9_]+\.py", path.name)
                 and f"{path.parent.name}/" in shown and "lgNNN_<slug>.py" in shown)
    ]
    folders = [f"{p.name}/" for p in sorted(PACKAGE.iterdir())
               if p.is_dir() and (p / "__init__.py").exists()]
    assert missing == [], f"CONTRIBUTING.md's layout map leaves out {missing}"
    assert [f for f in folders if f not in shown] == []
