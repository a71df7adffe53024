"""The package as a user installs it: the built wheel, in a fresh environment without torch.

`pip install lora-guard` must give the checker (every output format), the guards and the pytest
plugin, with wrapt and typing-extensions as its only dependencies: a pre-commit hook or a CI
lint job must never download a GPU stack to read JSON headers. This builds the wheel from the
checkout, installs it with pip into a new venv (its dependencies come from the package index),
and runs the installed ``lora-guard`` on the example adapters.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "adapters"


def sh(*argv: str | Path, cwd: Path | None = None, ok: tuple[int, ...] = (0,),
       timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, check=False, env=env)
    assert done.returncode in ok, (argv, done.returncode, done.stdout[-2000:],
                                   done.stderr[-2000:])
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with only the built wheel (and its two dependencies) installed."""
    root = tmp_path_factory.mktemp("wheel")
    sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", root / "dist", ROOT)
    (wheel,) = (root / "dist").glob("lora_guard-*.whl")
    venv.create(root / "venv", with_pip=True)
    python = root / "venv" / "bin" / "python"
    sh(python, "-m", "pip", "install", "-q", wheel)
    return root


def test_the_wheel_installs_without_torch(installed: Path) -> None:
    python = installed / "venv" / "bin" / "python"
    names = {line.split("==")[0].split(" @ ")[0].lower().replace("_", "-")
             for line in sh(python, "-m", "pip", "freeze").stdout.splitlines()}
    assert names <= {"lora-guard", "wrapt", "typing-extensions", "tomli", "pip",
                     "setuptools"}, names
    missing = sh(python, "-c", "import torch", ok=(1,))
    assert "No module named 'torch'" in missing.stderr


def test_the_installed_command_checks_real_adapters_in_each_format(
    installed: Path, tmp_path: Path
) -> None:
    import jsonschema

    from test_cli_options import sarif_schema

    exe = installed / "venv" / "bin" / "lora-guard"
    shutil.copytree(EXAMPLES, tmp_path / "adapters", symlinks=True)
    base = ["--base-config", "adapters/base/config.json"]
    bad = ["check", "adapters/bad", *base, "--max-rank", "16"]

    good = sh(exe, "check", "adapters/good", *base, cwd=tmp_path)
    assert "3 adapters checked: all pass." in good.stdout
    text = sh(exe, *bad, cwd=tmp_path, ok=(1,)).stdout
    for code in ("LG101", "LG102", "LG103", "LG104", "LG105", "LG106", "LG107", "LG108",
                 "LG109"):
        assert f"  {code} " in text, code
    report = json.loads(sh(exe, *bad, "--format", "json", cwd=tmp_path, ok=(1,)).stdout)
    assert report["summary"]["failed"] == 11
    github = sh(exe, *bad, "--format", "github", cwd=tmp_path, ok=(1,)).stdout
    assert "::error file=adapters/bad/rank-64/adapter_config.json,title=LG101::" in github
    sarif = json.loads(sh(exe, *bad, "--format", "sarif", cwd=tmp_path, ok=(1,)).stdout)
    jsonschema.Draft4Validator(sarif_schema()).validate(sarif)
    assert {r["ruleId"] for r in sarif["runs"][0]["results"]} >= {"LG101", "LG109"}
    clean = sh(exe, "check", "adapters/good", *base, "--format", "sarif", cwd=tmp_path)
    jsonschema.Draft4Validator(sarif_schema()).validate(json.loads(clean.stdout))
    stats = sh(exe, *bad, "--statistics", cwd=tmp_path, ok=(1,)).stdout
    assert stats.split()[:2] == ["3", "LG108"]  # most frequent first (LG109's dims said once)
    missing = sh(exe, "check", "adapters/nowhere", cwd=tmp_path, ok=(2,))
    assert "no such file or folder: adapters/nowhere" in missing.stderr
    (tmp_path / "pyproject.toml").write_text("[tool.lora-guard]\nmax-rank = 16\n"
                                             'base-config = "adapters/base/config.json"\n')
    configured = sh(exe, "check", "adapters/bad/rank-64", "-q", cwd=tmp_path, ok=(1,))
    assert "LG101 rank-exceeds-limit" in configured.stdout
    explained = sh(exe, "explain", "LG101", cwd=tmp_path).stdout
    assert explained.startswith("LG101 rank-exceeds-limit") and "\033[" not in explained


def test_the_guards_and_the_plugin_work_without_torch(installed: Path, tmp_path: Path) -> None:
    python = installed / "venv" / "bin" / "python"
    sh(python, "-m", "pip", "install", "-q", "pytest")
    (tmp_path / "test_pool.py").write_text(
        "import collections, pytest, sys\n"
        "import lora_guard as lg\n"
        "Meta = collections.namedtuple('Meta', 'shape dtype')\n"
        "@pytest.mark.lora_guard(expect=['LG003'])\n"
        "def test_a_reused_key_of_another_shape_is_refused():\n"
        "    cache = lg.GuardedCache({})\n"
        "    cache['q_proj.lora_A'] = Meta((16, 64), 'bfloat16')\n"
        "    with pytest.raises(lg.CacheKeyCollisionError):\n"
        "        cache['q_proj.lora_A'] = Meta((8, 64), 'bfloat16')\n"
        "    assert 'torch' not in sys.modules\n"
        "def test_a_swallowed_refusal_fails_under_the_plugin():\n"
        "    cache = lg.GuardedCache({})\n"
        "    cache['q_proj.lora_A'] = Meta((16, 64), 'bfloat16')\n"
        "    try:\n"
        "        cache['q_proj.lora_A'] = Meta((8, 64), 'bfloat16')\n"
        "    except ValueError:\n"
        "        pass\n"
    )
    done = sh(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--lora-guard",
              "test_pool.py", cwd=tmp_path, ok=(1,))
    assert "1 failed, 1 passed" in done.stdout, done.stdout
    assert "LG003" in done.stdout


def test_shapes_guards_objects_with_shape_and_dtype_without_torch(installed: Path) -> None:
    python = installed / "venv" / "bin" / "python"
    done = sh(python, "-c", (
        "import collections, sys\n"
        "import lora_guard as lg\n"
        "Meta = collections.namedtuple('Meta', 'shape dtype')\n"
        "class Pool:\n"
        "    @lg.shapes(a='slots rank hidden', frozen=('slots', 'rank'), dtypes=('bfloat16',))\n"
        "    def set_lora_info(self, a):\n"
        "        return a.shape\n"
        "pool = Pool()\n"
        "print(pool.set_lora_info(Meta((4, 16, 64), 'bfloat16')))\n"
        "for bad in (Meta((4, 8, 64), 'bfloat16'), Meta((4, 16, 64), 'float16')):\n"
        "    try:\n"
        "        pool.set_lora_info(bad)\n"
        "    except lg.LoRAGuardError as err:\n"
        "        print(err.code)\n"
        "try:\n"
        "    lg.shapes(a='n', dtypes=('float13',))\n"
        "except ValueError as err:\n"
        "    print(str(err).split(';')[0])\n"
        "print('torch' in sys.modules)\n"))
    assert done.stdout.splitlines() == [
        "(4, 16, 64)", "LG001", "LG004",
        "lora_guard.shapes(dtypes=...): 'float13' is not a dtype name", "False"]
