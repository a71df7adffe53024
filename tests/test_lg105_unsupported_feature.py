"""LG105 (unsupported-feature): a config feature the server does not serve (DoRA, a LoRA bias,
trained biases, modules_to_save, trainable tokens, layer replication), unless allowed.

The fix names the feature found and the `--allow` / `allow=` that accepts it.

`bias="all"` / `"lora_only"` is refused for sglang only where the adapter holds bias tensors.
sglang reads no bias: an adapter whose training changed the base's biases (PEFT saves them with
the adapter) is served without them, and `lora-guard check --engine sglang` refuses it (LG105).
On a base without biases PEFT saves none: the flag alone changes nothing sglang serves (the
engine tier measures both, `tests/engines/test_sglang_equivalence.py`). vLLM refuses the flag
itself, so its profile refuses both.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from peft import LoraConfig  # noqa: E402

import lora_guard as lg  # noqa: E402
from conftest_adapters import check, llama, messages, save  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # PEFT's notes on saving


def _trained(path: pathlib.Path, *, biased_base: bool, bias: str) -> pathlib.Path:
    """A fine-tune as a user runs it: LoRA on q/v with ``bias``, the biases trained too."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, attention_bias=biased_base)
    model: Any = peft.get_peft_model(
        transformers.LlamaForCausalLM(config),
        peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"], bias=bias))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".bias") and parameter.requires_grad:
                parameter.add_(0.1)  # what training does to them
    model.save_pretrained(str(path))
    return path


def _codes(path: pathlib.Path, engine: str) -> list[str]:
    return lg.check_adapters([path], lg.ServingLimits.for_engine(engine)).codes()


@pytest.mark.parametrize("bias", ["all", "lora_only"])
def test_sglang_refuses_saved_trained_biases_and_accepts_the_flag_alone(
        tmp_path: pathlib.Path, bias: str) -> None:
    trained = _trained(tmp_path / "trained", biased_base=True, bias=bias)
    flag_only = _trained(tmp_path / "flag-only", biased_base=False, bias=bias)
    assert lg.inspect_adapter(trained).extra_keys, "PEFT saved the trained biases"
    assert not lg.inspect_adapter(flag_only).extra_keys, "no bias to save"

    assert _codes(trained, "sglang") == ["LG105"]
    report = lg.check_adapters([trained], lg.ServingLimits.for_engine("sglang"))
    assert "trained biases" in report.violations[0].message
    assert _codes(flag_only, "sglang") == []
    # vLLM refuses the flag itself (PEFTHelper: "Adapter bias is not supported")
    assert _codes(trained, "vllm") == ["LG105"]
    assert _codes(flag_only, "vllm") == ["LG105"]


@pytest.mark.parametrize(
    ("name", "feature"),
    [("dora", "dora"), ("lora-bias", "lora_bias"), ("modules-to-save", "modules_to_save"),
     ("trainable-tokens", "trainable_tokens")],
)
def test_features_are_lg105_unless_allowed(
    zoo: dict[str, pathlib.Path], name: str, feature: str
) -> None:
    report = lg.check_adapters(zoo[name])
    assert report.codes() == ["LG105"]
    assert report.violations[0].details["allow_name"] == feature
    assert lg.check_adapters(zoo[name], lg.ServingLimits(allow={feature})).ok


def test_modules_to_save_weights_are_named_with_their_bytes(tmp_path: pathlib.Path) -> None:
    folder = save(llama(), LoraConfig(r=8, target_modules=["q_proj"],
                                      modules_to_save=["lm_head"]), tmp_path / "head")

    report = check(folder)

    assert report.codes() == ["LG105"]
    text = messages(report)
    assert "lm_head.weight (128, 64) (32,768 bytes, " in text
    assert "--allow modules_to_save" in report.violations[0].hint
    assert check(folder, allow={"modules_to_save"}).ok


@pytest.mark.parametrize(("edit", "feature", "allow_name"), [
    ({"use_dora": True}, "DoRA", "dora"),
    ({"lora_bias": True}, "a LoRA bias", "lora_bias"),
    ({"bias": "all"}, "trained biases", "bias"),
    ({"layer_replication": [[0, 2]]}, "layer replication", "layer_replication"),
])
def test_lg105s_fix_names_the_feature_found(tmp_path: pathlib.Path, edit: dict[str, Any],
                                            feature: str, allow_name: str) -> None:
    folder = save(llama(), LoraConfig(r=8, target_modules=["q_proj"]), tmp_path / allow_name)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, **edit}))

    report = check(folder)

    assert report.codes() == ["LG105"]
    hint = report.violations[0].hint
    assert f"Retrain without {feature}" in hint
    assert f"--allow {allow_name}" in hint and f"allow={{'{allow_name}'}}" in hint
    assert "dora" not in hint or allow_name == "dora"
    assert check(folder, allow={allow_name}).ok
