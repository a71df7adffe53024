"""`lora-guard check --engine vllm|sglang|peft`: each engine's rules, on real PEFT adapters.

Each adapter is made by PEFT itself (tiny LlamaConfig models, `get_peft_model(...)
.save_pretrained`), as the user's training job would, and checked as the user checks it: with
the engine's own flags after `--`, a pasted serve command, or `ServingLimits.for_engine`.
"""

from __future__ import annotations

import json
import pathlib
import shutil
from typing import Any

import pytest

import lora_guard as lg
from lora_guard._checking.engines import profile
from lora_guard._frontends.cli import main

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

TARGETS = ["q_proj", "k_proj", "v_proj"]


def _config() -> Any:
    return transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128)


def _save(root: pathlib.Path, name: str, *, head: str = "causal", dtype: Any = None,
          **lora: Any) -> pathlib.Path:
    torch.manual_seed(0)
    model_class = (transformers.LlamaForSequenceClassification if head == "seq-cls"
                   else transformers.LlamaForCausalLM)
    lora.setdefault("target_modules", TARGETS)
    lora.setdefault("r", 8)
    model = peft.get_peft_model(model_class(_config()), peft.LoraConfig(**lora))
    if dtype is not None:
        model = model.to(dtype)
    path = root / name
    model.save_pretrained(str(path))
    return path


def _save_embedding_layers(root: pathlib.Path, name: str) -> pathlib.Path:
    """LoRA on q/k/v, saved with save_embedding_layers=True: PEFT adds the full embed_tokens
    and lm_head weights, keyed by the modules themselves (they are no LoRA target)."""
    torch.manual_seed(0)
    model = peft.get_peft_model(transformers.LlamaForCausalLM(_config()),
                                peft.LoraConfig(r=8, target_modules=TARGETS))
    path = root / name
    model.save_pretrained(str(path), save_embedding_layers=True)
    return path


def _save_added_tokens(root: pathlib.Path, name: str, tokens: dict[str, int]) -> pathlib.Path:
    """A fine-tune that added tokens: the tokenizer grew, the model's embeddings were resized
    to it, LoRA on q/k/v; the adapter saved with the tokenizer's added_tokens.json."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_config())
    model.resize_token_embeddings(max(128, max(tokens.values()) + 1))
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=TARGETS))
    path = root / name
    model.save_pretrained(str(path))
    (path / "added_tokens.json").write_text(json.dumps(tokens))
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    """The adapters users train, each saved by PEFT."""
    root = tmp_path_factory.mktemp("engine-adapters")
    with _quiet():
        found = {
            "plain": _save(root, "plain"),
            "r32": _save(root, "r32", r=32),
            "fp16": _save(root, "fp16", dtype=torch.float16),
            "rank-pattern-k4": _save(root, "rank-pattern-k4", rank_pattern={"k_proj": 4}),
            "rank-pattern-k32": _save(root, "rank-pattern-k32", rank_pattern={"k_proj": 32}),
            "rank-pattern-layer": _save(root, "rank-pattern-layer",
                                        rank_pattern={"layers.1.self_attn.q_proj": 4,
                                                      "layers.1.self_attn.k_proj": 4,
                                                      "layers.1.self_attn.v_proj": 4},
                                        alpha_pattern={"layers.1.self_attn.q_proj": 4,
                                                       "layers.1.self_attn.k_proj": 4,
                                                       "layers.1.self_attn.v_proj": 4}),
            "rslora": _save(root, "rslora", use_rslora=True),
            "alpha-pattern": _save(root, "alpha-pattern", alpha_pattern={"v_proj": 32}),
            "dora": _save(root, "dora", use_dora=True),
            "lora-bias": _save(root, "lora-bias", lora_bias=True),
            "bias-all": _save(root, "bias-all", bias="all"),
            "lm-head-saved": _save(root, "lm-head-saved", modules_to_save=["lm_head"]),
            "seq-cls": _save(root, "seq-cls", head="seq-cls", task_type="SEQ_CLS"),
            "mlp": _save(root, "mlp", target_modules=["gate_proj", "up_proj", "down_proj"]),
            "o-proj": _save(root, "o-proj", target_modules=["q_proj", "o_proj"]),
            "pissa": _save(root, "pissa", init_lora_weights="pissa"),
            "pissa-niter": _save(root, "pissa-niter", init_lora_weights="pissa_niter_2"),
        }
        found["added-tokens"] = _save_added_tokens(root, "added-tokens",
                                                   {"<sql>": 128, "</sql>": 129})
        found["saved-embeddings"] = _save_embedding_layers(root, "saved-embeddings")
        # a tokenizer save copies the base tokenizer's own added tokens (ids below the vocab)
        found["added-tokens-copied"] = _save_added_tokens(root, "added-tokens-copied",
                                                          {"<|pad|>": 0, "<|eot|>": 127})
    base = root / "base"
    config = _config()
    config.torch_dtype = torch.bfloat16
    config.save_pretrained(str(base))
    found["base"] = base
    return found


class _quiet:
    """PEFT warns about some of these adapters (lora_bias shapes, PiSSA): not the subject."""

    def __enter__(self) -> None:
        import warnings

        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc: Any) -> None:
        self._catch.__exit__(*exc)


def check(made: dict[str, pathlib.Path], *names: str, engine: str,
          **options: Any) -> list[str]:
    limits = lg.ServingLimits.for_engine(engine, base_config=made["base"] / "config.json",
                                         **options)
    return lg.check_adapters([made[n] for n in names], limits).codes()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["check", "--isolated", "--no-progress", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# --- vLLM ----------------------------------------------------------------------------------


def test_vllm_max_lora_rank_defaults_to_16(made: dict[str, pathlib.Path],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, str(made["r32"]), "--engine", "vllm")
    assert code == 1 and "rank 32" in out and "max rank 16" in out
    code, out, _ = run(capsys, str(made["r32"]), "--engine", "vllm", "--",
                       "--max-lora-rank", "32")
    assert code == 0, out


def test_vllm_max_lora_rank_takes_only_the_ranks_its_parser_takes(
        made: dict[str, pathlib.Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, str(made["plain"]), "--engine", "vllm", "--",
                       "--max-lora-rank", "24")
    assert code == 2
    assert "--max-lora-rank '24': not one of 1, 8, 16, 32, 64, 128, 256, 320, 512" in err


def test_vllm_counts_rank_pattern_against_max_lora_rank(made: dict[str, pathlib.Path]) -> None:
    assert check(made, "rank-pattern-k32", engine="vllm") == ["LG101"]
    assert check(made, "rank-pattern-k32", engine="vllm", max_lora_rank=32) == []
    # vLLM keeps q/k/v apart and honours rank_pattern, alpha_pattern and rsLoRA
    assert check(made, "rank-pattern-k4", "rslora", "alpha-pattern", engine="vllm") == []


def test_vllm_casts_an_fp16_adapter_to_the_bf16_model(made: dict[str, pathlib.Path]) -> None:
    assert lg.inspect_adapter(made["fp16"]).dtypes == ("float16",)
    assert check(made, "fp16", engine="vllm") == []
    assert check(made, "fp16", engine="vllm", lora_dtype="bfloat16") == []


def test_vllm_serves_the_sequence_classification_head(made: dict[str, pathlib.Path]) -> None:
    assert check(made, "seq-cls", engine="vllm") == []
    assert check(made, "lm-head-saved", engine="vllm") == ["LG105"]
    # the engine-agnostic default does not know which heads a server serves
    assert lg.check_adapters(made["seq-cls"]).codes() == ["LG105"]


def _base(tmp_path: pathlib.Path, config: Any, *architectures: str) -> pathlib.Path:
    config.architectures = list(architectures)
    config.save_pretrained(str(tmp_path / "base"))
    return tmp_path / "base" / "config.json"


def test_vllm_serves_a_classification_head_only_on_a_pooling_model(
        made: dict[str, pathlib.Path], tmp_path: pathlib.Path) -> None:
    # A SEQ_CLS adapter on `vllm serve meta-llama/...` (a generator: no classifier to load
    # `score` into): vLLM's _validate_classification_head_lora fails the load.
    causal = _base(tmp_path, _config(), "LlamaForCausalLM")
    limits = lg.ServingLimits.for_engine("vllm", base_config=causal)
    report = lg.check_adapters(made["seq-cls"], limits)
    assert report.codes() == ["LG105"] and "score" in report.violations[0].message
    for flags in (("--runner", "pooling"), ("--convert", "classify")):
        limits = lg.ServingLimits.for_engine("vllm", *flags, base_config=causal)
        assert lg.check_adapters(made["seq-cls"], limits).ok, flags
    classifier = _base(tmp_path / "cls", _config(), "LlamaForSequenceClassification")
    assert lg.check_adapters(made["seq-cls"], lg.ServingLimits.for_engine(
        "vllm", base_config=classifier)).ok


def test_vllm_loads_packed_weight_names_only_on_a_base_that_has_them(
        tmp_path: pathlib.Path) -> None:
    # A Phi-3 adapter (qkv_proj, gate_up_proj) served on a Llama of the same dims: vLLM
    # expects q_proj/k_proj/v_proj weights there and refuses the load; sglang stacks q/k/v
    # into qkv_proj itself and serves it.
    phi3 = transformers.Phi3Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, pad_token_id=0)
    model = peft.get_peft_model(transformers.Phi3ForCausalLM(phi3), peft.LoraConfig(
        r=8, target_modules=["qkv_proj", "gate_up_proj"]))
    model.save_pretrained(str(tmp_path / "phi3-lora"))
    adapter = tmp_path / "phi3-lora"
    llama = _base(tmp_path / "llama", _config(), "LlamaForCausalLM")
    report = lg.check_adapters(adapter, lg.ServingLimits.for_engine("vllm", base_config=llama))
    assert report.codes() == ["LG109"] and "gate_up_proj" in report.violations[0].message
    assert lg.check_adapters(adapter, lg.ServingLimits.for_engine(
        "sglang", base_config=llama)).ok
    on_phi3 = _base(tmp_path / "phi3", phi3, "Phi3ForCausalLM")
    assert lg.check_adapters(adapter, lg.ServingLimits.for_engine(
        "vllm", base_config=on_phi3)).ok


def test_vllm_refuses_what_its_peft_helper_refuses(made: dict[str, pathlib.Path]) -> None:
    for name in ("dora", "lora-bias", "bias-all"):
        assert check(made, name, engine="vllm") == ["LG105"], name
    assert check(made, "pissa", engine="vllm") == ["LG116"]


def test_vllm_max_loras_is_slots_per_batch_not_a_limit_on_the_set(
        made: dict[str, pathlib.Path], tmp_path: pathlib.Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    for i in range(20):
        shutil.copytree(made["plain"], tmp_path / f"a{i:02d}")
    code, out, _ = run(capsys, str(tmp_path), "--engine", "vllm")  # max_loras 1 by default
    assert code == 0, out
    limits = lg.ServingLimits.for_engine("vllm")
    assert limits.engine_options["max_loras"] == 1 and limits.engine_options[
        "max_cpu_loras"] is None and limits.max_loras is None


def test_vllm_refuses_max_cpu_loras_below_max_loras(
        made: dict[str, pathlib.Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, str(made["plain"]), "--engine", "vllm", "--",
                       "--max-loras", "4", "--max-cpu-loras", "2")
    assert code == 2 and "--max-cpu-loras (2) must be >= --max-loras (4)" in err


def test_vllm_packed_target_serves_its_parts_and_the_reverse(
        made: dict[str, pathlib.Path]) -> None:
    assert check(made, "plain", engine="vllm", lora_target_modules=["qkv_proj"]) == []
    assert check(made, "mlp", engine="vllm", lora_target_modules=["gate_up_proj",
                                                                 "down_proj"]) == []
    # vLLM wraps the whole qkv_proj when any part is targeted (utils.is_in_target_modules)
    assert check(made, "plain", engine="vllm", lora_target_modules=["q_proj"]) == []
    # o_proj outside the filter is not wrapped: its weights would be ignored
    assert check(made, "o-proj", engine="vllm", lora_target_modules=["qkv_proj"]) == ["LG104"]


def test_default_learns_packed_names_and_no_longer_calls_a_cast_dtype_an_error(
        made: dict[str, pathlib.Path]) -> None:
    limits = lg.ServingLimits(target_modules=("qkv_proj",), base_config=made["base"])
    assert lg.check_adapters(made["plain"], limits).ok
    assert lg.check_adapters(made["fp16"], lg.ServingLimits(base_config=made["base"])).ok
    # the default is strict where a custom server may not pack: one part does not serve all
    assert lg.check_adapters(made["plain"], lg.ServingLimits(
        target_modules=("q_proj",))).codes() == ["LG104", "LG104"]  # k_proj, v_proj
    # and --dtypes still says what a server that does not cast takes
    assert lg.check_adapters(made["fp16"], lg.ServingLimits(dtypes=("bf16",))).codes() == [
        "LG106"]


# --- sglang --------------------------------------------------------------------------------


def test_sglang_refuses_ranks_that_differ_within_qkv(made: dict[str, pathlib.Path]) -> None:
    codes = check(made, "rank-pattern-k4", engine="sglang")
    assert codes[:2] == ["LG111", "LG111"]  # one per layer
    assert check(made, "rank-pattern-k4", engine="vllm") == []
    # a rank_pattern keyed on whole layers keeps one rank per packed module; alpha keeps
    # alpha / r the adapter's, so sglang serves it
    assert check(made, "rank-pattern-layer", engine="sglang") == []


def test_sglang_scales_the_whole_adapter_by_alpha_over_r(
        made: dict[str, pathlib.Path]) -> None:
    limits = lg.ServingLimits.for_engine("sglang")
    report = lg.check_adapters(made["rslora"], limits)
    assert report.codes() == ["LG112"]
    assert "rsLoRA" in report.violations[0].message
    assert "sglang==0.5.23 scales the whole adapter by lora_alpha / r = 1" in \
        report.violations[0].message
    assert check(made, "alpha-pattern", engine="sglang") == ["LG112"]


def test_sglang_refuses_a_regex_target_modules(made: dict[str, pathlib.Path],
                                               tmp_path: pathlib.Path) -> None:
    adapter = shutil.copytree(made["plain"], tmp_path / "regex")
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["target_modules"] = r".*\.(q_proj|k_proj|v_proj)"  # as PEFT saves a regex
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    report = lg.check_adapters(adapter, lg.ServingLimits.for_engine("sglang"))
    assert report.codes() == ["LG202"]
    assert "sglang==0.5.23 reads target_modules only as a list" in report.violations[0].message
    assert lg.check_adapters(adapter, lg.ServingLimits.for_engine("vllm")).ok


def test_sglang_refuses_target_modules_null(made: dict[str, pathlib.Path],
                                            tmp_path: pathlib.Path) -> None:
    """A hand-written or converted config with target_modules null: sglang 0.5.23 normalises
    it for every weight it loads (``LoRAAdapter._process_weight``) and fails with
    "'NoneType' object is not iterable"; vLLM reads the weights' names and serves it. (Found
    by the field sweep; the engine tier's corpus case `targets-null` runs it on the three.)"""
    adapter = shutil.copytree(made["plain"], tmp_path / "null")
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["target_modules"] = None
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    report = lg.check_adapters(adapter, lg.ServingLimits.for_engine("sglang"))
    assert report.codes() == ["LG202"]
    assert report.violations[0].message.endswith(
        "target_modules is null; sglang==0.5.23 reads target_modules as a list of module "
        "names for every adapter it loads, and the load fails.")
    assert lg.check_adapters(adapter, lg.ServingLimits.for_engine("vllm")).ok
    # lmdeploy unions target_modules into a set of names: null fails too (TypeError)
    lmdeploy = lg.check_adapters(adapter, lg.ServingLimits.for_engine("lmdeploy"))
    assert "target_modules is null; lmdeploy==0.18.0 reads" in "\n".join(
        v.message for v in lmdeploy.violations)


def test_sglang_max_lora_rank_defaults_to_the_largest_r_of_the_set(
        made: dict[str, pathlib.Path]) -> None:
    # alone, r=8 sizes the pool: rank_pattern's 32 does not fit (sglang checks only r)
    assert "LG101" in check(made, "rank-pattern-k32", engine="sglang")
    # next to an r=32 adapter the pool holds rank 32
    assert "LG101" not in check(made, "rank-pattern-k32", "r32", engine="sglang")
    assert check(made, "r32", engine="sglang", max_lora_rank=16) == ["LG101"]


def test_sglang_refuses_dora_and_still_refuses_what_it_ignores(
        made: dict[str, pathlib.Path]) -> None:
    assert check(made, "dora", engine="sglang") == ["LG105"]
    # sglang loads these without a word and serves them wrongly
    for name in ("lora-bias", "lm-head-saved"):
        assert check(made, name, engine="sglang") == ["LG105"], name
    # bias="all" on a base without biases: no bias tensor saved, nothing for sglang to drop
    # (tests/test_lg105_unsupported_feature.py; measured by the engine tier's
    # equivalence tests)
    assert check(made, "bias-all", engine="sglang") == []


def test_sglang_max_loaded_loras_and_max_loras_per_batch(
        made: dict[str, pathlib.Path], tmp_path: pathlib.Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    for i in range(20):
        shutil.copytree(made["plain"], tmp_path / f"a{i:02d}")
    code, out, _ = run(capsys, str(tmp_path), "--engine", "sglang")  # per batch 8: fine
    assert code == 0, out
    code, out, _ = run(capsys, str(tmp_path), "--engine", "sglang", "--",
                       "--max-loaded-loras", "8")
    assert code == 1
    assert ("LG110 too-many-adapters: 20 adapters to hold loaded, but sglang==0.5.23 holds at "
            "most 8 (--max-loaded-loras)") in out
    code, _, err = run(capsys, str(tmp_path), "--engine", "sglang", "--",
                       "--max-loaded-loras", "4")
    assert code == 2 and "--max-loaded-loras (4) must be >= --max-loras-per-batch (8)" in err


def test_sglang_target_modules_normalise_to_packed_names(
        made: dict[str, pathlib.Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert check(made, "plain", engine="sglang", lora_target_modules=["qkv_proj"]) == []
    assert check(made, "mlp", engine="sglang",
                 lora_target_modules=["gate_proj", "up_proj", "down_proj"]) == []
    # o_proj is not served, and q_proj without v_proj cannot be stacked (once per layer)
    assert check(made, "o-proj", engine="sglang",
                 lora_target_modules=["q_proj"]) == ["LG104"] * 3
    code, _, err = run(capsys, str(made["plain"]), "--engine", "sglang", "--",
                       "--lora-target-modules", "c_attn")
    assert code == 2 and "--lora-target-modules" in err and "'c_attn' is not one of" in err


def test_sglang_refuses_an_adapter_that_adds_tokens(
        made: dict[str, pathlib.Path], capsys: pytest.CaptureFixture[str]) -> None:
    # sglang's LoRAConfig reads added_tokens.json, drops ids below the base's vocab_size, and
    # validate_new_adapter refuses the rest: "doesn't support adapters that add tokens"
    base = str(made["base"] / "config.json")
    code, out, _ = run(capsys, str(made["added-tokens"]), "--engine", "sglang",
                       "--base-config", base)
    assert code == 1
    assert ("LG105 unsupported-feature: added_tokens.json adds 2 "
            "token(s) to the vocabulary ('<sql>', '</sql>'; ids 128..129, at or past the "
            "base's vocab_size 128), which sglang==0.5.23 does not serve.") in out
    assert "resize_token_embeddings" in out and "--allow added_tokens" in out
    # tokens the base tokenizer already has, copied by a tokenizer save, are not added ones
    assert check(made, "added-tokens-copied", engine="sglang") == []


def test_vllm_ignores_added_tokens_so_lora_guard_refuses_them(
        made: dict[str, pathlib.Path]) -> None:
    # vLLM 0.34.0 reads no added_tokens.json and tokenizes with the base tokenizer: it loads
    # the adapter without a word, and the new tokens are never served
    limits = lg.ServingLimits.for_engine("vllm", base_config=made["base"] / "config.json")
    report = lg.check_adapters(made["added-tokens"], limits)
    assert report.codes() == ["LG105"]
    assert "vllm==0.34.0 does not serve" in report.violations[0].message
    assert check(made, "added-tokens-copied", engine="vllm") == []
    rule = next(r for r in profile("vllm").rules if "added_tokens.json" in r.text)
    assert not rule.engine_refuses and "lora_model.py" in rule.source


def test_default_refuses_added_tokens_unless_allowed_and_only_past_the_base_vocab(
        made: dict[str, pathlib.Path], capsys: pytest.CaptureFixture[str]) -> None:
    base = made["base"] / "config.json"
    assert lg.check_adapters(made["added-tokens"], lg.ServingLimits(
        base_config=base)).codes() == ["LG105"]
    assert lg.check_adapters(made["added-tokens"], lg.ServingLimits(
        base_config=base, allow={"added_tokens"})).ok
    assert lg.check_adapters(made["added-tokens-copied"], lg.ServingLimits(
        base_config=base)).ok
    # without the base's vocab_size nothing can be told: a tokenizer save copies the base's
    # own special tokens into added_tokens.json (Qwen's do), so none is refused
    code, out, _ = run(capsys, str(made["added-tokens-copied"]))
    assert code == 0, out
    code, out, _ = run(capsys, str(made["added-tokens"]), "--base-config", str(base))
    assert code == 1 and "adds 2 token(s)" in out and "vocab_size 128" in out
    assert lg.inspect_adapter(made["added-tokens"]).features["added_tokens"] == {
        "<sql>": 128, "</sql>": 129}


def test_added_tokens_json_is_read_by_the_rules_of_the_config(
        made: dict[str, pathlib.Path], tmp_path: pathlib.Path) -> None:
    adapter = tmp_path / "a"
    shutil.copytree(made["plain"], adapter)
    (adapter / "added_tokens.json").write_text('{"<sql>": "128"}')
    report = lg.check_adapters(adapter)
    assert report.codes() == ["LG108"]
    assert "added_tokens.json: token '<sql>' has id '128'" in report.violations[0].message
    (tmp_path / "outside.json").write_text('{"<sql>": 128}')
    (adapter / "added_tokens.json").unlink()
    (adapter / "added_tokens.json").symlink_to(tmp_path / "outside.json")
    report = lg.check_adapters(adapter)
    assert report.codes() == ["LG108"] and "outside the adapter folder" in report.violations[
        0].message


# --- PEFT ----------------------------------------------------------------------------------


def test_peft_profile_passes_everything_peft_saves_and_loads_back(
        made: dict[str, pathlib.Path]) -> None:
    names = [n for n in made if n not in ("base", "pissa-niter")]
    assert check(made, *names, engine="peft") == []
    # a randomised PiSSA init is not redone the same when PEFT loads the adapter
    assert check(made, "pissa-niter", engine="peft") == ["LG116"]


def test_peft_loads_a_pissa_adapter_back_as_trained(made: dict[str, pathlib.Path],
                                                    tmp_path: pathlib.Path) -> None:
    """Why the peft profile passes PiSSA: loading redoes the init on the base."""
    torch.manual_seed(1)
    base = transformers.LlamaForCausalLM(_config())
    weights = {k: v.clone() for k, v in base.state_dict().items()}
    with _quiet():
        model = peft.get_peft_model(base, peft.LoraConfig(
            r=8, target_modules=["q_proj", "v_proj"], init_lora_weights="pissa"))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.add_(torch.randn_like(p) * 0.1)
        tokens = torch.arange(10)[None]
        trained = model(tokens).logits
        model.save_pretrained(str(tmp_path / "a"))
        fresh = transformers.LlamaForCausalLM(_config())
        fresh.load_state_dict(weights)
        loaded = peft.PeftModel.from_pretrained(fresh, str(tmp_path / "a"))(tokens).logits
    assert torch.allclose(trained, loaded)
    assert lg.check_adapters(tmp_path / "a", lg.ServingLimits.for_engine("peft")).ok


# --- the profile in Python -----------------------------------------------------------------


def test_for_engine_takes_flags_or_keywords_alike() -> None:
    by_flags = lg.ServingLimits.for_engine("vllm", "--max-lora-rank", "64", "--max-loras=4",
                                           "--tensor-parallel-size", "2", "--enforce-eager")
    by_keywords = lg.ServingLimits.for_engine("vllm==0.34.0", max_lora_rank=64, max_loras=4)
    assert by_flags == by_keywords
    assert by_flags.engine_options["max_loras"] == 4 and by_flags.max_rank == 64
    assert lg.ServingLimits.for_engine("vllm", ["--max-lora-rank", "64"]).max_rank == 64


def test_each_flag_default_is_the_engines() -> None:
    vllm = lg.ServingLimits.for_engine("vllm").engine_options
    assert (vllm["max_lora_rank"], vllm["max_loras"], vllm["max_cpu_loras"],
            vllm["lora_dtype"], vllm["lora_target_modules"]) == (16, 1, None, "auto", None)
    sglang = lg.ServingLimits.for_engine("sglang").engine_options
    assert (sglang["max_lora_rank"], sglang["max_loras_per_batch"], sglang["max_loaded_loras"],
            sglang["lora_target_modules"]) == (None, 8, None, None)
    assert lg.ServingLimits.for_engine("sglang").max_rank is None


def test_for_engine_says_what_is_wrong() -> None:
    with pytest.raises(ValueError, match=r"vllm 0\.2 is not a supported release; supported: "
                       r"0\.29\.0 to 0\.34\.0"):
        lg.ServingLimits.for_engine("vllm==0.2")
    with pytest.raises(ValueError,
                       match=r"unknown engine 'tgi'; supported: lmdeploy, peft, sglang, vllm"):
        lg.ServingLimits.for_engine("tgi")
    with pytest.raises(ValueError, match=r"vllm has no LoRA option 'max_rank'"):
        lg.ServingLimits.for_engine("vllm", max_rank=64)
    with pytest.raises(ValueError, match=r"--max-loras 'many': expected an integer"):
        lg.ServingLimits.for_engine("vllm", "--max-loras", "many")


# --- pasted serve commands -----------------------------------------------------------------


def test_a_pasted_vllm_serve_command_from_its_docs(
        made: dict[str, pathlib.Path], tmp_path: pathlib.Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    # vLLM's LoRA docs: vllm serve meta-llama/Llama-2-7b-hf --enable-lora \
    #     --lora-modules sql-lora=$HOME/.cache/huggingface/hub/models--yard1--llama-2-7b-sql-lo...
    model = tmp_path / "Llama-2-7b-hf"
    shutil.copytree(made["base"], model)
    command = ["vllm", "serve", str(model), "--enable-lora",
               "--lora-modules", f"sql-lora={made['plain']}",
               json.dumps({"name": "wide", "path": str(made["r32"]),
                           "base_model_name": str(model)})]
    code, out, _ = run(capsys, "--", *command)
    assert code == 1 and "rank 32" in out and "max rank 16" in out
    code, out, _ = run(capsys, "--format", "json", "--", *command, "--max-lora-rank", "64")
    assert code == 0, out
    report = json.loads(out)
    assert report["limits"]["engine"] == "vllm==0.34.0"
    assert report["limits"]["max_rank"] == 64
    assert report["limits"]["base_config"] == str(model / "config.json")  # MODEL's config
    assert [pathlib.Path(a["id"]).name for a in report["adapters"]] == ["plain", "r32"]


def test_a_pasted_sglang_launch_server_command_from_its_docs(
        made: dict[str, pathlib.Path], capsys: pytest.CaptureFixture[str],
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # its MODEL is a Hub id: offline with an empty cache, the base check says it was skipped
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    # sglang's LoRA docs: python3 -m sglang.launch_server --model-path
    #     meta-llama/Meta-Llama-3.1-8B-Instruct --enable-lora --lora-paths
    #     lora0=algoprog/fact-checking-lora lora1=Nutanix/... --max-loras-per-batch 2
    command = ["python3", "-m", "sglang.launch_server", "--model-path",
               "meta-llama/Meta-Llama-3.1-8B-Instruct", "--enable-lora", "--lora-paths",
               f"lora0={made['plain']}",
               json.dumps({"lora_name": "lora1", "lora_path": str(made["rank-pattern-k4"]),
                           "pinned": False}),
               "--max-loras-per-batch", "2", "--log-level", "warning"]
    code, out, _ = run(capsys, "--", *command)
    assert code == 1 and "LG111" in out and "rank-pattern-k4" in out and "plain\n" not in out
    code, _, err = run(capsys, "--", *command, "--max-loaded-loras", "1")
    assert code == 2 and "--max-loaded-loras (1) must be >= --max-loras-per-batch (2)" in err


def test_lora_guard_options_after_the_serve_command_are_refused_not_ignored(
        made: dict[str, pathlib.Path], capsys: pytest.CaptureFixture[str]) -> None:
    # pasted, then --format json appended at the end: it would be read as a vLLM flag
    command = ["vllm", "serve", str(made["base"]), "--enable-lora",
               "--lora-modules", f"a={made['plain']}"]
    for extra in (["--format", "json"], ["--format=json"], ["--quiet"], ["--select", "LG1"]):
        code, out, err = run(capsys, "--", *command, *extra)
        assert code == 2 and out == "", extra
        assert f"{extra[0]} after --: that is an option of lora-guard check" in err, err
    code, out, _ = run(capsys, "--format", "json", "--", *command)  # where it goes
    assert code == 0 and json.loads(out)["ok"] is True
    # vLLM's own --max-loras (an option of check too) is the engine's after --
    code, out, _ = run(capsys, "--format", "json", "--", *command, "--max-loras", "2")
    assert code == 0 and json.loads(out)["limits"]["engine_options"]["max_loras"] == 2


def test_the_fix_for_an_unsupported_feature_works_with_an_engine(
        made: dict[str, pathlib.Path], capsys: pytest.CaptureFixture[str]) -> None:
    # LG105's fix says `lora-guard check --allow dora`: with --engine it must be accepted
    code, out, _ = run(capsys, str(made["dora"]), "--engine", "vllm")
    assert code == 1 and "LG105" in out and "--allow dora" in out
    code, out, err = run(capsys, str(made["dora"]), "--engine", "vllm", "--allow", "dora",
                         "--format", "json")
    assert code == 0, err
    assert "dora" in json.loads(out)["limits"]["allow"]
    # it widens the engine's features by the one named, nothing else
    code, out, _ = run(capsys, str(made["lora-bias"]), "--engine", "vllm", "--allow", "dora")
    assert code == 1 and "LG105" in out


def test_engine_flags_need_an_engine_and_generic_options_do_not_mix(
        made: dict[str, pathlib.Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, str(made["plain"]), "--", "--max-lora-rank", "64")
    assert code == 2 and "give --engine vllm|sglang|peft" in err
    code, _, err = run(capsys, str(made["plain"]), "--engine", "vllm", "--max-rank", "64")
    assert code == 2 and "--max-rank with an engine" in err
    code, _, err = run(capsys, "--engine", "vllm")
    assert code == 2 and "no adapters to check" in err


def test_each_engine_page_lists_its_flags_and_cites_each_rule_source() -> None:
    from lora_guard._checking.engines import ENGINES

    docs = pathlib.Path(__file__).resolve().parents[1] / "docs" / "engines"
    for engine, releases in ENGINES.items():
        page = (docs / f"{engine}.md").read_text()
        for release in releases:
            assert f"| {release.version} |" in page, (engine, release.version)
            for flag in release.flags:
                assert f"`{flag.name}`" in page, (engine, flag.name)
            rows = [line for line in page.splitlines() if line.startswith("| LG")]
            for rule in release.rules:
                assert rule.source, rule
                for source in rule.source.split("; "):
                    # the rule's code and its source function on one row of the rules table
                    assert any(line.startswith(f"| {rule.code}") or f" {rule.code}" in
                               line.split("|")[1] for line in rows if f"`{source}" in line
                               or f"`{source.split(':')[0]}`" in line), (engine, rule.code,
                                                                         source)


def test_an_adapter_of_mixed_dtypes_serves_on_an_engine_that_casts(
        made: dict[str, pathlib.Path], tmp_path: pathlib.Path) -> None:
    from safetensors.torch import load_file, save_file

    path = shutil.copytree(made["plain"], tmp_path / "mixed")
    tensors = load_file(str(path / "adapter_model.safetensors"))
    first = sorted(tensors)[0]
    tensors[first] = tensors[first].to(torch.float16)  # a partial conversion script
    save_file(tensors, str(path / "adapter_model.safetensors"))
    assert lg.check_adapters(path).codes() == ["LG106"]  # a custom server may copy as is
    for engine in ("vllm", "sglang", "peft"):
        assert lg.check_adapters(path, lg.ServingLimits.for_engine(engine)).ok, engine


def test_an_unsupported_release_on_the_command_line_lists_the_supported_ones(
        made: dict[str, pathlib.Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, str(made["plain"]), "--engine", "vllm==0.11.2")
    assert code == 2 and out == ""
    assert "vllm 0.11.2 is not a supported release; supported: 0.29.0 to 0.34.0" in err
    code, _, err = run(capsys, str(made["plain"]), "--engine", "sglang==0.4")
    assert code == 2 and "supported: 0.5.16 to 0.5.23" in err
    for pinned in ("vllm==0.34.0", "vllm==0.34", "sglang==0.5.23", "peft==0.21"):
        code, out, _ = run(capsys, str(made["plain"]), "--engine", pinned)
        assert code == 0, (pinned, out)


def test_a_lora_flag_that_cannot_be_parsed_is_named_and_other_flags_are_ignored(
        made: dict[str, pathlib.Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, str(made["r32"]), "--engine", "sglang", "--",
                       "--max-loras-per-batch", "two")
    assert code == 2 and "--max-loras-per-batch 'two': expected an integer" in err
    code, _, err = run(capsys, str(made["plain"]), "--engine", "vllm", "--", "--lora-dtype",
                       "int8")
    assert code == 2 and "--lora-dtype 'int8': not one of auto, float16, bfloat16" in err
    # serving flags that do not bear on LoRA, with and without values, change nothing
    code, out, _ = run(capsys, str(made["r32"]), "--engine", "vllm", "--",
                       "--tensor-parallel-size", "2", "--gpu-memory-utilization=0.9",
                       "--enforce-eager", "--max-lora-rank", "32", "--trust-remote-code")
    assert code == 0, out


def test_every_lora_flag_has_the_engines_default(
        made: dict[str, pathlib.Path]) -> None:
    expected = {
        "vllm": {"enable_lora": None, "max_lora_rank": 16, "max_loras": 1,
                 "max_cpu_loras": None, "lora_dtype": "auto", "lora_target_modules": None,
                 "fully_sharded_loras": False, "max_lora_cls_labels": None, "runner": "auto",
                 "convert": "auto", "specialize_active_lora": False,
                 "enable_tower_connector_lora": False, "enable_mixed_moe_lora_format": False,
                 "enable_moe_shared_loras": False},
        "sglang": {"enable_lora": None, "max_lora_rank": None, "lora_target_modules": None,
                   "max_loras_per_batch": 8, "max_loaded_loras": None,
                   "lora_strict_loading": False, "experts_shared_outer_loras": None},
    }
    for engine, defaults in expected.items():
        assert dict(lg.ServingLimits.for_engine(engine).engine_options) == defaults, engine
        flags = {f.dest for f in profile(engine).flags} - {"lora_modules", "lora_paths"}
        assert flags == set(defaults), engine
    # the engines' negations (argparse BooleanOptionalAction) turn a flag off
    options = lg.ServingLimits.for_engine("vllm", "--enable-lora", "--disable-lora",
                                          "--no-fully-sharded-loras").engine_options
    assert (options["enable_lora"], options["fully_sharded_loras"]) == (False, False)
    assert lg.ServingLimits.for_engine("sglang", "--no-experts-shared-outer-loras"
                                       ).engine_options["experts_shared_outer_loras"] is False
    # and each default decides: vLLM 16 refuses r=32, sglang sizes the pool from the set
    assert check(made, "r32", engine="vllm") == ["LG101"]
    assert check(made, "r32", engine="sglang") == []


def test_a_pasted_sglang_command_takes_the_base_config_from_a_local_model_folder(
        made: dict[str, pathlib.Path], tmp_path: pathlib.Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    # a model folder of another hidden size: the adapters were trained on another base
    model = tmp_path / "Qwen-local"
    wide = _config()
    wide.hidden_size, wide.intermediate_size = 128, 256
    wide.architectures = ["LlamaForCausalLM"]
    wide.save_pretrained(str(model))
    command = ["python", "-m", "sglang.launch_server", "--model-path", str(model),
               "--enable-lora", "--lora-paths", f"lora0={made['plain']}",
               "--max-loras-per-batch", "1", "--port", "30000"]
    code, out, _ = run(capsys, "--format", "json", "--", *command)
    assert code == 1, out
    report = json.loads(out)
    assert report["limits"]["engine"] == "sglang==0.5.23"
    assert report["limits"]["base_config"] == str(model / "config.json")
    assert report["summary"]["by_code"] == {"LG109": 1}  # q, k and v: in dim 64, not 128
    (said,) = report["adapters"][0]["violations"]
    assert "k_proj in dim 64 where the base has 128 (hidden_size 128)" in said["message"]
    assert said["details"]["kinds"] == 3


@pytest.mark.parametrize(("engine", "launch"), [
    ("vllm", ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}",
     "--enable-lora", "--lora-modules", "wide={adapter}"]),
    ("vllm", ["/opt/venv/bin/vllm", "serve", "{model}", "--enable-lora", "--lora-modules",
              "wide={adapter}"]),
    ("sglang", ["sglang", "serve", "--model-path", "{model}", "--lora-paths",
                "wide={adapter}", "--max-lora-rank", "16"]),
    ("sglang", ["python3", "-m", "sglang.launch_server", "--model-path={model}",
                "--lora-paths", "{adapter}", "--max-lora-rank=16"]),
], ids=["vllm-api-server", "vllm-binary-path", "sglang-serve", "sglang-equals-forms"])
def test_every_way_of_launching_the_server_gives_engine_adapters_and_base(
        engine: str, launch: list[str], made: dict[str, pathlib.Path], tmp_path: pathlib.Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "model"
    shutil.copytree(made["base"], model)
    command = [w.format(model=model, adapter=made["r32"]) for w in launch]
    code, out, _ = run(capsys, "--format", "json", "--", *command)
    assert code == 1, out
    report = json.loads(out)
    assert report["limits"]["engine"] == profile(engine).label
    assert report["limits"]["base_config"] == str(model / "config.json")
    assert [a["id"] for a in report["adapters"]] == [str(made["r32"])]
    assert report["summary"]["by_code"] == {"LG101": 1}  # rank 32 above max rank 16


def test_saved_embedding_layers_are_refused_by_vllm_only(
        made: dict[str, pathlib.Path]) -> None:
    """vLLM skips saved embeddings only as <module>.base_layer.weight and fails the load on
    <module>.weight; sglang drops them (embeddings not among target_modules), PEFT loads
    them; on the base's own vocabulary they serve the same."""
    assert check(made, "saved-embeddings", engine="vllm") == ["LG104", "LG104"]
    report = lg.check_adapters(made["saved-embeddings"], lg.ServingLimits.for_engine("vllm"))
    refused = next(v for v in report.violations if v.code == "LG104")
    assert "save_embedding_layers" in refused.message and "base_layer.weight" in refused.message
    assert "save_embedding_layers=False" in refused.hint
    assert check(made, "saved-embeddings", engine="sglang") == []
    assert check(made, "saved-embeddings", engine="peft") == []
    base = made["base"] / "config.json"
    assert lg.check_adapters(made["saved-embeddings"], lg.ServingLimits(base_config=base)).ok
    # without a base config the full weights are named with their cost (LG118), not LG104
    assert lg.check_adapters(made["saved-embeddings"]).codes() == ["LG118", "LG118"]
