"""How lora_guard reaches a user's machine and CI: the README's set-up, the pre-commit hook."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

sys.path.insert(0, str(ROOT / "tools"))  # tools/ci.py, the runner CI calls: a script
try:
    import ci
finally:
    sys.path.remove(str(ROOT / "tools"))
EXAMPLES = ROOT / "examples" / "adapters"


def readme_commands() -> list[str]:
    """The commands of the README's quick start (its first bash block), comments dropped."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Quick start.*?```bash\n(.*?)```", text, re.DOTALL)
    assert block, "README.md: the quick start has a bash block"
    return [line for line in block.group(1).splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_the_readme_has_two_commands_and_ci_runs_exactly_them() -> None:
    # one installs and runs the main job, one sets up and runs everything CI runs
    commands = readme_commands()
    assert len(commands) == 2, commands
    ci = [line for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    # each README command is a line of its own there, with `|| exit`: under `set -e` a
    # failure before the last `&&` of a line would not stop the script
    run = [line.removesuffix(" || exit") for line in ci if line.endswith(" || exit")]
    assert run == commands, ".ci/run runs the README's two commands, in order"
    assert not [line for line in ci if "&&" in line and not line.endswith(" || exit")]
    # we use what we ship: the suite runs under its own plugin, in the README's own words
    assert "python -m pytest -n 2 --lora-guard --lora-guard-instrument=peft" in commands[1]


def test_ci_keeps_the_stock_pip_of_a_fresh_venv() -> None:
    # the README promises its commands work with the pip `python3 -m venv` gives (23.2.1 on
    # Python 3.11): CI must not upgrade it before running them
    text = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "python3 -m venv .venv-ci" in text
    assert not re.search(r"pip install[^\n]*(--upgrade|-U)[^\n]* pip\b", text), text


def test_the_main_job_installs_the_checker_alone() -> None:
    main_job = next(c for c in readme_commands() if "lora-guard check" in c)
    install = main_job.split("&&")[0]
    assert "pip install" in install
    assert "torch" not in install and "[" not in install, install  # no extras, no torch


def test_the_second_command_runs_every_step_ci_has() -> None:
    assert readme_commands()[1].startswith("python tools/ci.py lint types layers docs && ")
    assert readme_commands()[1].endswith(" && python tools/ci.py peft engines engines-older")
    assert list(ci.STEPS) == ["setup", "lint", "types", "layers", "docs", "suite", "peft",
                              "engines", "engines-older"]
    assert ci.TORCH == "torch==2.13.0"  # pinned before the extras: an open range pulls CUDA
    assert {"test", "docs", "bench", "peft-tests"} <= set(ci.EXTRAS[2:-1].split(","))
    source = (ROOT / "tools" / "ci.py").read_text(encoding="utf-8")
    for words in ('"ruff"), "check", "."', '"mypy")', '"lint-imports")',
                  '"build", "--strict"', '"--lora-guard",\n                         '
                  '"--lora-guard-instrument=peft"', '"tests/upstream/run_peft_suite.py"',
                  '"tests/engines/run", "--lora-guard"',
                  '"--vllm", "0.31.0",\n                                 "--sglang", "0.5.20"'):
        assert words in source, words


def test_the_runner_stops_at_the_first_failing_step_with_its_status(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    ran: list[str] = []

    def step(name: str, status: int) -> Callable[[], int]:
        def run() -> int:
            ran.append(name)
            return status
        return run

    class NoBuild(ci.EngineBuild):  # the engine environment is not this test's subject
        def start(self) -> None:
            ran.append("engine build started")

    monkeypatch.setattr(ci, "EngineBuild", NoBuild)
    monkeypatch.setattr(ci, "STEPS", {"setup": step("setup", 0), "lint": step("lint", 0),
                                      "suite": step("suite", 5), "engines": step("engines", 0)})
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()  # already set up
    monkeypatch.setattr(ci, "venv_dir", lambda: venv)
    assert ci.main([]) == 5  # pytest's "no tests collected" fails the run
    out = capsys.readouterr().out
    assert ran == ["setup", "engine build started", "lint", "suite"]
    assert "exit 5: no tests collected" in out and "not run (an earlier step failed): engines" \
        in out
    ran.clear()
    assert ci.main(["lint"]) == 0 and ran == ["lint"]
    assert "all passed" in capsys.readouterr().out


def test_the_readme_names_the_cpu_torch_index_as_an_option() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "lora_guard[torch]" in text
    assert "--index-url https://download.pytorch.org/whl/cpu" in text


def test_no_install_line_names_a_package_that_is_on_no_index() -> None:
    # until a release exists, `pip install lora-guard` finds nothing: the docs install from
    # the repository, and no snippet holds a placeholder to fill in
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"pip install (-U )?lora-guard(\s|`|$)", text, re.M), page
        assert "YOUR-ORG" not in text, page


# --- the pre-commit hook ----------------------------------------------------------------------


def hook() -> dict[str, object]:
    (only,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
    assert isinstance(only, dict)
    return only


def test_the_hook_runs_on_adapter_files_only() -> None:
    h = hook()
    assert h["id"] == "lora-guard" and h["language"] == "python"
    assert h["require_serial"] is True  # the whole set in one call
    files = re.compile(str(h["files"]))
    for name in ("adapters/math/adapter_config.json", "adapter_model.safetensors",
                 "a/b/adapter_model.bin"):
        assert files.search(name), name
    for name in ("base/config.json", "adapters/math/README.md", "my_adapter_config.json",
                 "model.safetensors"):
        assert not files.search(name), name


def run_hook(tmp_path: Path, *files: str) -> subprocess.CompletedProcess[str]:
    """The hook as pre-commit calls it: entry, then the changed files as arguments."""
    entry = shlex.split(str(hook()["entry"]))
    exe = shutil.which(entry[0])
    argv = ([exe] if exe else [sys.executable, "-m", "lora_guard._frontends.cli"]) + entry[1:]
    return subprocess.run([*argv, *files], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120, check=False)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    shutil.copytree(EXAMPLES / "good", tmp_path / "adapters")
    shutil.copytree(EXAMPLES / "bad" / "rank-64", tmp_path / "wip" / "rank-64")
    shutil.copy(EXAMPLES / "base" / "config.json", tmp_path / "base.json")
    (tmp_path / "pyproject.toml").write_text(
        '[tool.lora-guard]\nbase-config = "base.json"\nmax-rank = 16\n')
    return tmp_path


def test_the_hook_entry_checks_the_files_it_is_given(project: Path) -> None:
    good = sorted(str(p.relative_to(project)) for p in (project / "adapters").rglob("adapter_*"))
    done = run_hook(project, *good)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 adapters checked: all pass." in done.stdout  # each adapter once
    done = run_hook(project, *good, "wip/rank-64/adapter_config.json")
    assert done.returncode == 1 and "LG101 rank-exceeds-limit" in done.stdout
    done = run_hook(project, "adapters/gone/adapter_config.json")  # deleted in the commit
    assert done.returncode == 2 and "no such file or folder" in done.stderr


@pytest.mark.skipif(shutil.which("pre-commit") is None and
                    shutil.which("pre-commit", path=str(Path(sys.executable).parent)) is None,
                    reason="pre-commit is in the test extra")
def test_pre_commit_try_repo_passes_a_clean_set_and_fails_a_bad_one(
    project: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    exe = shutil.which("pre-commit", path=str(Path(sys.executable).parent)) or "pre-commit"
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path_factory.mktemp("pre-commit-home")),
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    env.pop("PYTHONPATH", None)  # the hook's own environment, from the repository alone

    def git(*argv: str) -> None:
        subprocess.run(["git", *argv], cwd=project, check=True, capture_output=True, env=env)

    shutil.rmtree(project / "wip")
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "adapters")

    def try_repo() -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, "try-repo", str(ROOT), "lora-guard", "--all-files"],
                              cwd=project, capture_output=True, text=True, env=env,
                              timeout=300, check=False)

    done = try_repo()
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"lora-guard check\.+Passed", done.stdout)
    shutil.copytree(EXAMPLES / "bad" / "rank-64", project / "adapters" / "rank-64")
    git("add", "-A")
    done = try_repo()
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(r"lora-guard check\.+Failed", done.stdout)
    assert "LG101" in done.stdout


@pytest.mark.skipif(shutil.which("pre-commit") is None and
                    shutil.which("pre-commit", path=str(Path(sys.executable).parent)) is None,
                    reason="pre-commit is in the test extra")
def test_the_ci_guides_local_hook_runs_as_written(
    project: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # the guide's .pre-commit-config.yaml, pasted as is (no placeholder to fill in), with
    # lora-guard installed in the environment the commit is made from
    guide = (ROOT / "docs" / "guides" / "ci.md").read_text(encoding="utf-8")
    config = re.search(r"```yaml\n(# \.pre-commit-config\.yaml\n.*?)```", guide, re.DOTALL)
    assert config, "the CI guide has a .pre-commit-config.yaml block"
    (project / ".pre-commit-config.yaml").write_text(config.group(1))
    exe = shutil.which("pre-commit", path=str(Path(sys.executable).parent)) or "pre-commit"
    bin_dir = str(Path(sys.executable).parent)  # where lora-guard is installed
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path_factory.mktemp("pre-commit-home")),
           "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    shutil.rmtree(project / "wip")
    for argv in (["init", "-q"], ["add", "-A"]):
        subprocess.run(["git", *argv], cwd=project, check=True, capture_output=True, env=env)

    def pre_commit() -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, "run", "--all-files"], cwd=project, capture_output=True,
                              text=True, env=env, timeout=300, check=False)

    done = pre_commit()
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"lora-guard check\.+Passed", done.stdout)
    shutil.copytree(EXAMPLES / "bad" / "rank-64", project / "adapters" / "rank-64")
    subprocess.run(["git", "add", "-A"], cwd=project, check=True, capture_output=True, env=env)
    done = pre_commit()
    assert done.returncode == 1 and "LG101" in done.stdout, done.stdout + done.stderr


# --- docs a reader sees without a site build ------------------------------------------------


def doc_pages() -> list[Path]:
    docs = ROOT / "docs"
    return [*sorted(p for p in docs.rglob("*.md") if "hooks" not in p.parts),
            ROOT / "README.md"]


def test_no_public_page_names_a_private_module() -> None:
    private = re.compile(r"lora_guard(\.\w+)*\._(?!_)\w+")  # __all__ is public
    found = [f"{page.relative_to(ROOT)}: {m.group(0)}" for page in doc_pages()
             for m in private.finditer(page.read_text(encoding="utf-8"))]
    assert not found, found


def test_the_generated_pages_read_in_full_without_a_site_build() -> None:
    # a reader browsing the repository sees every code and every public name, not a marker
    import lora_guard as lg
    from test_docs import hook

    stale = hook.stale_pages()
    assert not stale, f"{stale} are out of date: run python docs/hooks/lora_guard_docs.py"
    invariants = (ROOT / "docs" / "reference" / "invariants.md").read_text(encoding="utf-8")
    api = (ROOT / "docs" / "reference" / "api.md").read_text(encoding="utf-8")
    overview = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    for code, inv in lg.INVARIANTS.items():
        assert f"## {code} {inv.slug}: " in invariants, code
        assert f"| [{code}](reference/invariants.md#{code.lower()}) |" in overview, code
    missing = [name for name in lg.__all__ if f"| `lg.{name}` |" not in api]
    assert not missing, f"not in docs/reference/api.md: {missing}"
    for page in hook.GENERATED_PAGES:  # the site shows the full content, no marker left
        built = hook.render_markers((ROOT / page).read_text(encoding="utf-8"))
        assert "<!-- lora-guard:" not in built and "<!-- /lora-guard:" not in built


def test_the_testing_guide_lists_the_codes_the_plugin_names() -> None:
    import lora_guard as lg

    guide = (ROOT / "docs" / "guides" / "testing.md").read_text(encoding="utf-8")
    listed = re.search(r"valid codes: (.*?) \(`lora-guard codes`", guide)
    assert listed and listed.group(1).split(", ") == list(lg.INVARIANTS)


def test_no_public_docstring_names_a_private_module() -> None:
    """The API and modules reference pages render these docstrings."""
    import importlib
    import inspect

    import lora_guard as lg

    private = re.compile(r"lora_guard(\.\w+)*\._(?!_)\w+")
    objects: list[tuple[str, object]] = [(f"lg.{n}", getattr(lg, n)) for n in lg.__all__]
    for name in ("lora_guard.testing", "lora_guard.strategies", "lora_guard.integrations",
                 "lora_guard.integrations.peft", "lora_guard.integrations.sglang",
                 "lora_guard.integrations.vllm"):
        try:
            module = importlib.import_module(name)
        except ImportError:  # an optional dependency of that module is missing
            continue
        objects.append((name, module))
        objects += [(f"{name}.{n}", getattr(module, n)) for n in getattr(module, "__all__", ())]
    found = []
    for where, obj in objects:
        docs = [inspect.getdoc(obj) or ""]
        if inspect.isclass(obj):  # methods, class and static methods, properties
            members = [m.__func__ if isinstance(m, (classmethod, staticmethod)) else m
                       for n, m in vars(obj).items() if not n.startswith("_")]
            docs += [inspect.getdoc(m) or "" for m in members
                     if callable(m) or isinstance(m, property)]
        found += [f"{where}: {m.group(0)}" for doc in docs for m in private.finditer(doc)]
    assert not found, found


def test_a_failed_engine_environment_build_is_named_as_the_build_not_as_failed_tests(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    ran: list[str] = []

    class FailedBuild(ci.EngineBuild):  # pip could not resolve the engine environment
        def wait(self) -> int:
            return 1

    def step(name: str) -> Callable[[], int]:
        def run() -> int:
            ran.append(name)
            return 0
        return run

    monkeypatch.setattr(ci, "EngineBuild", FailedBuild)
    monkeypatch.setattr(ci, "STEPS", {"lint": step("lint"), "engines": step("engines")})
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    monkeypatch.setattr(ci, "venv_dir", lambda: venv)
    assert ci.main(["lint", "engines"]) == 1
    out = capsys.readouterr().out
    assert ran == ["lint"]  # the tier never ran
    assert "build of the engine environment" in out and "tests failed" not in out
    assert "not run (an earlier step failed): engines" in out


def test_a_disk_too_small_for_the_environments_is_said_before_pip_fails_on_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    # A full disk makes pip report "Connection interrupted" or a failed build dependency:
    # the run names the disk first and again under the failed step's summary.
    monkeypatch.setattr(ci, "venv_dir", lambda: tmp_path / "venv")
    monkeypatch.setattr(ci, "engines_venv_dir", lambda: tmp_path / "engines")
    monkeypatch.setattr("shutil.disk_usage",
                        lambda _: SimpleNamespace(free=3 * 2**30))
    monkeypatch.setattr(ci, "STEPS", {"lint": lambda: 1})
    monkeypatch.setattr(ci, "EngineBuild", type("NoBuild", (ci.EngineBuild,),
                                                {"start": lambda self: None}))
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").touch()
    assert ci.main(["lint"]) == 1
    out = capsys.readouterr().out
    assert out.count("warning: 3.0 GiB free") == 2
    assert "engines" in out.splitlines()[0] and "about 12 GiB" in out
    # the environments all there: nothing to build, nothing to say, however full the disk
    for folder in ci.engine_venv_dirs():
        (folder / "bin").mkdir(parents=True)
        (folder / "bin" / "python").touch()
    assert ci.disk_warning() is None
