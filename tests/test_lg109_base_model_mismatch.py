"""LG109 (base-model-mismatch): an adapter that does not fit the base model it is served on.

Checked against the base model's config.json (`base_config=`, `--base-config`): each module's
dims, the layer and expert indices, the vocabulary, the architecture's module names, a vision
tower on a text-only base. An adapter trained on another base is said once, with the count and
the first mismatches, and a fix that is true of the adapter's config (issue 26, item 8).
Boundary tests (layer and expert indices, dims, vocab) are in `tests/test_boundaries.py`; real
architectures against their own config and a variant in `tests/test_real_architectures.py`.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

import lora_guard as lg
from conftest_adapters import TINY_LLAMA, check, llama, messages, save
from lora_guard.testing import write_adapter

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

from peft import LoraConfig, PeftModel  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # PEFT's notes on saving

TINY_BASE = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
             "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 128}


def _trained_on_a_wider_base(folder: pathlib.Path, base_model: str | None) -> pathlib.Path:
    """q/k/v/o at hidden 96 (a wider model of the same architecture), checked against 64."""
    return write_adapter(folder, hidden_size=96, targets=("q_proj", "k_proj", "v_proj", "o_proj"),
                         config_overrides={"base_model_name_or_path": base_model})


@pytest.mark.lora_guard(allow=("LG109",))
def test_an_adapter_of_another_base_is_one_lg109_with_the_count_and_first_mismatches(
        tmp_path: pathlib.Path) -> None:
    folder = _trained_on_a_wider_base(tmp_path / "wide", "org/llama-96")
    report = lg.check_adapters(folder, lg.ServingLimits(base_config=TINY_BASE))
    assert report.codes() == ["LG109"]
    (said,) = report.violations
    assert "weights do not fit the base model's dims" in said.message
    assert said.details["count"] == sum(m["count"] for m in said.details["mismatches"])
    assert said.details["kinds"] == len(said.details["mismatches"]) > 3
    assert said.message.count(" where the base has ") == 3
    assert "in dim 96 where the base has 64 (hidden_size 64)" in said.message
    assert f"and {said.details['kinds'] - 3} more" in said.message
    assert "base_model_name_or_path" in said.hint  # it names one: look there
    json.dumps(report.to_dict())  # the mismatches are JSON


@pytest.mark.lora_guard(allow=("LG109",))
def test_a_single_mismatch_keeps_its_own_line(tmp_path: pathlib.Path) -> None:
    folder = write_adapter(tmp_path / "a", targets=("q_proj",))
    base = {**TINY_BASE, "head_dim": 20}  # q_proj's out dim 4 x 20: only that one differs
    report = lg.check_adapters(folder, lg.ServingLimits(base_config=base))
    assert [v.details.get("which") for v in report.violations] == ["out"]
    assert "has out dim 64, but q_proj on the base model has 80" in report.violations[0].message


@pytest.mark.lora_guard(allow=("LG109",))
@pytest.mark.parametrize("named", [None, ""])
def test_the_fix_does_not_point_at_an_empty_base_model_name(
        tmp_path: pathlib.Path, named: str | None) -> None:
    folder = _trained_on_a_wider_base(tmp_path / "wide", named)
    (said,) = lg.check_adapters(folder, lg.ServingLimits(base_config=TINY_BASE)).violations
    assert "see base_model_name_or_path" not in said.hint
    assert "does not say which" in said.hint


def test_adapter_from_a_larger_base_is_lg109(zoo: dict[str, pathlib.Path]) -> None:
    report = lg.check_adapters(zoo["larger-base"], lg.ServingLimits(base_config=zoo["base-llama"]))
    assert set(report.codes()) == {"LG109"}
    text = "\n".join(v.message for v in report.violations)
    assert "q_proj in dim 96 where the base has 64 (hidden_size 64)" in text
    assert "is for layer 2, but the base model has 2 layers" in text
    dims = next(v for v in report.violations if "mismatches" in v.details)  # said once
    assert {"which": "in", "got": 192, "module_kind": "down_proj", "expected": 128,
            "source": "intermediate_size 128"}.items() <= next(
        m for m in dims.details["mismatches"] if m["module_kind"] == "down_proj").items()
    err_free = lg.check_adapters(zoo["larger-base"])  # no base config: nothing to compare
    assert err_free.ok


def test_moe_adapter_fits_its_moe_base_and_not_a_dense_one(zoo: dict[str, pathlib.Path]) -> None:
    assert lg.check_adapters(zoo["moe-flat"], lg.ServingLimits(
        base_config=zoo["base-qwen3moe"])).ok
    report = lg.check_adapters(zoo["moe-flat"], lg.ServingLimits(base_config=zoo["base-llama"]))
    assert "LG109" in report.codes()
    assert any("the base config has no experts" in v.message for v in report.violations)


def test_moe_adapter_with_another_expert_count_is_lg109(
        tmp_path: pathlib.Path, zoo: dict[str, pathlib.Path]) -> None:
    folder = write_adapter(tmp_path / "e8", rank=4, moe_layout="flat", experts=8,
                           intermediate_size=32, targets=("gate_proj", "up_proj", "down_proj"))
    report = lg.check_adapters(folder, lg.ServingLimits(base_config=zoo["base-qwen3moe"]))
    assert report.codes() == ["LG109"]  # gate_up and down, said once
    (said,) = report.violations
    assert said.message.count("expert dim 8 where the base has 4") == 2
    per_expert = write_adapter(tmp_path / "pe", moe_layout="per-expert", experts=6,
                               intermediate_size=32, targets=("down_proj",))
    report = lg.check_adapters(per_expert, lg.ServingLimits(base_config=zoo["base-qwen3moe"]))
    assert "is for expert 4, but the base model has 4 experts" in report.violations[0].message


def test_a_multimodal_adapter_is_checked_against_its_language_model_only(
    tmp_path: pathlib.Path,
) -> None:
    """A LoRA on a vision-language model also adapts the vision tower, whose dims live in
    vision_config: only the language model's modules are compared with text_config."""
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    folder = tmp_path / "vlm-lora"
    folder.mkdir()
    lm = "base_model.model.model.language_model.layers.0.self_attn.q_proj"
    vision = "base_model.model.model.vision_tower.encoder.layers.5.self_attn.q_proj"
    tensors = {
        f"{lm}.lora_A.weight": torch.zeros(8, 64), f"{lm}.lora_B.weight": torch.zeros(64, 8),
        f"{vision}.lora_A.weight": torch.zeros(8, 48),
        f"{vision}.lora_B.weight": torch.zeros(48, 8),
    }
    safetensors_torch.save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}))
    base = {"model_type": "vlm", "text_config": TINY_LLAMA,
            "vision_config": {"hidden_size": 48, "num_hidden_layers": 12}}

    assert lg.check_adapters([folder], lg.ServingLimits(base_config=base)).ok

    narrower = {**base, "text_config": {**TINY_LLAMA, "hidden_size": 32}}
    report = lg.check_adapters([folder], lg.ServingLimits(base_config=narrower))
    assert report.violations and {v.code for v in report.violations} == {"LG109"}
    assert all("language_model" in v.message for v in report.violations)


def _llava() -> Any:
    vision = transformers.CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        image_size=32, patch_size=8, projection_dim=32)
    config = transformers.LlavaConfig(
        text_config=transformers.LlamaConfig(**TINY_LLAMA).to_dict(),
        vision_config=vision.to_dict(), image_token_index=3)
    torch.manual_seed(0)
    return transformers.LlavaForConditionalGeneration(config), config


def test_vision_tower_weights_on_a_text_only_base_are_lg109(tmp_path: pathlib.Path) -> None:
    """A LoRA trained on LLaVA adapts the CLIP tower too; served on the text-only Llama
    it was built on, the tower weights apply to nothing."""
    model, config = _llava()
    folder = save(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]), tmp_path / "vlm")

    assert check(folder, base_config=config.to_dict()).ok  # on its own multimodal base
    report = check(folder, base_config={**TINY_LLAMA, "model_type": "llama"})

    assert set(report.codes()) == {"LG109"}
    text = messages(report)
    assert "vision_tower" in text and "adapts a vision tower" in text
    assert "no vision_config" in text
    assert "multimodal base model" in report.violations[0].hint


def test_gpt2_module_names_on_a_llama_base_are_lg109_even_when_the_sizes_match(
        tmp_path: pathlib.Path) -> None:
    """GPT-2's c_fc maps hidden 64 to 4 x 64 = 256, exactly a Llama MLP of intermediate 256:
    every size fits, but no Llama module is called c_fc, so nothing would apply it."""
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64, bos_token_id=0,
        eos_token_id=0))
    folder = save(gpt2, LoraConfig(r=8, target_modules=["c_fc"], fan_in_fan_out=True),
                  tmp_path / "gpt2")
    base = {**TINY_LLAMA, "intermediate_size": 256, "model_type": "llama"}

    report = check(folder, base_config=base)

    assert report.codes() == ["LG109"]
    text = messages(report)
    assert "transformer.h.0.mlp.c_fc (and 1 more) is not a module of the base model's " \
           "architecture (llama" in text
    assert "named like q_proj, k_proj, v_proj, o_proj" in text
    gpt2_base = gpt2.config.to_dict()
    assert check(folder, base_config=gpt2_base).ok  # on its own architecture


def test_peft_loading_a_4_layer_adapter_into_a_2_layer_model_is_lg109(
        tmp_path: pathlib.Path) -> None:
    from lora_guard.integrations import peft as peft_guard

    folder = save(llama(num_hidden_layers=4), LoraConfig(r=8, target_modules=["q_proj"]),
                  tmp_path / "deep")
    was = peft_guard.INTEGRATION.instrumented  # the session's instrumentation stays as it was
    peft_guard.instrument()
    try:
        with pytest.raises(lg.AdapterError) as caught:
            PeftModel.from_pretrained(llama(), str(folder))
    finally:
        if not was:
            peft_guard.uninstrument()
    assert caught.value.code == "LG109"
    assert "layers.3.self_attn.q_proj.lora_A.weight (and 1 more) is for layer 3, but the " \
           "base model has 2 layers" in str(caught.value)
