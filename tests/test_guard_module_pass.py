"""A guard's checks (`spec_violations`, what the engine integrations call at each load) find
the module pass of an adapter once per parts and limits: the adapters of one recipe loaded in
turn share it, and whatever differs in what the module rules read (the base model, the
modules served, the vocab, the modules themselves) is checked again, never answered from
another adapter's outcome."""

from __future__ import annotations

import dataclasses
import pathlib

import lora_guard as lg
from lora_guard._checking.check_adapters import spec_violations
from lora_guard._checking.rules import context
from lora_guard._reading.adapters import LoRAModuleSpec
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
