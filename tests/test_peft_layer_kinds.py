"""Layer kinds PEFT saves and serves that a header-only view gets wrong unless it knows them.

Each case is one that PEFT's own test suite runs (grouped convolutions, BD-LoRA, LoRA on an
``nn.Parameter`` through ``target_parameters``) and that, before lora_guard knew these kinds,
failed under ``--lora-guard-instrument=peft``: a false alarm on an adapter PEFT serves. Each
adapter is made by PEFT on a tiny model, saved, and loaded back with the integration on.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch
else:
    torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
safetensors_torch = pytest.importorskip("safetensors.torch")

from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402

import lora_guard as lg  # noqa: E402
from lora_guard.integrations import peft as peft_guard  # noqa: E402
from lora_guard.testing import assert_violations  # noqa: E402


class GroupedConv(torch.nn.Module):
    """A vision block whose conv has groups=4, as in depthwise-separable models."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 32, 3, groups=4)
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x).mean(dim=(-1, -2)))  # type: ignore[no-any-return]


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin0 = torch.nn.Linear(16, 32)
        self.lin1 = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin1(torch.relu(self.lin0(x)))  # type: ignore[no-any-return]


class ParameterLinear(torch.nn.Module):
    """A linear layer that keeps its weight as a bare Parameter, stored (in, out), as MoE
    experts and GPT-2's Conv1D do: LoRA reaches it through ``target_parameters``."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.randn(in_features, out_features) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


class ParameterMlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin0 = ParameterLinear(16, 32)
        self.lin1 = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin1(torch.relu(self.lin0(x)))  # type: ignore[no-any-return]


def trained(model: torch.nn.Module, config: LoraConfig, path: Path) -> Path:
    torch.manual_seed(0)
    peft_model = get_peft_model(model, config)
    for name, param in peft_model.named_parameters():
        if "lora_" in name:
            param.data.normal_(0, 0.05)  # a trained adapter, not PEFT's zero-initialised B
    peft_model.save_pretrained(path)  # type: ignore[arg-type]
    return path


@pytest.fixture
def instrumented() -> Iterator[None]:
    peft_guard.instrument()
    yield
    peft_guard.uninstrument()


def test_a_grouped_conv_adapter_is_clean_and_loads(tmp_path: Path, instrumented: None) -> None:
    folder = trained(GroupedConv(), LoraConfig(r=8, target_modules=["conv"]), tmp_path / "a")
    shapes = {k: tuple(v.shape) for k, v in safetensors_torch.load_file(
        folder / "adapter_model.safetensors").items()}
    assert shapes["base_model.model.conv.lora_B.weight"] == (32, 2, 1, 1)  # r / groups
    assert lg.check_adapters([folder]).ok
    with assert_violations(()):
        model = PeftModel.from_pretrained(GroupedConv(), folder)
    assert model(torch.randn(1, 16, 8, 8)).shape == (1, 4)


def test_a_conv_adapter_whose_b_is_not_a_group_share_of_a_is_still_refused(
    tmp_path: Path,
) -> None:
    folder = trained(GroupedConv(), LoraConfig(r=8, target_modules=["conv"]), tmp_path / "a")
    weights = safetensors_torch.load_file(folder / "adapter_model.safetensors")
    weights["base_model.model.conv.lora_B.weight"] = torch.zeros(32, 3, 1, 1)  # 8 % 3 != 0
    safetensors_torch.save_file(weights, folder / "adapter_model.safetensors")
    report = lg.check_adapters([folder])
    assert report.codes() == ["LG102"]
    assert "lora_A of rank 8" in report.violations[0].message


def bd_lora(path: Path) -> Path:
    config = LoraConfig(r=8, target_modules=["lin0", "lin1"], use_bdlora=peft.tuners.lora.
                        config.BdLoraConfig(target_modules_bd_a=["lin0"],
                                            target_modules_bd_b=["lin1"], nblocks=2))
    return trained(Mlp(), config, path)


def test_a_bd_lora_adapter_is_an_unserved_feature_for_a_lora_server(tmp_path: Path) -> None:
    # vLLM 0.34 refuses it (PEFTHelper: "vLLM does not support block-diagonal LoRA");
    # a server that reads the factors as dense ones would multiply the wrong shapes.
    report = lg.check_adapters([bd_lora(tmp_path / "bd")])
    assert report.codes() == ["LG105"]
    assert "block-diagonal LoRA (BD-LoRA)" in report.violations[0].message
    assert "use_bdlora=" in report.violations[0].message


def test_a_bd_lora_adapter_allowed_is_checked_as_the_dense_factors_it_stands_for(
    tmp_path: Path, instrumented: None,
) -> None:
    folder = bd_lora(tmp_path / "bd")
    shapes = {k: tuple(v.shape) for k, v in safetensors_torch.load_file(
        folder / "adapter_model.safetensors").items()}
    assert shapes["base_model.model.lin0.lora_A.weight"] == (8, 8)  # (r, in / nblocks)
    assert shapes["base_model.model.lin1.lora_B.weight"] == (8, 4)  # (out, r / nblocks)
    limits = lg.ServingLimits(allow={"bdlora"}, max_rank=8)
    assert lg.check_adapters([folder], limits=limits).ok
    with assert_violations(()):
        model = PeftModel.from_pretrained(Mlp(), folder)
    assert model(torch.randn(2, 16)).shape == (2, 8)


def test_lora_on_a_bare_parameter_loads_against_the_parameters_dims(
    tmp_path: Path, instrumented: None,
) -> None:
    config = LoraConfig(r=4, target_modules=[], target_parameters=["lin0.weight"])
    folder = trained(ParameterMlp(), config, tmp_path / "p")
    with assert_violations(()):
        model = PeftModel.from_pretrained(ParameterMlp(), folder)
    assert model(torch.randn(2, 16)).shape == (2, 8)


@pytest.mark.lora_guard(expect=["LG109"], reason="PEFT's load is refused: another base")
def test_lora_on_a_bare_parameter_of_another_size_is_refused(
    tmp_path: Path, instrumented: None,
) -> None:
    class WideParameterMlp(ParameterMlp):
        def __init__(self) -> None:
            super().__init__()
            self.lin0 = ParameterLinear(24, 32)

    config = LoraConfig(r=4, target_modules=[], target_parameters=["lin0.weight"])
    folder = trained(WideParameterMlp(), config, tmp_path / "wide")
    with pytest.raises(lg.AdapterError, match="lin0"):
        PeftModel.from_pretrained(ParameterMlp(), folder)
