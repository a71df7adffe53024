"""LG104 (unsupported-target): a weight whose module the server does not serve, or a key
outside PEFT's grammar.

A server that serves LoRA on attention only (`target_modules=("q_proj", ...)`) drops an
adapter's MLP weights without a word: the check names each module it would drop. A fused
module (gate_up_proj) is served when all its parts are. Boundary tests (by name, by path
suffix, fused parts, MoE experts) are in `tests/test_boundaries.py`.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

import lora_guard as lg
from conftest_adapters import TINY_LLAMA, llama, messages, peft_alone, save

pytest.importorskip("peft")
pytest.importorskip("transformers")

from peft import LoraConfig


def test_modules_the_server_does_not_serve(zoo: dict[str, pathlib.Path]) -> None:
    report = lg.check_adapters(zoo["r16-all-bf16"], lg.ServingLimits(
        target_modules=("q_proj", "k_proj", "v_proj", "o_proj")))
    assert report.codes() == ["LG104"] * 3
    assert {v.details["target"] for v in report.violations} == {
        "gate_proj", "up_proj", "down_proj"}
    fused = lg.check_adapters(zoo["moe-flat"], lg.ServingLimits(
        target_modules=("q_proj", "gate_proj", "up_proj", "down_proj")))
    assert fused.ok, fused.violations


# --- the engines' own rules, found by the field sweep and judged by the real engines -------


def _qwen2(**overrides: object) -> object:
    """A tiny Qwen2 (Qwen2.5's class: tied embeddings), as the field fine-tunes it."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(**{**TINY_LLAMA, "tie_word_embeddings": True,
                                           **overrides}))


def _base_config(model: object, folder: pathlib.Path) -> pathlib.Path:
    model.config.architectures = [type(model).__name__]  # type: ignore[attr-defined]
    model.config.save_pretrained(str(folder))  # type: ignore[attr-defined]
    return folder / "config.json"


@pytest.mark.parametrize("targets", [["q_proj", "v_proj", "lm_head"],
                                     ["q_proj", "v_proj", "embed_tokens"]])
def test_vllm_refuses_lora_on_the_embeddings_of_a_qwen2_base(
        tmp_path: pathlib.Path, targets: list[str]) -> None:
    """vLLM 0.34.0's Qwen2ForCausalLM lists no embedding_modules: an adapter with LoRA on
    lm_head or embed_tokens (new chat tokens, a tied head) fails its load with "expected
    target modules in {...}" (the field sweep's real vLLM said so); on Llama it loads."""
    embedding = targets[-1]
    folder = save(_qwen2(), LoraConfig(r=8, target_modules=targets), tmp_path / "a")
    qwen2 = _base_config(_qwen2(), tmp_path / "qwen2")
    vllm = lg.ServingLimits.for_engine("vllm==0.34.0", base_config=qwen2)

    report = lg.check_adapters([folder], vllm)

    assert report.codes() == ["LG104"]
    assert messages(report).endswith(
        f"LoRA on {'model.' if embedding == 'embed_tokens' else ''}{embedding}, but "
        "vllm==0.34.0 serves LoRA on the embeddings of Qwen2ForCausalLM only on: none (not "
        f"{embedding}), and refuses this adapter at load.")
    assert "merge the adapter into the base model" in report.violations[0].hint
    on_llama = save(llama(), LoraConfig(r=8, target_modules=targets), tmp_path / "llama")
    llama_base = _base_config(llama(), tmp_path / "llama-base")
    assert lg.check_adapters([on_llama], lg.ServingLimits.for_engine(
        "vllm==0.34.0", base_config=llama_base)).ok
    # without the base's config the architecture is unknown: no verdict
    unknown = lg.check_adapters([folder], lg.ServingLimits.for_engine("vllm==0.34.0"))
    assert "LG104" not in unknown.codes()
    for release in ("0.29.0", "0.31.0", "0.33.0"):  # Qwen2 serves none on every release
        assert lg.check_adapters([folder], lg.ServingLimits.for_engine(
            f"vllm=={release}", base_config=qwen2)).codes() == ["LG104"]


def test_each_vllm_release_judges_embedding_lora_by_its_own_models(
        tmp_path: pathlib.Path) -> None:
    """vLLM's model classes change what embeddings they serve LoRA on between releases
    (tools/gen_vllm_embedding_lora.py read each release's registry): Gemma serves
    embed_tokens from 0.34.0 only (the real vLLM 0.31.0 refuses it: the engine tier's
    test_embedding_lora_on_gemma_is_judged_by_the_releases_own_table)."""
    import torch
    from transformers import GemmaConfig, GemmaForCausalLM

    torch.manual_seed(0)
    gemma = GemmaForCausalLM(GemmaConfig(**{**TINY_LLAMA, "head_dim": 16}))
    base = _base_config(gemma, tmp_path / "gemma")
    folder = save(gemma, LoraConfig(r=8, target_modules=["q_proj", "v_proj", "embed_tokens"]),
                  tmp_path / "a")

    def codes(release: str) -> list[str]:
        return lg.check_adapters([folder], lg.ServingLimits.for_engine(
            f"vllm=={release}", base_config=base)).codes()

    assert codes("0.34.0") == []
    for release in ("0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0"):
        assert codes(release) == ["LG104"], release
    report = lg.check_adapters([folder], lg.ServingLimits.for_engine(
        "vllm==0.31.0", base_config=base))
    assert "vllm==0.31.0 serves LoRA on the embeddings of GemmaForCausalLM only on: none" in (
        messages(report))


@pytest.mark.parametrize(("targets", "present", "missing"), [
    (["q_proj"], "q_proj", "v_proj"),
    (["q_proj", "k_proj"], "q_proj, k_proj", "v_proj"),
    (["k_proj", "v_proj"], "k_proj, v_proj", "q_proj"),
    (["v_proj", "o_proj"], "v_proj", "q_proj"),
    (["up_proj", "down_proj"], "up_proj", "gate_proj"),
])
def test_sglang_refuses_a_stack_it_cannot_build(
        tmp_path: pathlib.Path, targets: list[str], present: str, missing: str) -> None:
    """sglang 0.5.23 stacks q/k/v into qkv_proj from each q_proj weight, reading v_proj
    (k_proj zero-filled), and gate/up from gate_proj: a q_proj-only adapter fails with a
    KeyError on v_proj, and k/v or up_proj without their first part with "Cannot find target
    module name" (the field sweep's real sglang said so). vLLM serves each on its own."""
    folder = save(llama(), LoraConfig(r=8, target_modules=targets), tmp_path / "a")
    sglang = lg.ServingLimits.for_engine("sglang==0.5.23", "--max-lora-rank", "16",
                                         "--lora-target-modules", "all")

    report = lg.check_adapters([folder], sglang)

    assert report.codes() == ["LG104", "LG104"]  # one per layer, each named
    stack = "q_proj/k_proj/v_proj into qkv_proj starting from q_proj" if missing != \
        "gate_proj" else "gate_proj/up_proj into gate_up_proj starting from gate_proj"
    where = "mlp" if missing == "gate_proj" else "self_attn"
    assert messages(report).splitlines()[1].endswith(
        f"model.layers.1.{where} has LoRA on {present} but not on {missing}; "
        f"sglang==0.5.23 stacks {stack}, and the load fails.")
    assert lg.check_adapters([folder], lg.ServingLimits.for_engine("vllm==0.34.0")).ok


def test_sglang_serves_the_stacks_it_can_build(tmp_path: pathlib.Path) -> None:
    """q_proj with v_proj (k_proj zero-filled), gate_proj alone (up_proj zero-filled), and the
    whole stacks: no false alarm."""
    sglang = lg.ServingLimits.for_engine("sglang==0.5.23", "--max-lora-rank", "16",
                                         "--lora-target-modules", "all")
    stacks: dict[str, list[str] | str] = {"qv": ["q_proj", "v_proj"], "gate": ["gate_proj"],
                                          "all": "all-linear"}
    for name, targets in stacks.items():
        folder = save(llama(), LoraConfig(r=8, target_modules=targets), tmp_path / name)
        assert lg.check_adapters([folder], sglang).ok, name


def _sglang(*flags: str) -> lg.ServingLimits:
    return lg.ServingLimits.for_engine("sglang==0.5.23", "--max-lora-rank", "16", *flags)


@pytest.mark.parametrize("embedding", ["lm_head", "embed_tokens"])
@pytest.mark.parametrize("served", [("all",), ("q_proj", "v_proj", "lm_head", "embed_tokens")])
def test_sglang_drops_embedding_lora_its_config_does_not_name(
        tmp_path: pathlib.Path, embedding: str, served: tuple[str, ...]) -> None:
    """Trained with LoRA on q/v and an embedding, the config's target_modules later cut to
    q/v (a conversion script, a hand edit): sglang 0.5.23 reads embed_tokens / lm_head LoRA
    only for a module the adapter's own config names and drops it with a debug log line,
    whatever the server serves; the engine tier measured it (its embedding_layers stay
    empty, the base module is served)."""
    folder = save(llama(), LoraConfig(r=8, target_modules=["q_proj", "v_proj", embedding]),
                  tmp_path / "a")
    _with_config(folder, target_modules=["q_proj", "v_proj"])
    base = _base_config(llama(), tmp_path / "base")

    report = lg.check_adapters([folder], lg.ServingLimits.for_engine(
        "sglang==0.5.23", "--max-lora-rank", "16", "--lora-target-modules", *served,
        base_config=base))

    assert report.codes() == ["LG104"], messages(report)  # one, not also "not served"
    module = "lm_head" if embedding == "lm_head" else "model.embed_tokens"
    assert messages(report).endswith(
        f"/a': {module} has LoRA weights, but sglang==0.5.23 puts no LoRA on it (its "
        f"target_modules does not name {embedding}, and sglang==0.5.23 reads LoRA on "
        "embed_tokens and lm_head only for a module the adapter's config names): its weights "
        f"are dropped without a word and the base {embedding} is served.")
    assert lg.check_adapters([_with_config(folder, target_modules=[
        "q_proj", "v_proj", f"model.{embedding}"])], _sglang("--lora-target-modules", "all",
                                                             )).codes() == ["LG118"]


def test_sglang_serves_embedding_lora_its_config_names(tmp_path: pathlib.Path) -> None:
    """No false alarm: named in the config (or 'all-linear') and in the server's modules."""
    base = _base_config(llama(), tmp_path / "base")
    named = save(llama(), LoraConfig(r=8, target_modules=["q_proj", "v_proj", "lm_head",
                                                          "embed_tokens"]), tmp_path / "named")
    every = _with_config(save(llama(), LoraConfig(r=8, target_modules=[
        "q_proj", "v_proj", "lm_head"]), tmp_path / "every"), target_modules="all-linear")
    for folder in (named, every):
        assert lg.check_adapters([folder], lg.ServingLimits.for_engine(
            "sglang==0.5.23", "--max-lora-rank", "16", "--lora-target-modules", "all",
            base_config=base)).ok, folder.name


@pytest.mark.parametrize(("config", "outcome"), [
    (None, "its config names down_proj, gate_proj, o_proj, up_proj, so sglang==0.5.23 refuses "
           "the load (at start-up the server does not start)"),
    ("all-linear", "its config does not list it, so sglang==0.5.23 loads the adapter, skips "
                   "these weights with a warning and fails the first batch that uses it (the "
                   "scheduler stops)"),
])
def test_sglang_says_what_it_does_with_weights_outside_its_lora_target_modules(
        tmp_path: pathlib.Path, config: str | None, outcome: str) -> None:
    """Trained on q, k, v, o, gate, up, down; the server started with --lora-target-modules
    q_proj v_proj. The real sglang 0.5.23 refuses it when its config lists the projections
    (LoRAMemoryPool.can_support), and with target_modules "all-linear" loads it, logs the
    weights it skips and fails the first batch that uses it: it never serves part of it."""
    folder = save(llama(), LoraConfig(r=8, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
        tmp_path / "a")
    if config is not None:
        _with_config(folder, target_modules=config)

    report = lg.check_adapters([folder], _sglang("--lora-target-modules", "q_proj", "v_proj"))

    assert report.codes() == ["LG104"] * 4  # k_proj is served: stacked into qkv_proj
    said = messages(report).splitlines()
    assert {line.split(" (", 1)[0].rsplit(" ", 1)[-1] for line in said} == {
        "model.layers.0.mlp.down_proj", "model.layers.0.mlp.gate_proj",
        "model.layers.0.mlp.up_proj", "model.layers.0.self_attn.o_proj"}
    assert all(line.endswith(f"is not among sglang==0.5.23's LoRA modules (q_proj, v_proj; "
                             f"--lora-target-modules): {outcome}.") for line in said), said
    assert lg.check_adapters([folder], _sglang("--lora-target-modules", "all")).ok


@pytest.mark.parametrize("served", [("all",), ("q_proj", "v_proj", "gate_up_proj",
                                                "down_proj")])
def test_sglang_fails_moe_experts_saved_by_target_parameters(
        tmp_path: pathlib.Path, served: tuple[str, ...]) -> None:
    """PEFT's target_parameters saves a fused MoE's expert LoRA as mlp.experts.base_layer.lora_A
    (gate_up) and mlp.experts.lora_A (down). sglang 0.5.23 finds a weight's pool module by the
    module's name inside the weight's name: none is in these, so it loads the adapter, skips
    them with a warning and fails the first batch that uses it, whatever it serves (the engine
    tier measured it on sglang's own Qwen2-MoE)."""
    from conftest_adapters import peft_adapter

    folder = peft_adapter(tmp_path / "flat", model="qwen3moe", r=4, lora_alpha=4,
                          target_modules=["q_proj", "v_proj"],
                          target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])

    report = lg.check_adapters([folder], _sglang("--lora-target-modules", *served))

    assert report.codes() == ["LG104"] * 2, messages(report)  # gate_up and down, once each
    assert messages(report).splitlines()[1].endswith(
        "/flat': model.layers.0.mlp.experts.base_layer (and 1 more) holds MoE expert LoRA "
        "(gate_up_proj) in the layout of PEFT's target_parameters; sglang==0.5.23 finds a "
        "weight's LoRA module "
        "by its name, finds none in these, loads the adapter, skips them with a warning and "
        "fails the first batch that uses it.")
    assert report.violations[0].hint.startswith("Save the experts' LoRA in a layout")
    assert "model.layers.0.mlp.experts (and 1 more) holds MoE expert LoRA (down_proj)" in \
        report.violations[0].message


def test_sglang_without_target_modules_serves_the_union_of_the_start_up_adapters(
        tmp_path: pathlib.Path) -> None:
    """No --lora-target-modules: sglang 0.5.23 builds its pool from the union of the start-up
    adapters' target_modules (LoRAManager.init_lora_shapes). An adapter trained on q/v/o
    whose config was cut to q/v starts, its o_proj weights are skipped with a warning and the
    first batch that uses it fails ("Cannot find target module name"); a start-up adapter
    naming o_proj (or 'all-linear') puts o_proj in the pool, and it serves."""
    edited = _with_config(save(llama(), LoraConfig(r=8, target_modules=[
        "q_proj", "v_proj", "o_proj"]), tmp_path / "edited"), target_modules=["q_proj", "v_proj"])
    report = lg.check_adapters([edited], _sglang())

    assert report.codes() == ["LG104"]
    assert messages(report).endswith(
        "/edited': module model.layers.0.self_attn.o_proj (and 1 more) (o_proj) is not among "
        "sglang==0.5.23's LoRA modules (q_proj, v_proj; no --lora-target-modules: the "
        "start-up adapters' target_modules): its config does not list it, so sglang==0.5.23 "
        "loads the adapter, skips these weights with a warning and fails the first batch "
        "that uses it (the scheduler stops).")
    assert report.violations[0].hint.startswith(
        "Start sglang with --lora-target-modules naming every module the adapters train")
    full = save(llama(), LoraConfig(r=8, target_modules=["q_proj", "v_proj", "o_proj"]),
                tmp_path / "full")
    every = _with_config(save(llama(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
                              tmp_path / "every"), target_modules="all-linear")
    assert lg.check_adapters([edited, full], _sglang()).ok
    assert lg.check_adapters([edited, every], _sglang()).ok
    given = lg.check_adapters([edited], _sglang("--lora-target-modules", "q_proj", "v_proj"))
    assert given.codes() == ["LG104"]  # the pool as given: the same verdict


def test_sglang_sizes_its_pool_by_the_start_up_adapters_not_by_those_loaded_later(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`lora-guard check LATER -- sglang serve ... --lora-paths qv=QV`: sglang builds its pool
    from QV alone (its target_modules and its r, LoRAManager.init_lora_shapes), so LATER,
    loaded by a client once the server runs, is refused when its config names o_proj or its
    r is above QV's. The check judges LATER by that pool, not by the union of both."""
    from lora_guard._frontends.cli import main

    qv = save(llama(), LoraConfig(r=8, target_modules=["q_proj", "v_proj"]), tmp_path / "qv")
    wider = save(llama(), LoraConfig(r=8, target_modules=["q_proj", "v_proj", "o_proj"]),
                 tmp_path / "wider")
    larger = save(llama(), LoraConfig(r=16, target_modules=["q_proj", "v_proj"]),
                  tmp_path / "larger")
    serve = ["--", "sglang", "serve", "--model-path", "m", "--lora-paths", f"qv={qv}"]

    assert main(["check", str(wider), "--format", "json", *serve]) == 1
    out = capsys.readouterr().out
    assert '"code": "LG104"' in out and "its config names o_proj, so sglang" in out
    assert "the start-up adapters' target_modules" in out
    assert main(["check", str(larger), "--format", "json", *serve]) == 1
    assert '"code": "LG101"' in capsys.readouterr().out
    # the wider adapter among the start-up ones widens the pool: both start and serve
    assert main(["check", "--", "sglang", "serve", "--model-path", "m", "--lora-paths",
                 f"qv={qv}", f"wider={wider}", f"larger={larger}"]) == 0
    limits = lg.ServingLimits.for_engine("sglang==0.5.23", "--lora-paths", f"qv={qv}")
    assert (limits.max_rank, sorted(limits.target_modules or ())) == (8, ["q_proj", "v_proj"])


# --- PEFT: the modules the adapter's own config selects ------------------------------------


def _trained(folder: pathlib.Path, **lora: object) -> tuple[pathlib.Path, Any]:
    """A tiny Llama LoRA adapter with trained (non-zero) weights, saved, and the inputs' logits
    of the model it was saved from."""
    import torch
    from peft import get_peft_model

    model = get_peft_model(llama(), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False,
        **lora))  # type: ignore[arg-type]
    model.save_pretrained(str(folder))
    with torch.no_grad():
        return folder, model(torch.arange(6).reshape(1, 6)).logits


def _served_by_peft(folder: pathlib.Path) -> Any:
    import torch
    from peft import PeftModel

    with torch.no_grad(), peft_alone():
        return PeftModel.from_pretrained(llama(), str(folder))(
            torch.arange(6).reshape(1, 6)).logits


def _with_config(folder: pathlib.Path, **changes: object) -> pathlib.Path:
    import json

    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, **changes}))
    return folder


@pytest.mark.parametrize(("edit", "dropped", "why"), [
    ({"layers_to_transform": [0]}, {"model.layers.1.self_attn.q_proj",
                                    "model.layers.1.self_attn.v_proj"},
     "layers_to_transform [0] leaves out its layer 1"),
    ({"target_modules": ["q_proj"]}, {"model.layers.0.self_attn.v_proj",
                                      "model.layers.1.self_attn.v_proj"},
     'target_modules ["q_proj"] does not name it'),
    ({"target_modules": r".*\.q_proj"}, {"model.layers.0.self_attn.v_proj",
                                         "model.layers.1.self_attn.v_proj"},
     r'target_modules ".*\\.q_proj" does not match it'),
    ({"exclude_modules": ["v_proj"]}, {"model.layers.0.self_attn.v_proj",
                                       "model.layers.1.self_attn.v_proj"},
     "exclude_modules names it ('v_proj')"),
    ({"exclude_modules": r"model\.layers\.1\..*"}, {"model.layers.1.self_attn.q_proj",
                                                     "model.layers.1.self_attn.v_proj"},
     "exclude_modules \"model\\\\.layers\\\\.1\\\\..*\" matches it"),
])
def test_peft_drops_the_weights_of_modules_an_edited_config_does_not_select(
    tmp_path: pathlib.Path, edit: dict[str, object], dropped: set[str], why: str,
) -> None:
    import torch

    # trained on q/v of both layers; the config then edited (by hand, by a converter)
    folder, trained = _trained(tmp_path / "edited")
    _with_config(folder, **edit)
    served = _served_by_peft(folder)
    assert not torch.allclose(served, trained, atol=1e-4)  # PEFT loads it without a word

    report = lg.check_adapters([folder], lg.ServingLimits.for_engine("peft"))

    assert report.codes() == ["LG104", "LG104"]
    assert {v.details["module"] for v in report.violations} == dropped
    assert f"({why}): its weights are dropped without a word" in messages(report)
    # vLLM reads none of these fields: it loads every weight in the file
    assert lg.check_adapters([folder], lg.ServingLimits.for_engine("vllm")).ok


def test_an_adapter_trained_on_some_layers_serves_on_peft_as_trained(
    tmp_path: pathlib.Path,
) -> None:
    import torch

    folder, trained = _trained(tmp_path / "layer0", layers_to_transform=[0])
    assert torch.allclose(_served_by_peft(folder), trained, atol=1e-5)

    assert lg.check_adapters([folder], lg.ServingLimits.for_engine("peft")).ok


def test_a_layer_selection_that_selects_no_module_fails_peft_and_is_said_so(
    tmp_path: pathlib.Path,
) -> None:
    from peft.tuners.tuners_utils import NoMatchingPeftModuleError  # type: ignore[attr-defined]

    folder, _ = _trained(tmp_path / "none")
    _with_config(folder, layers_to_transform=[5])  # a 2-layer base
    with pytest.raises((ValueError, NoMatchingPeftModuleError)):
        _served_by_peft(folder)

    report = lg.check_adapters([folder], lg.ServingLimits.for_engine("peft"))

    assert set(report.codes()) == {"LG104"}
    assert "no module of the adapter is selected and the load fails" in messages(report)


def test_what_peft_wraps_inside_a_target_or_by_parameter_is_selected(
    tmp_path: pathlib.Path,
) -> None:
    import torch
    from peft import get_peft_model

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = torch.nn.MultiheadAttention(8, 2)
            self.lin0 = torch.nn.Linear(8, 8)
            self.lin1 = torch.nn.Linear(8, 8)

    # MultiheadAttention: PEFT saves its out_proj's LoRA as mha.base_layer.out_proj
    mha = tmp_path / "mha"
    get_peft_model(Block(), LoraConfig(r=2, target_modules=["mha"])).save_pretrained(str(mha))
    # target_parameters: lin1's weight wrapped as a parameter, beside a module target
    params = tmp_path / "params"
    get_peft_model(Block(), LoraConfig(r=2, target_modules=["lin0"],
                                       target_parameters=["lin1.weight"])).save_pretrained(
        str(params))

    for folder in (mha, params):
        report = lg.check_adapters([folder], lg.ServingLimits.for_engine("peft"))
        assert "LG104" not in report.codes(), messages(report)
