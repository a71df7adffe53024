"""check_adapters on adapters PEFT saves for real transformers architectures.

A user trains a LoRA on a model (Llama, Gemma, Phi-3, GPT-2, Mixtral, Qwen MoE, a vision-language
model, ...) and checks it with ``lora-guard check --base-config config.json`` before serving:

- against the config of the model it was trained on, the check is silent (no false alarm);
- against a variant of the same architecture (wider, more experts, fewer layers), it says LG109
  and names the config dims the adapter does not fit.

Each tiny model is built once from a config (no download) and its adapter saved by PEFT itself.
"""

from __future__ import annotations

import json
import pathlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

import lora_guard as lg
from lora_guard._frontends.cli import main

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

TEXT: dict[str, Any] = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
    "max_position_embeddings": 64,
}
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]


def _config(class_name: str, **defaults: Any) -> Callable[..., Any]:
    """A config factory: the tiny config, with overrides for a variant."""
    def make(**overrides: Any) -> Any:
        config_class = getattr(transformers, class_name, None)
        if config_class is None:
            pytest.skip(f"transformers {transformers.__version__} has no {class_name}")
        return config_class(**{**TEXT, **defaults, **overrides})
    return make


def _gpt2(**overrides: Any) -> Any:
    return transformers.GPT2Config(**{
        "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 128, "n_positions": 64,
        "bos_token_id": 0, "eos_token_id": 0, **overrides})


def _llava(**text: Any) -> Any:
    vision = transformers.CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        image_size=32, patch_size=8, projection_dim=32)
    return transformers.LlavaConfig(
        text_config=transformers.LlamaConfig(**{**TEXT, **text}).to_dict(),
        vision_config=vision.to_dict(), image_token_index=3)


def _qwen2_vl(**text: Any) -> Any:
    if not hasattr(transformers, "Qwen2VLConfig"):
        pytest.skip(f"transformers {transformers.__version__} has no Qwen2VLConfig")
    return transformers.Qwen2VLConfig(
        text_config={**TEXT, **text, "bos_token_id": 0, "eos_token_id": 0,
                     "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}},
        vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2,
                       "mlp_ratio": 2, "patch_size": 4, "spatial_merge_size": 2,
                       "temporal_patch_size": 2, "in_channels": 3},
        image_token_id=5, video_token_id=6, vision_start_token_id=7)


@dataclass(frozen=True)
class Arch:
    """One architecture: how to build it, what the LoRA targets, and a variant it must not fit."""

    model: str
    config: Callable[..., Any]
    target_modules: list[str] | str
    target_parameters: list[str] | None = None
    variant: dict[str, Any] = field(default_factory=dict)
    """Overrides giving a bigger model of the same architecture."""
    mismatch: tuple[str, ...] = ()
    """What the LG109 messages against the variant must name."""


ARCHS: dict[str, Arch] = {
    "llama": Arch("LlamaForCausalLM", _config("LlamaConfig"),
                  [*ATTENTION, *MLP, "embed_tokens", "lm_head"],
                  variant={"hidden_size": 128},
                  mismatch=("in dim 64", "hidden_size 128", "num_attention_heads 4 x head_dim 32")),
    "mistral": Arch("MistralForCausalLM", _config("MistralConfig"), "all-linear",
                    variant={"intermediate_size": 256},
                    mismatch=("out dim 128", "intermediate_size 256")),
    "qwen2": Arch("Qwen2ForCausalLM", _config("Qwen2Config"), [*ATTENTION, *MLP, "embed_tokens"],
                  variant={"num_key_value_heads": 4},
                  mismatch=("out dim 32", "num_key_value_heads 4 x head_dim 16")),
    # explicit head_dim 32, not hidden_size / heads = 16
    "qwen3": Arch("Qwen3ForCausalLM", _config("Qwen3Config", head_dim=32), "all-linear",
                  variant={"head_dim": 64},
                  mismatch=("num_attention_heads 4 x head_dim 64",
                            "num_key_value_heads 2 x head_dim 64")),
    "gemma2": Arch("Gemma2ForCausalLM", _config("Gemma2Config", head_dim=32),
                   [*ATTENTION, *MLP, "embed_tokens"],
                   variant={"hidden_size": 128}, mismatch=("hidden_size 128",)),
    "gemma3": Arch("Gemma3ForCausalLM", _config("Gemma3TextConfig", head_dim=32),
                   [*ATTENTION, *MLP, "embed_tokens"],
                   variant={"vocab_size": 256}, mismatch=("vocab dim 128", "vocab is 256")),
    # fused qkv_proj and gate_up_proj
    "phi3": Arch("Phi3ForCausalLM", _config("Phi3Config", pad_token_id=0, bos_token_id=0,
                                            eos_token_id=0), "all-linear",
                 variant={"intermediate_size": 256, "num_key_value_heads": 4},
                 mismatch=("2 x intermediate_size 256", "qkv_proj",
                           "(num_attention_heads 4 x head_dim 16) + 2 x (num_key_value_heads 4")),
    # Conv1D c_attn / c_fc / c_proj, and the wte embedding
    "gpt2": Arch("GPT2LMHeadModel", _gpt2, ["c_attn", "c_proj", "c_fc", "wte"],
                 variant={"n_embd": 128, "n_head": 4},
                 mismatch=("hidden_size 128", "c_attn", "c_fc", "4 x n_embd 128 = 512")),
    # transformers 5 fuses the experts: PEFT turns w1/w2/w3 and the router into
    # target_parameters with a doubled rank for gate_up_proj (rank_pattern)
    "mixtral": Arch("MixtralForCausalLM", _config("MixtralConfig", num_local_experts=4,
                                                  num_experts_per_tok=2),
                    [*ATTENTION, "w1", "w2", "w3", "gate", "embed_tokens"],
                    variant={"num_local_experts": 8},
                    mismatch=("expert dim 4", "num_experts 8")),
    "qwen2_moe": Arch("Qwen2MoeForCausalLM", _config(
        "Qwen2MoeConfig", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=96), [*ATTENTION, *MLP, "embed_tokens"],
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
        variant={"shared_expert_intermediate_size": 192, "moe_intermediate_size": 64},
        mismatch=("shared_expert_intermediate_size 192", "2 x moe_intermediate_size 64")),
    "qwen3_moe": Arch("Qwen3MoeForCausalLM", _config(
        "Qwen3MoeConfig", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
        "all-linear", target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
        variant={"moe_intermediate_size": 64, "num_hidden_layers": 1},
        mismatch=("moe_intermediate_size 64", "layer 1, but the base model has 1 layers")),
    # vision-language: the language model's dims come from text_config, towers are skipped
    "llava": Arch("LlavaForConditionalGeneration", _llava, "all-linear",
                  variant={"hidden_size": 128}, mismatch=("hidden_size 128",)),
    "qwen2_vl": Arch("Qwen2VLForConditionalGeneration", _qwen2_vl, "all-linear",
                     variant={"num_hidden_layers": 1}, mismatch=("has 1 layers",)),
}


@dataclass(frozen=True)
class Trained:
    adapter: pathlib.Path
    base_config: pathlib.Path
    arch: Arch


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Trained]:
    """The adapter PEFT saves for an architecture, and the base model's config.json; built once."""
    import torch

    built: dict[str, Trained] = {}

    def get(name: str) -> Trained:
        if name not in built:
            arch = ARCHS[name]
            model_class = getattr(transformers, arch.model, None)
            if model_class is None:
                pytest.skip(f"transformers {transformers.__version__} has no {arch.model}")
            torch.manual_seed(0)
            model = model_class(arch.config())
            options: dict[str, Any] = {"r": 8, "target_modules": arch.target_modules}
            if arch.target_parameters:
                options["target_parameters"] = arch.target_parameters
            root = tmp_path_factory.mktemp(name)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # PEFT's notes on tied and Conv1D layers
                peft.get_peft_model(model, peft.LoraConfig(**options)).save_pretrained(
                    root / "adapter")
            model.config.save_pretrained(root / "base")
            built[name] = Trained(root / "adapter", root / "base" / "config.json", arch)
        return built[name]

    return get


@pytest.mark.parametrize("name", list(ARCHS))
def test_the_adapter_fits_the_model_it_was_trained_on(
        name: str, trained: Callable[[str], Trained]) -> None:
    adapter = trained(name)
    spec = lg.inspect_adapter(adapter.adapter)
    assert spec.modules, "PEFT saved no LoRA module"
    report = lg.check_adapters([adapter.adapter], lg.ServingLimits(
        base_config=adapter.base_config))
    assert report.ok, [str(v) for v in report.violations]


@pytest.mark.parametrize("name", list(ARCHS))
def test_a_bigger_variant_of_the_architecture_is_lg109_naming_the_dims(
        name: str, trained: Callable[[str], Trained], tmp_path: pathlib.Path) -> None:
    adapter = trained(name)
    variant = tmp_path / "config.json"
    adapter.arch.config(**adapter.arch.variant).to_json_file(variant)
    report = lg.check_adapters([adapter.adapter], lg.ServingLimits(base_config=variant))
    assert not report.ok
    assert set(report.codes()) == {"LG109"}, [str(v) for v in report.violations]
    messages = "\n".join(str(v) for v in report.violations)
    messages += "".join(  # the mismatches past the first few that an LG109 message names
        f"\n{m['key']} {m['module_kind']} {m['which']} dim {m['got']}: {m['source']}"
        for v in report.violations for m in v.details.get("mismatches", ()))
    for expected in adapter.arch.mismatch:
        assert expected in messages


def test_moe_experts_are_read_with_the_rank_pattern_peft_wrote(
        trained: Callable[[str], Trained]) -> None:
    # PEFT fuses Mixtral's w1 and w3 into gate_up_proj and doubles its rank in rank_pattern
    adapter = trained("mixtral")
    config = json.loads((adapter.adapter / "adapter_config.json").read_text())
    assert any("gate_up_proj" in key for key in config["rank_pattern"])
    experts = {m.target: m for m in lg.inspect_adapter(adapter.adapter).modules.values()
               if m.kind == "moe-flat" and m.layer == 0}
    assert sorted(experts) == ["down_proj", "gate_up_proj"]
    assert (experts["gate_up_proj"].rank, experts["gate_up_proj"].experts) == (16, 4)
    assert (experts["down_proj"].rank, experts["down_proj"].experts) == (8, 4)


def test_the_cli_passes_a_real_adapter_and_fails_it_on_a_wider_model(
        trained: Callable[[str], Trained], tmp_path: pathlib.Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    adapter = trained("phi3")
    assert main(["check", str(adapter.adapter), "--base-config", str(adapter.base_config),
                 "--no-progress"]) == 0
    wider = tmp_path / "config.json"
    adapter.arch.config(hidden_size=128).to_json_file(wider)
    capsys.readouterr()
    assert main(["check", str(adapter.adapter), "--base-config", str(wider),
                 "--no-progress"]) != 0
    assert "LG109" in capsys.readouterr().out


def test_a_per_expert_mixtral_adapter_fits_its_model(tmp_path: pathlib.Path) -> None:
    # transformers 4 had one nn.Linear per expert (block_sparse_moe.experts.N.w1/w2/w3);
    # transformers 5 fuses them into 3D parameters, so PEFT can no longer save that layout
    model = transformers.MixtralForCausalLM(ARCHS["mixtral"].config())
    if not any(name.endswith(".experts.0.w1") for name, _ in model.named_modules()):
        pytest.skip(f"transformers {transformers.__version__} fuses Mixtral's experts; "
                    "no per-expert w1/w2/w3 modules to target")
    peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=["w1", "w2", "w3"])
                        ).save_pretrained(tmp_path / "adapter")
    model.config.save_pretrained(tmp_path / "base")
    report = lg.check_adapters([tmp_path / "adapter"], lg.ServingLimits(
        base_config=tmp_path / "base" / "config.json"))
    assert report.ok, [str(v) for v in report.violations]
