"""A guard's checks (`spec_violations`, what the engine integrations call at each load) find
the module pass of an adapter once per parts and limits: the adapters of one recipe loaded in
turn share it, and whatever differs in what the module rules read (the base model, the
modules served, the vocab, the modules themselves) is checked again, never answered from
another adapter's outcome."""

from __future__ import annotations

import dataclasses
import pathlib
import tempfile
import types
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lora_guard as lg
from lora_guard import strategies as lgst
from lora_guard._checking.check_adapters import spec_violations
from lora_guard._checking.rules import context
from lora_guard._checking.rules.shared import Grouped
from lora_guard._reading.adapters import LoRAModuleSpec, forget_remembered
from lora_guard._reading.config import FrozenConfig
from lora_guard._reading.grammar import PARTS_FIELDS, parts_of, without_layer
from lora_guard._reading.malformed import Malformed
from lora_guard._testing.adapter_writer import write_adapter

_BASE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
         "model_type": "llama", "architectures": ["LlamaForCausalLM"]}


def _codes(spec: lg.AdapterSpec, limits: lg.ServingLimits,
           vocab_size: int | None = None) -> list[str]:
    return [v.code for v in spec_violations(spec, limits, vocab_size=vocab_size)]


def test_a_recipes_second_adapter_reuses_the_first_ones_module_pass(
        tmp_path: pathlib.Path) -> None:
    """Two adapters of one recipe but for lora_alpha (what the module rules do not read): the
    second load finds the first one's module pass, and its verdict is its own."""
    limits = lg.ServingLimits(max_rank=16, base_config=_BASE)
    first = lg.inspect_adapter(write_adapter(tmp_path / "a", alpha=16))
    second = lg.inspect_adapter(write_adapter(tmp_path / "b", alpha=32))
    assert first.parts_key == second.parts_key and first.config != second.config
    context._GUARDED.clear()
    assert _codes(first, limits) == []
    assert len(context._GUARDED) == 1
    assert _codes(second, limits) == []
    assert len(context._GUARDED) == 1  # found, not made again
    assert _codes(second, lg.ServingLimits(max_rank=4, base_config=_BASE)) == ["LG101"]


def test_another_base_model_is_checked_again_not_answered_from_the_last_one(
        tmp_path: pathlib.Path) -> None:
    """A server of a 64-wide base found the recipe's modules fit; a server of a 128-wide base
    loading the same recipe gets LG109 (the module pass is remembered per base)."""
    spec = lg.inspect_adapter(write_adapter(tmp_path / "a", hidden_size=64))
    assert _codes(spec, lg.ServingLimits(base_config=_BASE)) == []
    wider = lg.ServingLimits(base_config={**_BASE, "hidden_size": 128})
    assert _codes(spec, wider) == ["LG109"]


def test_another_set_of_served_modules_is_checked_again(tmp_path: pathlib.Path) -> None:
    """The recipe's q_proj/v_proj fit a server of both; a server of q_proj alone refuses
    v_proj (LG104), after the first server's clean outcome was remembered."""
    spec = lg.inspect_adapter(write_adapter(tmp_path / "a"))
    assert _codes(spec, lg.ServingLimits(target_modules=("q_proj", "v_proj"))) == []
    assert _codes(spec, lg.ServingLimits(target_modules=("q_proj",))) == ["LG104"]


def test_another_vocab_is_checked_again(tmp_path: pathlib.Path) -> None:
    """An adapter with LoRA on lm_head, checked by a guard that knows the vocab alone: clean
    against 128 tokens, LG109 against 256."""
    spec = lg.inspect_adapter(write_adapter(tmp_path / "a", targets=("q_proj", "lm_head")))
    assert _codes(spec, lg.ServingLimits(), vocab_size=128) == []
    assert _codes(spec, lg.ServingLimits(), vocab_size=256) == ["LG109"]


def test_a_spec_with_its_modules_replaced_is_checked_in_full(tmp_path: pathlib.Path) -> None:
    """A spec changed with dataclasses.replace (a caller's own edit) has no parts key: its
    modules are checked, not answered from the spec it was made from."""
    spec = lg.inspect_adapter(write_adapter(tmp_path / "a"))
    limits = lg.ServingLimits(base_config=_BASE)
    assert _codes(spec, limits) == []
    name = "model.layers.0.self_attn.q_proj"
    wide = dataclasses.replace(spec.modules[name], a_shape=(8, 96))
    edited = dataclasses.replace(spec, modules={**spec.modules, name: wide})
    assert edited.parts_key is None
    assert isinstance(wide, LoRAModuleSpec)
    assert _codes(edited, limits) == ["LG109"]


def test_a_parts_key_and_base_dims_sent_to_another_process_stay_equal(
        tmp_path: pathlib.Path) -> None:
    """Pickled (a worker process), a parts key and the base's dims are hashed again where
    they are read, so they stay equal to the originals (str hashes differ by process)."""
    import pickle

    spec = lg.inspect_adapter(write_adapter(tmp_path / "a"))
    limits = lg.ServingLimits(base_config=_BASE)
    hash(limits.base)  # remembered in this process
    key, base = pickle.loads(pickle.dumps((spec.parts_key, limits.base)))
    assert key == spec.parts_key and hash(key) == hash(spec.parts_key)
    assert base == limits.base and "_hash" not in base.__dict__


# --- one pass over a model's layers: the rules run once per module shape ---------------------

_MODULE_DEFECTS = ("orphan-a", "orphan-b", "rank-mismatch", "config-rank", "empty-tensor",
                   "mixed-dtype", "bad-key", "layer-out-of-range")


def _module_by_module(spec: lg.AdapterSpec, limits: lg.ServingLimits) -> tuple[Any, ...]:
    """The module pass as the rules give it one module at a time (no module's findings said
    of another), to compare the pass with."""
    ctx = context.ModuleContext(
        "a", types.MappingProxyType(
            {name: spec.config[name] for name in PARTS_FIELDS if name in spec.config}),
        *context._held_to(limits), None, None)
    grouped, found, ranks = Grouped(), list[lg.Violation](), dict[int, str]()
    empty = {k for k, info in spec.tensors.items() if 0 in info.shape}
    rules = context._rules()
    for module in spec.modules.values():
        skips = module.a_key in empty or module.b_key in empty
        context._apply_rules(rules, ctx, module, skips, grouped, found)
        if module.rank and not skips:
            ranks.setdefault(module.rank, module.module)
    return list(grouped.items.items()), found, ranks


def _the_pass(spec: lg.AdapterSpec, limits: lg.ServingLimits) -> tuple[Any, ...]:
    run = context.AdapterContext("a", spec, limits)._run_rules()
    return list(run.grouped.items.items()), run.found, run.ranks


def test_an_adapter_of_a_deeper_model_names_each_layer_past_the_base_and_counts_the_rest(
        tmp_path: pathlib.Path) -> None:
    """An adapter trained on a 4-layer, 128-wide model served on the 2-layer, 64-wide base: the
    modules of layers 2 and 3 are said by layer, those of layers 0 and 1 (each module type
    checked once, not once per layer) as dims that do not fit, counted over both layers."""
    spec = lg.inspect_adapter(write_adapter(tmp_path / "deep", layers=4, hidden_size=128,
                                            targets=("q_proj", "v_proj", "down_proj")))
    limits = lg.ServingLimits(base_config=_BASE)
    assert _the_pass(spec, limits) == _module_by_module(spec, limits)
    dims, *layers = spec_violations(spec, limits)
    assert [v.details.get("layer") for v in layers] == [2, 3]
    assert all("(and 2 more) is for layer" in v.message for v in layers)  # 3 modules each
    assert dims.details["count"] == 10  # 5 dims of 3 module types, each in layers 0 and 1
    assert [m["count"] for m in dims.details["mismatches"]] == [2] * 5


def test_a_defect_in_one_layer_is_found_in_that_layer_alone(tmp_path: pathlib.Path) -> None:
    """Layer 1's q_proj written at rank 4 in an r8 adapter: its module is named, and the same
    module of layers 0, 2 and 3 is not (they share what the rules found of layer 0)."""
    from lora_guard._reading.safetensors import encode_header, write_safetensors

    tensors = []
    for layer in range(4):
        for name in ("q_proj", "v_proj"):
            rank = 4 if (layer, name) == (1, "q_proj") else 8
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            out = 64 if name == "q_proj" else 32
            tensors += [(f"{prefix}.lora_A.weight", "float16", (rank, 64)),
                        (f"{prefix}.lora_B.weight", "float16", (out, rank))]
    folder = write_adapter(tmp_path / "a", layers=4)
    header, size = encode_header(tensors)
    write_safetensors(folder / "adapter_model.safetensors", header, size)
    spec = lg.inspect_adapter(folder)
    limits = lg.ServingLimits(base_config={**_BASE, "num_hidden_layers": 4})
    assert _the_pass(spec, limits) == _module_by_module(spec, limits)
    (found,) = spec_violations(spec, limits)
    assert found.code == "LG102" and "model.layers.1.self_attn.q_proj" in found.message
    assert "(and" not in found.message


@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(plan=lgst.adapter_plans(layers=(1, 2, 3), moe_layouts=(*lgst.MOE_LAYOUTS, None),
                               defects=_MODULE_DEFECTS, max_defects=2),
       base_layers=st.sampled_from((1, 2, 3)), hidden=st.sampled_from((64, 128)),
       served=st.sampled_from((None, ("q_proj", "v_proj"), ("layers.0.self_attn.q_proj",),
                               ("q_proj", "gate_up_proj", "down_proj", "experts"))))
def test_the_pass_says_of_each_module_what_the_rules_say_of_it(
        plan: lgst.AdapterPlan, base_layers: int, hidden: int,
        served: tuple[str, ...] | None) -> None:
    """Whatever the adapter (dense or MoE, defects in some layers) and the base it is held to
    (fewer layers, another width, modules not served, one served in one layer alone), the
    pass's findings, their first names, counts and order are those of the rules run on each
    module."""
    with tempfile.TemporaryDirectory() as folder:
        spec = lg.inspect_adapter(plan.write(folder))
    limits = lg.ServingLimits(target_modules=served, base_config={
        **_BASE, "num_hidden_layers": base_layers, "hidden_size": hidden,
        "num_local_experts": 4})
    assert _the_pass(spec, limits) == _module_by_module(spec, limits)


# --- the reader: a model's layers' modules read once per module, each with its own names ----

def _read_alone(spec: lg.AdapterSpec, module: LoRAModuleSpec) -> LoRAModuleSpec:
    """The record of ``module`` read from a header of its halves alone, nothing remembered:
    no other module to be made from."""
    forget_remembered()
    tensors = {k: spec.tensors[k] for k in (module.a_key, module.b_key) if k is not None}
    return parts_of(tensors, FrozenConfig(spec.config)).modules[module.module]


def _same_as_by_records(spec: lg.AdapterSpec) -> tuple[int, ...]:
    """For each module, the position of the first whose record is its own but for its names
    and layer, and whose path is its own but for its layer index."""
    firsts: dict[tuple[Any, ...], int] = {}
    same = []
    for position, m in enumerate(spec.modules.values()):
        a, b = (spec.tensors[k] if k else None for k in (m.a_key, m.b_key))
        kind = (without_layer(m.module), dataclasses.replace(
            m, module="", layer=None, a_key=None, b_key=None),
            a and a.dtype, b and b.dtype)
        same.append(firsts.setdefault(kind, position))
    return tuple(same)


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(plan=lgst.adapter_plans(layers=(1, 2, 3), moe_layouts=(*lgst.MOE_LAYOUTS, None),
                               defects=_MODULE_DEFECTS, max_defects=2))
def test_each_module_is_read_as_it_would_be_alone(plan: lgst.AdapterPlan) -> None:
    """Whatever the adapter, each module's record is the one a header of that module alone
    gives (those made from an earlier layer's included), and the modules the reader says are
    one module of several layers (`AdapterSpec.modules_same_as`) are exactly those."""
    with tempfile.TemporaryDirectory() as folder:
        forget_remembered()
        spec = lg.inspect_adapter(plan.write(folder))
    assert spec.modules_same_as == _same_as_by_records(spec)
    for module in list(spec.modules.values()):
        assert _read_alone(spec, module) == module


def test_modules_named_by_their_layer_index_are_not_one_another(
        tmp_path: pathlib.Path) -> None:
    """A hostile header whose LoRA modules are named by the layer index itself
    (``model.layers.0``, ``model.layers.1``): each is its own target, read on its own."""
    from lora_guard._reading.safetensors import encode_header, write_safetensors

    folder = write_adapter(tmp_path / "a", layers=2)
    header, size = encode_header([
        (f"base_model.model.model.layers.{layer}.lora_{half}.weight", "float16", shape)
        for layer in (0, 1) for half, shape in (("A", (8, 64)), ("B", (64, 8)))])
    write_safetensors(folder / "adapter_model.safetensors", header, size)
    spec = lg.inspect_adapter(folder)
    assert [(m.target, m.layer) for m in spec.modules.values()] == [("0", 0), ("1", 1)]
    assert spec.modules_same_as == (0, 1)


def test_a_rank_pattern_on_one_layers_flat_experts_gives_that_layer_its_rank(
        tmp_path: pathlib.Path) -> None:
    """Flat expert LoRA (rank x experts rows, under ``mlp.experts``) with ``rank_pattern``
    giving layer 1 rank 8 instead of ``r`` 4: the same rows are 4 experts of rank 4 in layer 0
    and 2 of rank 8 in layer 1; neither layer's record is made from the other's."""
    from lora_guard._reading.safetensors import encode_header, write_safetensors

    folder = write_adapter(tmp_path / "a", layers=2, rank=4,
                           rank_pattern={"layers.1.mlp.experts.experts": 8})
    header, size = encode_header([
        (f"base_model.model.model.layers.{layer}.mlp.experts.lora_{half}.weight", "float16",
         shape) for layer in (0, 1) for half, shape in (("A", (16, 64)), ("B", (64, 16)))])
    write_safetensors(folder / "adapter_model.safetensors", header, size)
    forget_remembered()
    spec = lg.inspect_adapter(folder)
    assert [(m.kind, m.rank, m.experts) for m in spec.modules.values()] == [
        ("moe-flat", 4, 4), ("moe-flat", 8, 2)]
    assert spec.modules_same_as == (0, 1)
    again = lg.inspect_adapter(folder)  # the records read again, none remembered wrongly
    assert list(again.modules.values()) == list(spec.modules.values())


_SEGMENTS = ("model", "layers", "h", "blocks", "decoder", "mlp", "experts", "shared_experts",
             "self_attn", "q_proj", "v_proj", "gate_up_proj", "down_proj", "base_layer", "3",
             "")
_INDEXES = ("0", "1", "12", "007", "\u0661", "1234567890")


@st.composite
def _hostile_headers(draw: st.DrawFn) -> dict[str, lg.TensorInfo]:
    """A header of LoRA pairs: a few drawn module paths (empty segments, digits anywhere,
    a leaf named ``experts``), each repeated over a few layers whose index goes anywhere in
    it, after a layer word or not (unicode digits, ten digits, at the end); halves of one of
    two ranks and dtypes, some 3-D, now and then an orphan."""
    tensors: dict[str, lg.TensorInfo] = {}
    indexes = draw(st.lists(st.sampled_from(_INDEXES), min_size=1, max_size=3, unique=True))
    for _ in range(draw(st.integers(1, 4))):
        segments = draw(st.lists(st.sampled_from(_SEGMENTS), min_size=1, max_size=5))
        at = draw(st.integers(0, len(segments)))
        word = draw(st.sampled_from(("layers", "h", "blocks", "layer", "decoder.layers", "mlp")))
        rank = draw(st.sampled_from((4, 8)))
        dtype = draw(st.sampled_from(("float16", "bfloat16")))
        experts = draw(st.sampled_from(((), (2,))))
        for index in indexes:
            path = ".".join([*segments[:at], word, index, *segments[at:]])
            for half, shape in (("A", (*experts, rank, 64)), ("B", (*experts, 64, rank))):
                if draw(st.integers(0, 9)):
                    tensors[f"base_model.model.{path}.lora_{half}.weight"] = lg.TensorInfo(
                        shape, dtype, 0, (0, 0))
    return tensors


@settings(max_examples=200, deadline=None, database=None)
@given(tensors=_hostile_headers(), rank_pattern=st.sampled_from(({}, {"1.*": 8})))
def test_hostile_module_paths_are_read_as_each_would_be_alone(
        tensors: dict[str, lg.TensorInfo], rank_pattern: dict[str, int]) -> None:
    """Whatever the module paths a header holds, each record is the one its pair alone gives
    (or the header is refused as it would be pair by pair), and the modules said to be one
    module of several layers are exactly those equal but for names and layer."""
    config = FrozenConfig({"r": 4, "rank_pattern": rank_pattern})
    forget_remembered()
    try:
        parts = parts_of(tensors, config)
    except Malformed:
        return  # a refusal names its problem (an index of ten digits): nothing half read
    records = list(parts.modules.values())
    for record in records:
        forget_remembered()
        alone = {k: tensors[k] for k in (record.a_key, record.b_key) if k is not None}
        assert parts_of(alone, config).modules[record.module] == record
    firsts: dict[tuple[Any, ...], int] = {}
    expected = [firsts.setdefault((without_layer(m.module), dataclasses.replace(
        m, module="", layer=None, a_key=None, b_key=None), *(
        tensors[k].dtype if k else None for k in (m.a_key, m.b_key))), position)
        for position, m in enumerate(records)]
    assert parts.same_as == tuple(expected)
