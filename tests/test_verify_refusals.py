"""`lora-guard verify` refuses clearly (a code, a fix, exit 2) where it cannot run: no adapter,
no base model folder or no weights in it, the engine not installed. Nothing heavy is imported
for these: the checks come first."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

from lora_guard._frontends.cli import main
from lora_guard.testing import write_adapter


def _verify(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["verify", *args])
    captured = capsys.readouterr()
    return code, captured.err


@pytest.fixture
def adapter(tmp_path: pathlib.Path) -> pathlib.Path:
    return write_adapter(tmp_path / "adapter")


def test_a_base_folder_without_config_is_refused_with_the_fix(
        adapter: pathlib.Path, tmp_path: pathlib.Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    code, err = _verify(capsys, str(adapter), "--engine", "vllm", "--base",
                        str(tmp_path / "nowhere"))
    assert code == 2
    assert "[base-missing]" in err and "config.json" in err and "--local-dir" in err


def test_a_base_without_safetensors_weights_is_refused(
        adapter: pathlib.Path, tmp_path: pathlib.Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    (base / "pytorch_model.bin").write_bytes(b"")
    code, err = _verify(capsys, str(adapter), "--engine", "sglang", "--base", str(base))
    assert code == 2
    assert "[base-weights-missing]" in err and "convert them to safetensors" in err


def test_a_folder_that_is_no_adapter_is_refused(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    code, err = _verify(capsys, str(tmp_path), "--engine", "vllm", "--base", str(tmp_path))
    assert code == 2 and "[adapter-missing]" in err


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_an_engine_that_is_not_installed_is_refused_with_the_fix(
        adapter: pathlib.Path, tmp_path: pathlib.Path, engine: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    if importlib.util.find_spec(engine) is not None:
        pytest.skip(f"{engine} is installed here (the engine tier runs verify on it)")
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    (base / "model.safetensors").write_bytes(b"")
    code, err = _verify(capsys, str(adapter), "--engine", engine, "--base", str(base))
    assert code == 2
    assert "[engine-missing]" in err and f"pip install {engine}" in err


def test_an_unknown_engine_is_a_usage_error(
        adapter: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _verify(capsys, str(adapter), "--engine", "tgi", "--base", ".")
    assert code == 2 and "invalid choice: 'tgi'" in err
