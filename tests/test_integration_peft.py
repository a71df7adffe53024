"""PEFT, for real on the CPU: loading and hot-swapping adapters with lora_guard instrumented.

Every model is a tiny transformers model built from a config; every adapter is saved by PEFT
itself into a temporary folder (a few are then edited with safetensors to carry a defect).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch
else:
    torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from peft.utils import hotswap  # noqa: E402

import lora_guard as lg  # noqa: E402
from lora_guard._checking.registry import adapter_invariant, remove_invariant  # noqa: E402
from lora_guard._checking.rules.context import AdapterContext  # noqa: E402
from lora_guard._core.errors import Violation, make_violation  # noqa: E402
from lora_guard.integrations import peft as peft_guard  # noqa: E402

LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=128)
TARGETS = ["q_proj", "down_proj"]
INPUT = torch.arange(12).reshape(2, 6) % 128


def llama(**overrides: int) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**LLAMA, **overrides})
    return transformers.LlamaForCausalLM(config).eval()  # type: ignore[no-any-return]


def save_adapter(path: Path, *, r: int, seed: int, **base: int) -> Path:
    model = get_peft_model(llama(**base), LoraConfig(
        r=r, lora_alpha=2 * r, target_modules=TARGETS, init_lora_weights=False))
    torch.manual_seed(seed)
    for name, param in model.named_parameters():
        if "lora_" in name:
            param.data.normal_(0, 0.05)
    model.save_pretrained(path)  # type: ignore[arg-type]
    return path


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        "r4": save_adapter(root / "r4", r=4, seed=1),
        "r8": save_adapter(root / "r8", r=8, seed=2),
        "r16": save_adapter(root / "r16", r=16, seed=3),
        # trained on a base whose MLP is narrower: same module names, other dims
        "narrow": save_adapter(root / "narrow", r=4, seed=4, intermediate_size=96),
    }


@pytest.fixture(autouse=True)
def instrumented() -> Iterator[None]:
    was = peft_guard.INTEGRATION.instrumented  # the session's --lora-guard-instrument stays
    peft_guard.instrument()
    yield
    if was:
        peft_guard.instrument()  # a test that turned it off gives it back
    else:
        peft_guard.uninstrument()


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_bitwise_equal(before: dict[str, torch.Tensor], model: torch.nn.Module) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    for key, old in before.items():
        new = after[key]
        assert new.dtype == old.dtype and new.shape == old.shape, key
        assert torch.equal(new, old), key


def loaded(path: Path) -> PeftModel:
    return PeftModel.from_pretrained(llama(), path).eval()


# --- hot-swapping ----------------------------------------------------------------------------

def test_prepared_model_refuses_a_rank_above_its_padded_rank(adapters: dict[str, Path]) -> None:
    model = loaded(adapters["r4"])
    hotswap.prepare_model_for_compiled_hotswap(model, target_rank=8)
    before = snapshot(model)

    with pytest.raises(lg.PoolShapeDriftError) as caught:
        hotswap.hotswap_adapter(model, adapters["r16"], adapter_name="default")  # type: ignore[arg-type]

    error = caught.value
    assert error.code == "LG001" and isinstance(error, RuntimeError)
    assert "rank 16, above the rank 8" in str(error)
    assert "target_rank=16" in str(error)
    assert_bitwise_equal(before, model)


def test_without_lora_guard_peft_silently_grows_the_padded_rank(adapters: dict[str, Path]) -> None:
    peft_guard.uninstrument()
    model = loaded(adapters["r4"])
    hotswap.prepare_model_for_compiled_hotswap(model, target_rank=8)
    hotswap.hotswap_adapter(model, adapters["r16"], adapter_name="default")  # type: ignore[arg-type]
    a = model.base_model.model.model.layers[0].self_attn.q_proj.lora_A["default"].weight  # type: ignore[index, union-attr]
    assert a.shape[0] == 16  # the padded, compiled shape is gone, and nothing said so


def test_swap_from_another_base_is_refused_before_any_write(adapters: dict[str, Path]) -> None:
    model = loaded(adapters["r8"])
    before = snapshot(model)

    with lg.recording() as rec, pytest.raises(lg.AdapterError) as caught:
        hotswap.hotswap_adapter(model, adapters["narrow"], adapter_name="default")  # type: ignore[arg-type]

    assert caught.value.code == "LG109"
    assert "in dim 96" in str(caught.value) and "has 128" in str(caught.value)
    assert set(rec.codes) == {"LG109"}
    assert_bitwise_equal(before, model)


def test_without_lora_guard_the_same_swap_is_left_half_done(adapters: dict[str, Path]) -> None:
    peft_guard.uninstrument()
    model = loaded(adapters["r8"])
    before = snapshot(model)
    with pytest.raises(RuntimeError):
        hotswap.hotswap_adapter(model, adapters["narrow"], adapter_name="default")  # type: ignore[arg-type]
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed  # PEFT wrote part of the swap before it failed


def test_a_larger_rank_on_an_unprepared_model_swaps_like_peft_alone(
    adapters: dict[str, Path],
) -> None:
    with lg.recording() as rec:
        guarded = loaded(adapters["r4"])
        hotswap.hotswap_adapter(guarded, adapters["r16"], adapter_name="default")  # type: ignore[arg-type]
    assert rec.violations == []

    peft_guard.uninstrument()
    plain = loaded(adapters["r4"])
    hotswap.hotswap_adapter(plain, adapters["r16"], adapter_name="default")  # type: ignore[arg-type]

    with torch.inference_mode():
        assert torch.equal(guarded(INPUT).logits, plain(INPUT).logits)
        reference = loaded(adapters["r16"])(INPUT).logits
        assert torch.allclose(guarded(INPUT).logits, reference, atol=1e-5)


def test_a_smaller_rank_into_a_padded_model_is_allowed(adapters: dict[str, Path]) -> None:
    model = loaded(adapters["r8"])
    hotswap.prepare_model_for_compiled_hotswap(model, target_rank=16)
    with lg.recording() as rec:
        hotswap.hotswap_adapter(model, adapters["r4"], adapter_name="default")  # type: ignore[arg-type]
    assert rec.violations == []
    with torch.inference_mode():
        reference = loaded(adapters["r4"])(INPUT).logits
        assert torch.allclose(model(INPUT).logits, reference, atol=1e-5)


def test_state_dict_swap_with_a_config_that_changes_the_function_is_refused(
    adapters: dict[str, Path],
) -> None:
    model = loaded(adapters["r8"])
    before = snapshot(model)
    weights = safetensors_torch.load_file(str(adapters["r8"] / "adapter_model.safetensors"))
    state = {k.replace(".weight", ".default.weight"): v for k, v in weights.items()}
    config = LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, use_rslora=True)

    with pytest.raises(lg.AdapterError) as caught:
        hotswap.hotswap_adapter_from_state_dict(model, state, "default", config)

    assert caught.value.code == "LG105"
    assert "use_rslora is True but the loaded adapter's is False" in str(caught.value)
    assert_bitwise_equal(before, model)


def test_state_dict_swap_whose_a_and_b_disagree_is_refused(adapters: dict[str, Path]) -> None:
    model = loaded(adapters["r8"])
    before = snapshot(model)
    weights = safetensors_torch.load_file(str(adapters["r8"] / "adapter_model.safetensors"))
    state = {k.replace(".weight", ".default.weight"): v for k, v in weights.items()}
    key = "base_model.model.model.layers.1.self_attn.q_proj.lora_B.default.weight"
    state[key] = state[key][:, :4].contiguous()   # B of rank 4 beside A of rank 8

    with pytest.raises(lg.AdapterError) as caught:
        hotswap.hotswap_adapter_from_state_dict(
            model, state, "default", LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS))

    assert caught.value.code == "LG102"
    assert "rank 8" in str(caught.value) and "rank 4" in str(caught.value)
    assert_bitwise_equal(before, model)


def test_warn_mode_lets_the_swap_through_with_a_warning(adapters: dict[str, Path]) -> None:
    model = loaded(adapters["r4"])
    hotswap.prepare_model_for_compiled_hotswap(model, target_rank=8)
    lg.configure(mode="warn")
    try:
        with pytest.warns(lg.LoRAGuardWarning, match="LG001"):
            hotswap.hotswap_adapter(model, adapters["r16"], adapter_name="default")  # type: ignore[arg-type]
    finally:
        lg.configure(mode="raise")


def with_config(source: Path, folder: Path, **changes: object) -> Path:
    """A copy of an adapter whose adapter_config.json was edited after training."""
    shutil.copytree(source, folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, **changes}))
    return folder


def test_a_swap_is_checked_on_what_peft_read_not_read_again(
    adapters: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the checks run on the config and tensors PEFT read: lora_guard opens no file of the
    # folder itself (added_tokens.json, which PEFT does not read, is looked for only)
    def read_again(*args: object, **kwargs: object) -> None:
        raise AssertionError("lora_guard read the adapter folder a second time")

    # a hand-edited config: lora_alpha NaN, which PEFT takes and every output turns NaN
    nan_alpha = with_config(adapters["r8"], tmp_path / "nan-alpha", lora_alpha=float("nan"))
    model, reference = loaded(adapters["r8"]), loaded(adapters["r4"])
    monkeypatch.setattr(peft_guard, "local_adapter", read_again)

    with lg.recording() as rec:
        hotswap.hotswap_adapter(model, adapters["r4"], adapter_name="default")  # type: ignore[arg-type]
    assert rec.violations == []
    before = snapshot(model)
    with pytest.raises(lg.AdapterError, match="lora_alpha") as caught:
        hotswap.hotswap_adapter(model, nan_alpha, adapter_name="default")  # type: ignore[arg-type]

    assert caught.value.code == "LG108"
    assert_bitwise_equal(before, model)
    with torch.inference_mode():
        assert torch.allclose(model(INPUT).logits, reference(INPUT).logits, atol=1e-5)


def test_an_adapter_peft_refuses_first_still_gets_every_defect_with_its_fix(
    adapters: dict[str, Path], tmp_path: Path,
) -> None:
    # PEFT refuses the changed use_rslora before it reads the weights: lora_guard reads the
    # folder then, and its error is raised from PEFT's
    both = with_config(adapters["r8"], tmp_path / "both", use_rslora=True,
                       lora_alpha=float("inf"))
    model = loaded(adapters["r8"])
    before = snapshot(model)

    with pytest.raises(lg.AdapterError, match="Infinity") as caught:
        hotswap.hotswap_adapter(model, both, adapter_name="default")  # type: ignore[arg-type]

    assert caught.value.code == "LG108"
    assert isinstance(caught.value.__context__, ValueError)  # PEFT's own refusal
    assert "use_rslora" in str(caught.value.__context__)
    assert_bitwise_equal(before, model)


def test_a_check_registered_after_a_clean_swap_is_run_on_the_next_swap(
        adapters: dict[str, Path]) -> None:
    # a server that adds its own house rule after start-up: an adapter swapped in clean
    # before is not waved through on the remembered verdict
    model = loaded(adapters["r8"])
    hotswap.hotswap_adapter(model, adapters["r4"], adapter_name="default")  # type: ignore[arg-type]

    @adapter_invariant(
        code="LG197", slug="rank-four-retired", title="Rank 4 adapters are retired here",
        summary="This server no longer serves rank 4.", triggers=("`r` is 4.",),
        fixes=("Retrain at rank 8.",), error="AdapterError",
        messages={"retired": "{subject}: rank 4 is retired."}, raised_by=("hot-swap",))
    def rank_four_retired(ctx: AdapterContext) -> Iterator[Violation]:
        if ctx.spec.config.get("r") == 4:
            yield make_violation("LG197", "retired", ctx.subject)

    try:
        with pytest.raises(lg.AdapterError, match="rank 4 is retired") as caught:
            hotswap.hotswap_adapter(model, adapters["r4"], adapter_name="default")  # type: ignore[arg-type]
    finally:
        remove_invariant("LG197")
    assert caught.value.code == "LG197"
    hotswap.hotswap_adapter(model, adapters["r4"], adapter_name="default")  # type: ignore[arg-type]


def test_peft_alone_refusing_a_swap_keeps_its_own_error(
    adapters: dict[str, Path], tmp_path: Path,
) -> None:
    changed = with_config(adapters["r8"], tmp_path / "rslora", use_rslora=True)
    model = loaded(adapters["r8"])
    with lg.recording() as rec, pytest.raises(ValueError, match="use_rslora"):
        hotswap.hotswap_adapter(model, changed, adapter_name="default")  # type: ignore[arg-type]
    assert rec.violations == []


def test_a_swap_after_the_lora_layers_were_replaced_checks_the_new_ones(
    adapters: dict[str, Path],
) -> None:
    # a first swap, then prepare_model_for_compiled_hotswap puts padded layers in place of
    # the LoRA factors: the next swap is checked against those, not the ones it saw first
    model = loaded(adapters["r8"])
    hotswap.hotswap_adapter(model, adapters["r4"], adapter_name="default")  # type: ignore[arg-type]
    hotswap.prepare_model_for_compiled_hotswap(model, target_rank=8)
    before = snapshot(model)

    with pytest.raises(lg.PoolShapeDriftError, match="rank 16, above the rank 8"):
        hotswap.hotswap_adapter(model, adapters["r16"], adapter_name="default")  # type: ignore[arg-type]
    assert_bitwise_equal(before, model)

def test_a_guarded_swap_walks_the_model_no_more_than_peft_alone(
    adapters: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a walk: the model's modules or its state dict, from the top (cost grows with the model)
    walks: list[str] = []
    depth = [0]

    def counted(name: str) -> object:
        original = getattr(torch.nn.Module, name)

        def walk(self: torch.nn.Module, *args: object, **kwargs: object) -> object:
            if depth[0] == 0:
                walks.append(name)
            depth[0] += 1
            try:
                result = original(self, *args, **kwargs)
                return list(result) if name == "named_modules" else result
            finally:
                depth[0] -= 1
        return walk

    for name in ("named_modules", "state_dict"):
        monkeypatch.setattr(torch.nn.Module, name, counted(name))

    def swap_walks() -> list[str]:
        model = loaded(adapters["r8"])
        walks.clear()
        hotswap.hotswap_adapter(model, adapters["r4"], adapter_name="default")  # type: ignore[arg-type]
        return list(walks)

    guarded = swap_walks()
    peft_guard.uninstrument()
    plain = swap_walks()

    assert plain  # PEFT's swap walks the model itself (0.21: its modules, its state dict)
    assert guarded == plain

# --- loading ---------------------------------------------------------------------------------

def test_loading_an_adapter_from_another_base_leaves_the_model_untouched(
    adapters: dict[str, Path],
) -> None:
    model = loaded(adapters["r8"])
    before = snapshot(model)

    with pytest.raises(lg.AdapterError) as caught:
        model.load_adapter(adapters["narrow"], adapter_name="narrow")

    assert caught.value.code == "LG109"
    assert "adapter 'narrow'" in str(caught.value)
    assert list(model.peft_config) == ["default"]
    assert_bitwise_equal(before, model)


def test_loading_an_adapter_with_an_orphan_half_is_refused(
    adapters: dict[str, Path], tmp_path: Path,
) -> None:
    broken = tmp_path / "orphan"
    shutil.copytree(adapters["r4"], broken)
    file = broken / "adapter_model.safetensors"
    weights = safetensors_torch.load_file(str(file))
    del weights["base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"]
    safetensors_torch.save_file(weights, str(file))
    model = loaded(adapters["r8"])

    with pytest.raises(lg.AdapterError) as caught:
        model.load_adapter(broken, adapter_name="orphan")

    assert caught.value.code == "LG103"
    assert "has lora_A but no lora_B" in str(caught.value)
    assert list(model.peft_config) == ["default"]


def test_loading_an_adapter_whose_config_rank_lies_is_refused(
    adapters: dict[str, Path], tmp_path: Path,
) -> None:
    lying = tmp_path / "lying"
    shutil.copytree(adapters["r4"], lying)
    config = json.loads((lying / "adapter_config.json").read_text())
    config["r"] = 8
    (lying / "adapter_config.json").write_text(json.dumps(config))

    with pytest.raises(lg.AdapterError) as caught:
        loaded(adapters["r8"]).load_adapter(lying, adapter_name="lying")
    assert caught.value.code == "LG102"
    assert "tensors of rank 4 but the config says 8" in str(caught.value)


def test_loading_good_adapters_raises_nothing_and_serves_them(adapters: dict[str, Path]) -> None:
    with lg.recording() as rec:
        model = loaded(adapters["r4"])
        model.load_adapter(adapters["r16"], adapter_name="big")
        model.set_adapter("big")
        with torch.inference_mode():
            out = model(INPUT).logits
        model.delete_adapter("big")
    assert rec.violations == []
    with torch.inference_mode():
        assert torch.allclose(out, loaded(adapters["r16"])(INPUT).logits, atol=1e-5)


def test_a_config_that_leaves_out_what_peft_defaults_is_no_false_alarm(
    adapters: dict[str, Path], tmp_path: Path,
) -> None:
    """PEFT fills in r=8 and lora_alpha=8 for a hand-written config that omits them."""
    terse = tmp_path / "terse"
    shutil.copytree(adapters["r8"], terse)
    config = json.loads((terse / "adapter_config.json").read_text())
    del config["r"], config["lora_alpha"]
    (terse / "adapter_config.json").write_text(json.dumps(config))

    with lg.recording() as rec:
        loaded(adapters["r4"]).load_adapter(terse, adapter_name="terse")
    assert rec.violations == []


class Vision(torch.nn.Module):
    """Layers PEFT adapts beyond linear ones: convolutions and an embedding."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv2d = torch.nn.Conv2d(3, 8, 3)
        self.conv1d = torch.nn.Conv1d(8, 8, 3)
        self.emb = torch.nn.Embedding(10, 8)
        self.lin = torch.nn.Linear(8, 4)


@pytest.mark.parametrize("use_dora", [False, True], ids=["lora", "dora"])
def test_conv_embedding_and_dora_adapters_load_without_a_false_alarm(
    tmp_path: Path, use_dora: bool,
) -> None:
    targets = ["conv2d", "lin"] if use_dora else ["conv2d", "conv1d", "emb", "lin"]
    trained = get_peft_model(Vision(), LoraConfig(r=4, target_modules=targets,
                                                  use_dora=use_dora))
    trained.save_pretrained(tmp_path / "adapter")  # type: ignore[arg-type]

    with lg.recording() as rec:
        model = PeftModel.from_pretrained(Vision(), tmp_path / "adapter")
        model.load_adapter(tmp_path / "adapter", adapter_name="again")

    assert rec.violations == []
    assert sorted(model.peft_config) == ["again", "default"]


def test_loading_an_adapter_from_another_base_names_the_dims(adapters: dict[str, Path]) -> None:
    with pytest.raises(lg.AdapterError) as caught:
        loaded(adapters["r8"]).load_adapter(adapters["narrow"], adapter_name="narrow")
    assert "mlp.down_proj.lora_A.weight (and 1 more) has in dim 96, but down_proj on the " \
        "base model has 128 (Linear.in_features 128)" in str(caught.value)


def mixtral() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.MixtralConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=64, num_local_experts=4, num_experts_per_tok=2)
    return transformers.MixtralForCausalLM(config).eval()  # type: ignore[no-any-return]


def test_an_moe_adapter_of_another_layout_is_refused_against_the_adapters_on_the_model(
        tmp_path: Path) -> None:
    flat = get_peft_model(mixtral(), LoraConfig(
        r=4, target_modules=[], target_parameters=["mlp.experts.gate_up_proj",
                                                    "mlp.experts.down_proj"]))
    assert peft_guard.layout_registry(flat).layout is lg.MoELayout.FLAT
    shared = tmp_path / "shared-outer"
    shared.mkdir()
    prefix = "base_model.model.model.layers.0.mlp.experts"
    safetensors_torch.save_file({
        f"{prefix}.gate_up_proj.lora_A": torch.zeros(1, 8, 32),
        f"{prefix}.gate_up_proj.lora_B": torch.zeros(4, 128, 4),
        f"{prefix}.down_proj.lora_A": torch.zeros(4, 4, 64),
        f"{prefix}.down_proj.lora_B": torch.zeros(1, 32, 4),
    }, str(shared / "adapter_model.safetensors"))
    (shared / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["experts"]}))
    before = snapshot(flat)

    with pytest.raises(lg.MixedMoELayoutError) as caught:
        flat.load_adapter(shared, adapter_name="shared")

    assert caught.value.code == "LG002"
    message = str(caught.value)
    assert "adapter 'shared'" in message and "flat" in message and "'default'" in message
    assert list(flat.peft_config) == ["default"]
    assert_bitwise_equal(before, flat)


# --- instrumenting ---------------------------------------------------------------------------

def test_uninstrument_restores_the_original_functions_exactly() -> None:
    from peft.config import PeftConfigMixin

    def hooked() -> tuple[object, ...]:
        return (vars(PeftModel)["load_adapter"], vars(PeftModel)["add_adapter"],
                hotswap.hotswap_adapter, hotswap.hotswap_adapter_from_state_dict,
                vars(hotswap)["load_peft_weights"], vars(PeftConfigMixin)["from_json_file"])

    peft_guard.uninstrument()
    originals = hooked()
    peft_guard.instrument()
    peft_guard.instrument()   # idempotent
    assert vars(PeftModel)["load_adapter"] is not originals[0]
    assert len(peft_guard.INTEGRATION.patched) == 7

    peft_guard.uninstrument()
    peft_guard.uninstrument()
    assert all(now is before for now, before in zip(hooked(), originals, strict=True))
    assert peft_guard.INTEGRATION.patched == []


def test_an_old_peft_release_is_not_patched_but_warned_about(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    peft_guard.uninstrument()
    monkeypatch.setattr(peft, "__version__", "0.10.0")
    with pytest.warns(lg.integrations.IntegrationWarning, match=r"peft 0\.10\.0 is not patched"):
        peft_guard.instrument()
    assert peft_guard.INTEGRATION.patched == []
    assert vars(PeftModel)["load_adapter"].__name__ == "load_adapter"


def test_loading_an_adapter_whose_layers_to_transform_leaves_out_trained_layers_is_refused(
    adapters: dict[str, Path], tmp_path: Path,
) -> None:
    # trained on every layer; the config edited to layer 0: PEFT alone would drop layer 1
    edited = with_config(adapters["r4"], tmp_path / "edited", layers_to_transform=[0])
    model = loaded(adapters["r8"])
    before = snapshot(model)

    with pytest.raises(lg.AdapterError) as caught:
        model.load_adapter(edited, adapter_name="edited")

    assert caught.value.code == "LG104"
    assert "PEFT puts no LoRA on it (layers_to_transform [0] leaves out its layer 1)" in str(
        caught.value)
    assert list(model.peft_config) == ["default"]
    assert_bitwise_equal(before, model)


def test_loading_an_adapter_with_a_layer_selection_peft_fails_on_is_refused_first(
    adapters: dict[str, Path], tmp_path: Path,
) -> None:
    edited = with_config(adapters["r4"], tmp_path / "edited", layers_to_transform="0")
    model = loaded(adapters["r8"])
    before = snapshot(model)

    with pytest.raises(lg.AdapterError) as caught:  # PEFT alone: a TypeError mid-injection
        model.load_adapter(edited, adapter_name="edited")

    assert caught.value.code == "LG202"
    assert list(model.peft_config) == ["default"]
    assert_bitwise_equal(before, model)
