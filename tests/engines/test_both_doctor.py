"""``lora-guard doctor`` where both engines are installed: each hook attached, or the command
fails naming the hook. Each run is a process of its own, as a user's is."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest

if importlib.util.find_spec("sglang") is None or importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm and sglang are not installed: the engine tier runs in its own "
                "environment (tests/engines/run builds it and runs the tier)",
                allow_module_level=True)

import _harness as h

from lora_guard.integrations import sglang as sglang_guard
from lora_guard.integrations import vllm as vllm_guard

DOCTOR = """
    import sys
    sys.path.insert(0, {here!r})
    import _harness
    _harness.cpu_imports()  # what a CPU needs; a GPU server imports the engines as they are
    {before}
    from lora_guard._frontends.cli import main
    sys.exit(main({argv!r}))
"""


def doctor(*argv: str, before: str = "") -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(DOCTOR.format(here=str(h.HERE), before=before,
                                         argv=["doctor", *argv]))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, check=False)


def test_doctor_finds_every_hook_of_both_engines_attached():
    done = doctor("--format", "json")

    assert done.returncode == 0, done.stdout + done.stderr
    engines = json.loads(done.stdout)["engines"]
    for name, integration in (("vllm", vllm_guard.INTEGRATION),
                              ("sglang", sglang_guard.INTEGRATION)):
        report = engines[name]
        assert report["supported"] is True and report["missing"] == {}, report
        # the installed release, whichever of the range it is, and its own profile
        assert report["profile"] == f"{name}=={report['version']}"
        present = {f"{p.module}:{p.path}" for p in integration.patches if not p.optional}
        assert present <= set(report["attached"]) <= {
            f"{p.module}:{p.path}" for p in integration.patches}
    assert engines["peft"]["supported"] is True and engines["peft"]["missing"] == {}


def test_doctor_names_the_release_on_each_hook_line():
    done = doctor()
    assert done.returncode == 0, done.stdout + done.stderr
    versions = {name: json.loads(doctor("--format", "json").stdout)["engines"][name]["version"]
                for name in ("vllm", "sglang")}
    hooks = [line for line in done.stdout.splitlines() if line.startswith("  attached")]
    for name, version in versions.items():
        assert any(line.endswith(f"({name} {version})") for line in hooks), (name, hooks)


def test_doctor_fails_naming_a_hook_the_installed_release_lacks():
    # as if a release had renamed the method: the guard would silently never run
    done = doctor(before="import sglang.srt.lora.lora_manager as m; "
                         "del m.LoRAManager.unload_lora_adapter")

    assert done.returncode == 1, done.stdout + done.stderr
    assert f"sglang {sglang_guard.INTEGRATION.version()}: supported" in done.stdout
    assert "MISSING   sglang.srt.lora.lora_manager:LoRAManager.unload_lora_adapter" \
        in done.stdout
    assert f"vllm {vllm_guard.INTEGRATION.version()}: supported" in done.stdout
