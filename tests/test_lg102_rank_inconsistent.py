"""LG102 (rank-inconsistent): lora_A and lora_B disagree on rank, or the tensors disagree with
the config (`r`, `rank_pattern`, read with PEFT's first-match rule).

A server sizes each module from the config: an adapter whose tensors say otherwise loads
garbage or fails mid-batch. A grouped convolution, whose lora_B has r / groups in channels,
is not such a disagreement (a false alarm before lora_guard knew it).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

import lora_guard as lg
from conftest_adapters import check, messages, save
from lora_guard._testing.adapter_writer import write_adapter

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
safetensors_torch = pytest.importorskip("safetensors.torch")

from peft import LoraConfig, PeftModel  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # PEFT's notes on saving


def test_rank_pattern_first_match_wins(tmp_path: pathlib.Path) -> None:
    # PEFT: re.match(rf"(.*\.)?({key})$", name), first key that matches wins.
    folder = write_adapter(tmp_path / "a", rank=8, targets=("q_proj",),
                           rank_pattern={"layers.1.self_attn.q_proj": 4, "q_proj": 2})
    assert lg.check_adapters(folder).ok
    config = json.loads((folder / "adapter_config.json").read_text())
    config["rank_pattern"] = {"q_proj": 2, "layers.1.self_attn.q_proj": 4}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    report = lg.check_adapters(folder)
    assert report.codes() == ["LG102"]
    assert "has tensors of rank 4 but the config says 2" in report.violations[0].message


class _GroupedConv(torch.nn.Module):  # type: ignore[misc, name-defined]
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 16, 3, groups=4)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: Any) -> Any:
        return self.head(self.conv(x).mean((2, 3)))


def test_a_conv_lora_with_groups_is_not_lg102(tmp_path: pathlib.Path) -> None:
    """PEFT gives lora_B the base conv's groups: B has r / groups in channels."""
    torch.manual_seed(0)
    folder = save(_GroupedConv(), LoraConfig(r=8, target_modules=["conv"]), tmp_path / "conv")
    spec = lg.inspect_adapter(folder)
    module = spec.modules["conv"]
    assert module.a_shape == (8, 8, 3, 3) and module.b_shape == (16, 2, 1, 1)

    assert check(folder).ok, messages(check(folder))

    from lora_guard.integrations import peft as peft_guard

    was = peft_guard.INTEGRATION.instrumented  # the session's instrumentation stays as it was
    peft_guard.instrument()
    try:
        torch.manual_seed(0)
        loaded = PeftModel.from_pretrained(_GroupedConv(), str(folder))
    finally:
        if not was:
            peft_guard.uninstrument()
    assert loaded(torch.zeros(1, 8, 5, 5)).shape == (1, 4)


def test_a_conv_lora_whose_halves_really_disagree_is_still_lg102(tmp_path: pathlib.Path) -> None:
    torch.manual_seed(0)
    folder = save(_GroupedConv(), LoraConfig(r=8, target_modules=["conv"]), tmp_path / "conv")
    tensors = safetensors_torch.load_file(str(folder / "adapter_model.safetensors"))
    key = "base_model.model.conv.lora_B.weight"
    tensors[key] = torch.zeros(16, 3, 1, 1)  # 8 / 3: no groups give that
    safetensors_torch.save_file(tensors, str(folder / "adapter_model.safetensors"))

    assert check(folder).codes() == ["LG102"]
