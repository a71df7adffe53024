"""LG106 (dtype-policy): a dtype outside the served set, or mixed dtypes in one adapter.

A server that serves bf16 only (`dtypes=("bf16",)`) casts or refuses a float32 adapter: the
check names the dtype, the tensor and what is allowed.
"""

from __future__ import annotations

import pathlib

import pytest

import lora_guard as lg
from conftest_adapters import llama, messages, save

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
safetensors_torch = pytest.importorskip("safetensors.torch")

from peft import LoraConfig  # noqa: E402


def test_dtype_policy(zoo: dict[str, pathlib.Path]) -> None:
    report = lg.check_adapters([zoo["r8-qv"], zoo["r16-all-bf16"]],
                               lg.ServingLimits(dtypes=("bf16",)))
    assert report.codes() == ["LG106"]
    assert "dtype float32 of" in report.violations[0].message
    assert "allowed: bfloat16" in report.violations[0].message


@pytest.mark.parametrize("dtype", ["int8", "int32"])
def test_integer_lora_weights_are_lg106_on_every_engine(tmp_path: pathlib.Path,
                                                        dtype: str) -> None:
    """A conversion script that "compressed" a PEFT adapter to int8 without scales, or wrote
    float32 bytes under the I32 code: vLLM 0.34.0 and sglang 0.5.23 both load it and cast it
    to the model's dtype (the field sweep's real engines said so), serving numbers nobody
    trained."""
    folder = save(llama(), LoraConfig(r=8, target_modules=["q_proj", "v_proj"]), tmp_path / "a")
    weights = str(folder / "adapter_model.safetensors")
    tensors = safetensors_torch.load_file(weights)
    if dtype == "int8":
        tensors = {k: (v * 100).to(torch.int8) for k, v in tensors.items()}
    else:  # the same bytes, read as int32
        tensors = {k: v.view(torch.int32) for k, v in tensors.items()}
    safetensors_torch.save_file(tensors, weights)

    for engine in ("vllm", "sglang", "peft"):
        report = lg.check_adapters([folder], lg.ServingLimits.for_engine(engine))
        assert report.codes() == ["LG106"], engine
        assert messages(report).endswith(
            f"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight (and 7 more) is "
            f"{dtype}, not a floating-point dtype: LoRA weights are trained in floating point, "
            "and an engine casts these values to its float dtype and serves numbers no "
            "training produced.")
        assert report.violations[0].hint.startswith("Save the adapter again from its trained")


@pytest.mark.parametrize("dtype", ["float64", "float8_e4m3fn"])
def test_float_lora_weights_of_any_width_pass(tmp_path: pathlib.Path, dtype: str) -> None:
    """float64 and float8 adapters load and serve cast on vLLM and sglang: no false alarm."""
    folder = save(llama(), LoraConfig(r=8, target_modules=["q_proj", "v_proj"]), tmp_path / "a")
    weights = str(folder / "adapter_model.safetensors")
    tensors = safetensors_torch.load_file(weights)
    safetensors_torch.save_file({k: v.to(getattr(torch, dtype)) for k, v in tensors.items()},
                                weights)
    for engine in ("vllm", "sglang"):
        assert lg.check_adapters([folder], lg.ServingLimits.for_engine(engine)).ok, engine
