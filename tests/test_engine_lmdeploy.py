"""`--engine lmdeploy`: lmdeploy 0.18.0's PyTorch engine, on adapters PEFT itself saves.

The verdicts are the real engine's (tests/engines/test_lmdeploy_agreement.py runs lmdeploy's
own ``add_adapters`` on every corpus adapter: docs/engines/compatibility.md); here the profile
is driven as a user drives it: `ServingLimits.for_engine`, ``lora-guard check --engine`` and a
pasted ``lmdeploy serve api_server`` command.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

import lora_guard as lg
from lora_guard._checking.engines import EngineOptionError, parse_serve_command
from lora_guard._checking.engines.lmdeploy import PEFT_0_14_LORA_KEYS
from lora_guard._frontends.cli import main

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

LIMITS = lg.ServingLimits.for_engine("lmdeploy")


def _save(root: pathlib.Path, name: str, *, peft_0_14: bool = True,
          **lora: Any) -> pathlib.Path:
    """A real PEFT adapter on a tiny Llama; with ``peft_0_14`` its config holds only the keys
    PEFT 0.14 (lmdeploy's pinned peft) writes, as an adapter saved with it has."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=128)
    lora.setdefault("target_modules", ["q_proj", "v_proj"])
    model = peft.get_peft_model(transformers.LlamaForCausalLM(config), peft.LoraConfig(**lora))
    path = root / name
    model.save_pretrained(str(path))
    if peft_0_14:
        saved = json.loads((path / "adapter_config.json").read_text())
        (path / "adapter_config.json").write_text(json.dumps(
            {k: v for k, v in saved.items() if k in PEFT_0_14_LORA_KEYS}))
    return path


def _violations(path: pathlib.Path) -> list[lg.Violation]:
    return list(lg.check_adapters(path, LIMITS).violations)


def test_an_adapter_saved_by_a_current_peft_is_refused_with_the_keys_peft_0_14_drops(
        tmp_path: pathlib.Path) -> None:
    found = _violations(_save(tmp_path, "current", peft_0_14=False))
    assert [v.code for v in found] == ["LG202"]
    assert "adapter_config.json has keys PEFT 0.14 does not know (alora_invocation_tokens, " \
        in found[0].message
    assert "lmdeploy==0.18.0 reads configs with its pinned peft<=0.14.0" in found[0].message
    assert found[0].hint.startswith("For lmdeploy, keep only the keys PEFT 0.14 knows")


def test_the_same_adapter_in_peft_0_14_form_serves_at_any_rank(tmp_path: pathlib.Path) -> None:
    assert _violations(_save(tmp_path, "r8")) == []
    assert _violations(_save(tmp_path, "r64", r=64)) == []  # no rank cap: buffers sum ranks


def test_target_modules_as_a_string_or_one_module_named_twice_is_refused(
        tmp_path: pathlib.Path) -> None:
    regex = _save(tmp_path, "regex", target_modules=r".*\.(q_proj|v_proj)")
    [found] = _violations(regex)
    assert found.code == "LG202" and "read letter by letter" in found.message
    # PEFT expands "all-linear" into one full path per layer: o_proj/down_proj twice
    everything = _save(tmp_path, "all-linear", target_modules="all-linear")
    [found] = _violations(everything)
    assert found.code == "LG202"
    assert "names down_proj twice" in found.message or "names o_proj twice" in found.message
    assert found.hint.startswith("For lmdeploy, give each module once")
    # packed parts named by full paths are fine: q/k/v and gate/up share a packed module
    paths = [f"model.layers.{i}.self_attn.q_proj" for i in range(2)]
    assert _violations(_save(tmp_path, "paths", target_modules=paths)) == []


def test_what_lmdeploy_serves_wrongly_or_fails_on_is_refused(tmp_path: pathlib.Path) -> None:
    def codes(name: str, **lora: Any) -> list[str]:
        return lg.check_adapters(_save(tmp_path, name, **lora), LIMITS).codes()

    assert codes("rslora", use_rslora=True) == ["LG112"]          # served at alpha / r
    assert codes("alpha", alpha_pattern={"v_proj": 32}) == ["LG112"]
    assert codes("rank-pattern", r=8, rank_pattern={"q_proj": 16}) == ["LG112"]  # start fails
    # PEFT saves lm_head's full weight with an lm_head target: lmdeploy asserts on the key
    assert "LG104" in codes("lm-head", target_modules=["q_proj", "lm_head"])
    assert codes("dora", use_dora=True) == ["LG105"]


def test_a_pasted_serve_command_gives_the_adapters_and_the_release() -> None:
    cmd = parse_serve_command(["lmdeploy", "serve", "api_server", "/m/llama", "--backend",
                               "pytorch", "--adapters", "sql=/a/sql", "chat=/a/chat",
                               "--tp", "2"])
    assert cmd.settings.release.label == "lmdeploy==0.18.0"
    assert cmd.adapters == (("sql", "/a/sql"), ("chat", "/a/chat"))
    assert cmd.model == "/m/llama"
    one = parse_serve_command(["lmdeploy", "serve", "api_server", "/m", "--adapters", "/a/x"])
    assert one.adapters == (("default", "/a/x"),)  # lmdeploy/cli/utils.py:get_lora_adapters


def test_adapters_on_turbomind_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(EngineOptionError, match="give --backend pytorch"):
        parse_serve_command(["lmdeploy", "serve", "api_server", "/m", "--backend", "turbomind",
                             "--adapters", "sql=/a/sql"])
    assert main(["check", "--", "lmdeploy", "serve", "api_server", "/m", "--backend",
                 "turbomind", "--adapters", "sql=/a/sql"]) == 2
    assert "TurboMind without them" in capsys.readouterr().err
