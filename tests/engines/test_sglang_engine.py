"""lora_guard's sglang integration on the real sglang 0.5.23 LoRA manager and memory pool.

A server is a real ``LoRAManager`` over sglang's own tiny Llama (`_harness.sglang_server`),
started with ``--max-lora-rank`` / ``--lora-target-modules`` / ``--lora-paths`` as a user
starts one; adapters are real PEFT adapters.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import warnings

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("sglang is not installed: the engine tier runs in its own environment "
                "(tests/engines/run builds it and runs the tier)", allow_module_level=True)

torch = pytest.importorskip("torch")

import _harness as h  # noqa: E402

import lora_guard as lg  # noqa: E402
from lora_guard._checking.engines import profile  # noqa: E402
from lora_guard.integrations import sglang as sglang_guard  # noqa: E402

pytestmark = pytest.mark.xdist_group("sglang")  # one process per engine (see _harness)


@pytest.fixture(scope="module")
def env():
    return h.sglang_env()


@pytest.fixture
def guard(env):
    sglang_guard.instrument()
    yield sglang_guard.INTEGRATION
    sglang_guard.uninstrument()


# --- every hook the integration claims attaches on the real release ------------------------------

def test_every_hook_attaches_on_the_installed_release(env):
    for module in {p.module for p in sglang_guard.INTEGRATION.patches}:
        importlib.import_module(module)  # the Inkling model's module is imported on demand
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        report = sglang_guard.INTEGRATION.instrument()
    try:
        # no IntegrationWarning, but for a hook the release lacks (Inkling V2 before 0.5.23)
        lacks = [hook.split(":", 1)[1] for hook in report.missing]
        assert all(any(name in str(w.message) for name in lacks) for w in said), \
            [str(w.message) for w in said]
        assert profile("sglang", env.version).version == env.version  # a supported release
        assert report.pending == (), report
        # Inkling's V2 sink is new in 0.5.23 (tests/engines/fingerprints/): optional before
        assert set(report.missing) <= {
            f"{p.module}:{p.path}" for p in sglang_guard.INTEGRATION.patches if p.optional}
        assert set(report.attached) | set(report.missing) == {
            f"{p.module}:{p.path}" for p in sglang_guard.INTEGRATION.patches}
        assert report.supported is True
    finally:
        sglang_guard.uninstrument()


# --- start-up: --lora-paths, loaded inside LoRAManager.__init__ ----------------------------------

def test_a_start_up_adapter_above_the_max_rank_stops_the_server(guard, tmp_path):
    big = h.peft_adapter(tmp_path / "big", r=64)

    with pytest.raises(lg.AdapterError) as caught:
        h.sglang_server(max_lora_rank=16, target_modules={"q_proj", "v_proj"},
                        lora_paths=[h.sglang_ref("big", big)])

    assert caught.value.violations[0].code == "LG101"
    assert "adapter 'big'" in str(caught.value) and "16" in str(caught.value)


def test_without_lora_guard_sglang_starts_with_that_adapter_in_silence(env, tmp_path):
    big = h.peft_adapter(tmp_path / "big", r=64)

    manager = h.sglang_server(max_lora_rank=16, target_modules={"q_proj", "v_proj"},
                              lora_paths=[h.sglang_ref("big", big)])

    assert "big" in manager.loras and manager.max_lora_rank == 16  # the rank-16 pool, r=64


def test_a_start_up_rank_pattern_above_the_inferred_rank_is_refused(guard, tmp_path):
    # no --max-lora-rank: sglang sizes the pool from r (8), the q_proj tensors are rank 32
    sneaky = h.peft_adapter(tmp_path / "sneaky", r=8, rank_pattern={"q_proj": 32, "v_proj": 32})

    with pytest.raises(lg.AdapterError, match="rank 32"):
        h.sglang_server(max_lora_rank=None, target_modules=None,
                        lora_paths=[h.sglang_ref("sneaky", sneaky)])


def test_good_start_up_adapters_start_the_server_with_no_violation(guard, tmp_path):
    a = h.peft_adapter(tmp_path / "a", r=8)
    b = h.peft_adapter(tmp_path / "b", r=16, seed=1)

    with lg.recording() as seen:
        manager = h.sglang_server(max_lora_rank=16, target_modules={"q_proj", "v_proj"},
                                  lora_paths=[h.sglang_ref("a", a), h.sglang_ref("b", b)])
        manager.fetch_new_loras({"a", "b"})

    assert seen.violations == []
    assert set(manager.loras) == {"a", "b"}
    assert set(manager.memory_pool.uid_to_buffer_id) == {"a", "b"}


# --- dynamic loads, unload, swap ----------------------------------------------------------------

@pytest.mark.lora_guard(expect=["LG101", "LG112"])  # sglang makes it a failed result
def test_a_dynamic_load_above_the_max_rank_is_a_failed_result_with_the_full_message(
        guard, tmp_path):
    manager = h.sglang_server()
    sneaky = h.peft_adapter(tmp_path / "sneaky", r=8, rank_pattern={"q_proj": 32, "v_proj": 32})

    result = manager.load_lora_adapter(h.sglang_ref("sneaky", sneaky))

    assert result.success is False
    # sglang compares r (8) with the pool and ignores rank_pattern: the rank-32 tensors are
    # above the pool's rank, and would serve at lora_alpha / 8 (sglang's one scaling)
    assert result.error_message.startswith("LG101 rank-exceeds-limit: adapter 'sneaky'")
    assert "rank 32" in result.error_message and "LG112" in result.error_message
    assert manager.loras == {} and manager.configs == {} and manager.lora_refs == {}


def test_sglang_alone_loads_that_rank_pattern_and_fails_only_when_it_is_served(env, tmp_path):
    manager = h.sglang_server()
    sneaky = h.peft_adapter(tmp_path / "sneaky", r=8, rank_pattern={"q_proj": 32, "v_proj": 32})

    result = manager.load_lora_adapter(h.sglang_ref("sneaky", sneaky))
    assert result.success is True  # sglang compares r only
    with pytest.raises(AssertionError, match="does not match weight shape"):
        manager.fetch_new_loras({"sneaky"})


def test_load_serve_unload_and_swap_give_no_violation(guard, tmp_path):
    manager = h.sglang_server(max_loras_per_batch=2)
    a = h.peft_adapter(tmp_path / "a", r=8)
    b = h.peft_adapter(tmp_path / "b", r=4, seed=1)
    c = h.peft_adapter(tmp_path / "c", r=16, seed=2)

    with lg.recording() as seen:
        assert manager.load_lora_adapter(h.sglang_ref("a", a)).success
        assert manager.load_lora_adapter(h.sglang_ref("b", b)).success
        manager.fetch_new_loras({"a"})
        manager.fetch_new_loras({"b"})  # evicts a (LRU) into the one free adapter slot
        assert manager.unload_lora_adapter(h.sglang_ref("a", a)).success
        assert manager.load_lora_adapter(h.sglang_ref("c", c)).success  # the swap
        manager.fetch_new_loras({"c"})

    assert seen.violations == []
    assert set(manager.loras) == {"b", "c"}
    pool = manager.memory_pool
    assert {pool.buffer_id_to_uid[i]: i for i in range(2)} == dict(pool.uid_to_buffer_id)



@pytest.mark.lora_guard(expect=["LG101"])  # the refusal is a failed result
def test_an_adapter_found_clean_is_checked_again_under_another_servers_limits(
        guard, tmp_path):
    # a clean verdict is remembered for the same files under the same limits only: the same
    # adapter on a server with a lower --max-lora-rank is checked again, and refused
    wide = h.peft_adapter(tmp_path / "wide", r=16)
    roomy, tight = h.sglang_server(max_lora_rank=16), h.sglang_server(max_lora_rank=8)

    with lg.recording() as seen:
        for name in ("once", "again"):  # the second load: the remembered verdict
            assert roomy.load_lora_adapter(h.sglang_ref(name, wide)).success
    assert seen.violations == []
    refused = tight.load_lora_adapter(h.sglang_ref("tight", wide))

    assert refused.success is False
    assert refused.error_message.startswith("LG101 rank-exceeds-limit: adapter 'tight'")
    assert tight.loras == {} and set(roomy.loras) == {"once", "again"}


def _never_read_again(monkeypatch):
    """lora_guard's own reader of an adapter folder, replaced by one that fails: a load that
    passes, or is refused with its codes, was checked on what sglang read."""
    def read_again(path, subject, **options):
        raise AssertionError(f"lora_guard read {path} a second time")
    monkeypatch.setattr(sglang_guard, "local_adapter", read_again)


@pytest.mark.lora_guard(expect=["LG101", "LG104", "LG111", "LG112"])  # failed results
def test_a_load_is_checked_on_what_sglang_read_not_read_again(guard, tmp_path, monkeypatch):
    manager = h.sglang_server()
    good = h.peft_adapter(tmp_path / "good", r=8)
    # sglang reads each of these whole and would serve it wrong: rank-32 tensors under r=8
    # (it compares r only), a full weight outside LoRA key grammar (dropped as it reads), q
    # at rank 16 beside v at 8 (stacked into one q/k/v buffer as it reads)
    sneaky = h.peft_adapter(tmp_path / "sneaky", r=8, rank_pattern={"q_proj": 32, "v_proj": 32})
    full = h.peft_adapter(tmp_path / "full", r=8)
    h.edit_weights(full, lambda t: t.update({
        "base_model.model.model.layers.0.self_attn.q_proj.weight": torch.randn(64, 64)}))
    mixed = h.peft_adapter(tmp_path / "mixed", r=8, rank_pattern={"q_proj": 16})
    _never_read_again(monkeypatch)

    with lg.recording() as seen:
        assert manager.load_lora_adapter(h.sglang_ref("good", good)).success
    assert seen.violations == []
    refused = {name: manager.load_lora_adapter(h.sglang_ref(name, path))
               for name, path in (("sneaky", sneaky), ("full", full), ("mixed", mixed))}

    assert refused["sneaky"].error_message.startswith("LG101 rank-exceeds-limit: adapter 'sneaky'")
    assert "LG104" in refused["full"].error_message
    assert "LG111" in refused["mixed"].error_message
    assert not any(result.success for result in refused.values())
    assert set(manager.configs) == set(manager.loras) == set(manager.lora_refs) == {"good"}


@pytest.mark.lora_guard(expect=["LG101", "LG112"])  # a failed result
def test_a_load_whose_read_the_hooks_do_not_see_is_checked_from_the_folder(
        guard, tmp_path, monkeypatch):
    # as if a release read the weights without passing through _normalize_weights: the
    # load guard sees that nothing was checked, checks the folder, and undoes the load
    manager = h.sglang_server()
    adapter = importlib.import_module("sglang.srt.lora.lora").LoRAAdapter
    monkeypatch.setattr(adapter, "_normalize_weights", adapter._normalize_weights.__wrapped__)
    sneaky = h.peft_adapter(tmp_path / "sneaky", r=8, rank_pattern={"q_proj": 32, "v_proj": 32})

    result = manager.load_lora_adapter(h.sglang_ref("sneaky", sneaky))

    assert result.success is False
    assert result.error_message.startswith("LG101 rank-exceeds-limit: adapter 'sneaky'")
    assert manager.configs == {} and manager.loras == {} and manager.lora_refs == {}


@pytest.mark.lora_guard(expect=["LG101", "LG109", "LG112"])  # failed results
def test_a_refused_load_leaves_sglangs_registries_as_they_were(guard, tmp_path):
    # sglang records an adapter's config before it reads the weights; a load refused in
    # that read (by lora_guard, or by sglang itself part-way: a layer the base lacks)
    # leaves every registry as before the load, the pool included
    manager = h.sglang_server()
    good = h.peft_adapter(tmp_path / "good", r=8)
    assert manager.load_lora_adapter(h.sglang_ref("good", good)).success
    manager.fetch_new_loras({"good"})
    sneaky = h.peft_adapter(tmp_path / "sneaky", r=8, rank_pattern={"q_proj": 32, "v_proj": 32})
    beyond = h.peft_adapter(tmp_path / "beyond", r=8)
    h.edit_weights(beyond, lambda t: t.update({
        k.replace(".layers.1.", ".layers.7."): t.pop(k) for k in list(t) if ".layers.1." in k}))
    before = (dict(manager.configs), dict(manager.loras), dict(manager.lora_refs),
              manager.num_pinned_loras, dict(manager.memory_pool.uid_to_buffer_id),
              list(manager.memory_pool.buffer_id_to_uid))
    buffers = h.pool_snapshot(manager)

    for name, path, code in (("sneaky", sneaky, "LG101"), ("beyond", beyond, "LG109")):
        result = manager.load_lora_adapter(h.sglang_ref(name, path))
        assert result.success is False and result.error_message.startswith(code)

    assert (dict(manager.configs), dict(manager.loras), dict(manager.lora_refs),
            manager.num_pinned_loras, dict(manager.memory_pool.uid_to_buffer_id),
            list(manager.memory_pool.buffer_id_to_uid)) == before
    after = h.pool_snapshot(manager)
    assert all(torch.equal(after[k], buffers[k]) for k in buffers)


@pytest.mark.lora_guard(expect=["LG101", "LG105"])  # both refusals are failed results
def test_a_refused_load_leaves_the_pool_bitwise_unchanged_and_no_half_registered_adapter(
        guard, tmp_path):
    manager = h.sglang_server()
    good = h.peft_adapter(tmp_path / "good", r=8)
    assert manager.load_lora_adapter(h.sglang_ref("good", good)).success
    manager.fetch_new_loras({"good"})
    before = h.pool_snapshot(manager)
    maps = (dict(manager.memory_pool.uid_to_buffer_id), list(manager.memory_pool.buffer_id_to_uid))
    dora = h.peft_adapter(tmp_path / "dora", r=8, use_dora=True)
    big = h.peft_adapter(tmp_path / "big", r=64)

    for name, path in (("dora", dora), ("big", big)):
        result = manager.load_lora_adapter(h.sglang_ref(name, path))
        assert result.success is False and result.error_message.startswith("LG1")
        for registry in (manager.configs, manager.loras, manager.lora_refs):
            assert name not in registry

    after = h.pool_snapshot(manager)
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert (dict(manager.memory_pool.uid_to_buffer_id),
            list(manager.memory_pool.buffer_id_to_uid)) == maps


# --- batch preparation -------------------------------------------------------------------------

def _three_adapters_two_slots(tmp_path):
    """A server of two batch slots with three adapters loaded (a0, a1, a2)."""
    manager = h.sglang_server(max_loras_per_batch=2)
    for i in range(3):
        path = h.peft_adapter(tmp_path / f"a{i}", r=4, seed=i)
        assert manager.load_lora_adapter(h.sglang_ref(f"a{i}", path)).success
    return manager


def test_a_batch_with_more_adapters_than_slots_is_refused_before_sglangs_assert(
        guard, tmp_path):
    manager = _three_adapters_two_slots(tmp_path)

    with pytest.raises(lg.RegistryError, match="LG201"):
        manager.memory_pool.prepare_lora_batch(
            cur_uids={"a0", "a1", "a2"}, lora_adapters=manager.loras,
            lora_modules=manager.lora_modules, lora_refs=dict(manager.lora_refs),
            lora_embed_tokens_module=None, lora_lm_head_module=None)
    assert set(manager.memory_pool.uid_to_buffer_id) == {None}  # nothing was loaded


def test_slot_maps_broken_after_many_clean_steps_are_reported_at_the_next_step(
        guard, tmp_path):
    # steps whose adapters stay resident are not re-checked; a map changed behind the
    # pool's back (a slot that lost its adapter) is caught at the very next step
    manager = h.sglang_server(max_loras_per_batch=2)
    path = h.peft_adapter(tmp_path / "a", r=8)
    assert manager.load_lora_adapter(h.sglang_ref("a", path)).success
    for _ in range(3):
        manager.fetch_new_loras({"a"})
    pool = manager.memory_pool
    pool.buffer_id_to_uid[pool.uid_to_buffer_id["a"]] = h.sglang_env().pool.EMPTY_SLOT

    with pytest.raises(lg.RegistryError, match="LG201"):
        manager.fetch_new_loras({"a"})



def test_steps_of_resident_adapters_go_straight_to_sglang(guard, tmp_path, monkeypatch):
    # sglang passes the batch's adapters by keyword each step; with the pool's maps as the
    # guard verified them (the slot list heard no write, the dict equals its verified copy),
    # a step runs sglang's own code: the guard's verification does not run at all
    manager = h.sglang_server(max_loras_per_batch=2)
    for name in ("a", "b"):
        path = h.peft_adapter(tmp_path / name, r=8)
        assert manager.load_lora_adapter(h.sglang_ref(name, path)).success
    manager.fetch_new_loras({"a", "b"})  # the first step: slots assigned and verified
    checks = []
    verify = sglang_guard._verify_maps

    def counted(pool):
        checks.append(pool)
        return verify(pool)

    monkeypatch.setattr(sglang_guard, "_verify_maps", counted)
    for _ in range(5):
        manager.fetch_new_loras({"a", "b"})
    assert checks == []

    manager.fetch_new_loras({"a"})  # a batch of one: the maps stay as they were
    assert checks == []


def test_a_swap_is_verified_at_its_own_step_and_the_next_steps_go_straight_to_sglang(
        guard, tmp_path, monkeypatch):
    manager = h.sglang_server(max_loras_per_batch=2)
    for name in ("a", "b", "c"):
        path = h.peft_adapter(tmp_path / name, r=8)
        assert manager.load_lora_adapter(h.sglang_ref(name, path)).success
    manager.fetch_new_loras({"a", "b"})
    checks = []
    verify = sglang_guard._verify_maps
    monkeypatch.setattr(sglang_guard, "_verify_maps", lambda pool: checks.append(pool) or
                        verify(pool))

    manager.fetch_new_loras({"c", "b"})  # c evicts a: sglang writes both maps
    assert checks == [manager.memory_pool]
    manager.fetch_new_loras({"c", "b"})
    assert checks == [manager.memory_pool]
    assert manager.memory_pool.buffer_id_to_uid[manager.memory_pool.uid_to_buffer_id["c"]] == "c"


def test_a_slot_dict_changed_behind_the_pools_back_is_reported_at_the_next_step(
        guard, tmp_path):
    # the slot list untouched, the dict rewritten: a points at b's slot
    manager = h.sglang_server(max_loras_per_batch=2)
    for name in ("a", "b"):
        path = h.peft_adapter(tmp_path / name, r=8)
        assert manager.load_lora_adapter(h.sglang_ref(name, path)).success
    for _ in range(3):
        manager.fetch_new_loras({"a", "b"})
    pool = manager.memory_pool
    pool.uid_to_buffer_id["a"] = pool.uid_to_buffer_id["b"]

    with pytest.raises(lg.RegistryError, match="LG201"):
        manager.fetch_new_loras({"a", "b"})


def test_too_many_adapters_on_a_verified_pool_are_refused_before_sglang_changes_anything(
        guard, tmp_path):
    manager = _three_adapters_two_slots(tmp_path)
    manager.fetch_new_loras({"a0", "a1"})
    pool = manager.memory_pool
    before = (dict(pool.uid_to_buffer_id), list(pool.buffer_id_to_uid),
              dict(pool.eviction_policy.access_order))

    with pytest.raises(lg.RegistryError, match="LG201"):
        pool.prepare_lora_batch(
            cur_uids={"a0", "a1", "a2"}, lora_adapters=manager.loras,
            lora_modules=manager.lora_modules, lora_refs=dict(manager.lora_refs),
            lora_embed_tokens_module=None, lora_lm_head_module=None)
    assert (dict(pool.uid_to_buffer_id), list(pool.buffer_id_to_uid),
            dict(pool.eviction_policy.access_order)) == before


def test_the_pools_slot_list_copies_and_pickles_as_sglangs_and_is_given_back_on_uninstrument(
        env, tmp_path):
    import copy
    import pickle

    manager = h.sglang_server(max_loras_per_batch=2)  # started before lora_guard
    for name in ("a", "b", "c"):
        path = h.peft_adapter(tmp_path / name, r=8)
        assert manager.load_lora_adapter(h.sglang_ref(name, path)).success
    pool = manager.memory_pool
    own = pool.buffer_id_to_uid
    sglang_guard.instrument()
    try:
        manager.fetch_new_loras({"a", "b"})
        assert pool.buffer_id_to_uid is not own  # verified: the list that hears its writes
        slots = pool.buffer_id_to_uid
        for found in (copy.copy(slots), copy.deepcopy(slots), pickle.loads(pickle.dumps(slots)),
                      slots[:]):
            assert type(found) is list and found == list(slots)
        # what the ranks of a tensor-parallel server compare is the same as sglang's own
        plain = {"uid_to_slot": dict(pool.uid_to_buffer_id), "slot_to_uid": list(slots)}
        assert lg.rank_fingerprint({"uid_to_slot": pool.uid_to_buffer_id,
                                    "slot_to_uid": slots}) == lg.rank_fingerprint(plain)
        manager.fetch_new_loras({"c", "b"})  # a swap: the maps change under the guard
        now = list(pool.buffer_id_to_uid)
    finally:
        sglang_guard.uninstrument()
    assert pool.buffer_id_to_uid is own and type(own) is list and own == now
    assert type(pool.uid_to_buffer_id) is dict


# --- pinned lookups (sglang 0.5.23 pins per adapter: layer.pinned_weights) -----------------------

def test_a_normal_load_with_per_adapter_pinned_weights_gives_no_false_lg003(guard, tmp_path):
    manager = h.sglang_server()
    pool = manager.memory_pool
    a = h.peft_adapter(tmp_path / "a", r=8)
    assert manager.load_lora_adapter(h.sglang_ref("a", a)).success
    layer = manager.loras["a"].layers[0]
    name, weight = next(iter(layer.weights.items()))
    # the adapter's own store holds what sglang staged for this name before (a slice of
    # the stacked qkv weight); the engine does not consult it here (no overlap loading)
    layer.pinned_weights[name] = weight[:1].clone()

    with lg.recording() as seen:
        served = pool._get_maybe_cached_weight_for_transfer(layer.pinned_weights, name, weight)

    assert served is weight  # the engine returns the right weight...
    assert seen.violations == []  # ...so lora_guard has nothing to say


def _pinning(pool, monkeypatch):
    """The pool as on a GPU host: pinning available, overlap loading on; on this CPU a pin
    is a copy (``pin_memory`` needs an accelerator)."""
    monkeypatch.setattr(pool, "pin_memory_available", True)
    monkeypatch.setattr(pool, "enable_lora_overlap_loading", True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self.clone())


def test_a_stale_pinned_hit_at_a_swap_in_is_lg003_with_its_fix(guard, tmp_path, monkeypatch):
    # a swap-in reads each weight through the adapter layer's pinned store: an entry left
    # there with another shape (seed 002) is refused before the stale tensor is copied
    # (by sglang itself from 0.5.23, by lora_guard before), as LG003 with its fix
    manager = h.sglang_server(max_loras_per_batch=2)
    pool = manager.memory_pool
    _pinning(pool, monkeypatch)
    for name, seed in (("a", 0), ("b", 1), ("c", 2)):
        path = h.peft_adapter(tmp_path / name, r=8, seed=seed)
        assert manager.load_lora_adapter(h.sglang_ref(name, path)).success
    with lg.recording() as seen:
        manager.fetch_new_loras({"a"})  # a's weights pinned, its layer stores filled
        manager.fetch_new_loras({"b", "c"})  # a evicted; its stores stay
    assert seen.violations == []
    store = manager.loras["a"].layers[0].pinned_weights
    key, pinned = next(iter(store.items()))
    stale = torch.zeros(pinned.shape[0] * 2, *pinned.shape[1:], dtype=pinned.dtype)
    store[key] = stale

    with pytest.raises(lg.CacheKeyCollisionError, match="LG003 cache-key-collision") as refused:
        manager.fetch_new_loras({"a"})

    assert lg.INVARIANTS["LG003"].fixes[0] in str(refused.value)
    assert repr(key) in str(refused.value) and "the stale tensor would be served" in str(
        refused.value)
    assert store[key] is stale  # the store as it was
    assert "a" not in pool.uid_to_buffer_id  # not served from the stale tensor


def test_a_swap_in_failing_otherwise_keeps_sglangs_own_error(guard, tmp_path, monkeypatch):
    # only sglang's refusal of a stale pinned hit becomes LG003: another ValueError of the
    # swap-in (here a weight sglang cannot map to a target) is sglang's, unchanged
    manager = h.sglang_server(max_loras_per_batch=2)
    path = h.peft_adapter(tmp_path / "a", r=8)
    assert manager.load_lora_adapter(h.sglang_ref("a", path)).success
    layer = manager.loras["a"].layers[0]
    layer.weights["model.layers.0.self_attn.no_such_proj.lora_A.weight"] = torch.zeros(8, 64)

    with pytest.raises(ValueError) as raised:
        manager.fetch_new_loras({"a"})
    assert not isinstance(raised.value, lg.LoRAGuardError)


def test_a_pinned_hit_goes_straight_to_sglang_where_it_checks_hits_itself(guard, env):
    # from 0.5.23 sglang refuses a stale hit itself: its lookup is left as it is (a hit
    # costs nothing), and the swap-in guard reports that refusal; before, every hit is
    # checked by lora_guard first
    cached = env.pool.LoRAMemoryPool._get_maybe_cached_weight_for_transfer
    own = "lora_guard" not in getattr(cached, "__module__", "") and not hasattr(
        cached, "__wrapped__")
    assert own is (tuple(int(p) for p in env.version.split(".")[:3]) >= (0, 5, 23))


# --- the Inkling shared sink, version 2 ----------------------------------------------------------

def _bare_sink(cls, n: int):
    sink = cls.__new__(cls)
    torch.nn.Module.__init__(sink)
    sink.n_shared_experts = n
    sink._down_cat = None
    return sink


def _sink_buffers(slots: int, n: int, rank: int, hidden: int = 64, f: int = 32):
    return (torch.zeros(slots, 1, 2 * rank, hidden), torch.zeros(slots, n, 2 * f, rank),
            torch.zeros(slots, n, rank, f), torch.zeros(slots, 1, hidden, rank))


def test_the_inkling_v2_sink_is_guarded_and_refuses_a_rank_change(guard, env):
    from sglang.srt.models.inkling_common import lora as inkling

    if not hasattr(inkling, "InklingBatchDenseMLPWithLoRAV2"):
        pytest.skip(f"sglang {env.version} has no Inkling V2 sink (new in 0.5.23)")

    assert "sglang.srt.models.inkling_common.lora:InklingBatchDenseMLPWithLoRAV2.set_lora_info" \
        in sglang_guard.INTEGRATION.patched
    sink = _bare_sink(inkling.InklingBatchDenseMLPWithLoRAV2, n=2)
    with pytest.raises(lg.ShapeContractError, match="LG004"):  # outer 3: neither 1 nor n
        sink.set_lora_info(torch.zeros(2, 3, 16, 64), *_sink_buffers(2, 2, 8)[1:])
    assert sink._down_cat is None  # refused before the layer touched anything


# --- the fused-MoE LoRA layer: the seed-000 pool contract on the real class -------------------

def _moe_buffers(slots: int, experts: int, rank: int, hidden: int = 64, f: int = 32,
                 outer: int | None = None):
    outer = experts if outer is None else outer
    return (torch.zeros(slots, outer, 2 * rank, hidden), torch.zeros(slots, experts, 2 * f, rank),
            torch.zeros(slots, experts, rank, f), torch.zeros(slots, outer, hidden, rank))


def test_a_fused_moe_pool_whose_rank_changes_is_refused_before_the_layer_takes_it(guard, env):
    layer = env.layers.FusedMoEWithLoRA.__new__(env.layers.FusedMoEWithLoRA)
    torch.nn.Module.__init__(layer)
    first = _moe_buffers(2, 4, 8)

    with lg.recording() as seen:
        layer.set_lora_info(*first)  # the pool sglang allocates at start-up
        layer.set_lora_info(*_moe_buffers(2, 4, 8))  # update_lora_info again, same pool
    assert seen.violations == []
    with pytest.raises(lg.PoolShapeDriftError, match="LG001"):
        layer.set_lora_info(*_moe_buffers(2, 4, 16))  # a re-initialised pool of rank 16
    with pytest.raises(lg.ShapeContractError, match="LG004"):
        layer.set_lora_info(*_moe_buffers(2, 4, 8, outer=3))  # outer neither 1 nor experts
    assert layer.down_lora_a_weights.shape == (2, 4, 8, 32)  # still the rank-8 pool


# --- the other entry points, on the real classes -------------------------------------------------

def test_validating_outside_a_load_runs_the_same_checks(guard, tmp_path):
    manager = h.sglang_server()
    dora = h.peft_adapter(tmp_path / "dora", r=8, use_dora=True)
    from sglang.srt.lora.lora_config import LoRAConfig

    with pytest.raises(lg.AdapterError, match="LG105"):
        manager.validate_new_adapter(LoRAConfig(str(dora), base_vocab_size=h.VOCAB),
                                     h.sglang_ref("dora", dora))


def test_loading_into_a_slot_outside_the_pool_is_refused_before_the_buffer_is_written(
        guard, tmp_path):
    manager = h.sglang_server(max_loras_per_batch=2)
    a = h.peft_adapter(tmp_path / "a", r=8)
    assert manager.load_lora_adapter(h.sglang_ref("a", a)).success
    before = h.pool_snapshot(manager)

    with pytest.raises(lg.RegistryError, match="LG201"):
        manager.memory_pool.load_lora_weight_to_buffer(
            "a", 2, manager.loras["a"], manager.lora_modules, None, None)
    after = h.pool_snapshot(manager)
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_uninstrument_restores_every_real_original_exactly(env):
    import sglang.srt.lora.lora_manager as lora_manager

    for module in {p.module for p in sglang_guard.INTEGRATION.patches}:
        importlib.import_module(module)
    # the hooks this release has (Inkling's V2 sink only from 0.5.23)
    present = [p for p in sglang_guard.INTEGRATION.patches if _has(p)]
    originals = {p.path: vars(_owner(p)).get(p.path.rsplit(".", 1)[-1]) for p in present}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", lg.integrations.IntegrationWarning)
        sglang_guard.instrument()
    assert lora_manager.LoRAManager.load_lora_adapter is not originals[
        "LoRAManager.load_lora_adapter"]
    sglang_guard.uninstrument()
    for patch in present:
        assert vars(_owner(patch))[patch.path.rsplit(".", 1)[-1]] is originals[patch.path]


def _has(patch):
    try:
        _owner(patch)
    except AttributeError:
        return False
    return True


def _owner(patch):
    owner = importlib.import_module(patch.module)
    for part in patch.path.split(".")[:-1]:
        owner = getattr(owner, part)
    return owner


def test_a_hook_whose_target_this_release_lacks_warns_naming_it_and_the_version(
        env, monkeypatch):
    # as if a release had renamed unload_lora_adapter: lora_manager's guards are left off
    # (they would be wrong there), the memory pool's attach, and the warning says which
    monkeypatch.delattr(env.manager.LoRAManager, "unload_lora_adapter")
    try:
        with pytest.warns(lg.integrations.IntegrationWarning,
                          match=rf"sglang {re.escape(env.version)} is not patched in "
                                r"sglang\.srt\.lora\.lora_manager.*LoRAManager\."
                                r"unload_lora_adapter: missing"):
            report = sglang_guard.instrument()
        assert "sglang.srt.lora.lora_manager:LoRAManager.unload_lora_adapter" in report.missing
        assert "sglang.srt.lora.mem_pool:LoRAMemoryPool.prepare_lora_batch" in report.attached
    finally:
        sglang_guard.uninstrument()


@pytest.mark.lora_guard(expect=["LG105"])  # a failed result, as sglang reports a refusal
def test_a_refused_swap_leaves_the_pool_bitwise_unchanged_and_the_other_adapter_served(
        guard, tmp_path):
    manager = h.sglang_server(max_loras_per_batch=2)
    a = h.peft_adapter(tmp_path / "a", r=8)
    b = h.peft_adapter(tmp_path / "b", r=4, seed=1)
    for name, path in (("a", a), ("b", b)):
        assert manager.load_lora_adapter(h.sglang_ref(name, path)).success
    manager.fetch_new_loras({"a", "b"})
    assert manager.unload_lora_adapter(h.sglang_ref("a", a)).success
    before = h.pool_snapshot(manager)
    maps = (dict(manager.memory_pool.uid_to_buffer_id), list(manager.memory_pool.buffer_id_to_uid))
    dora = h.peft_adapter(tmp_path / "dora", r=8, use_dora=True)

    result = manager.load_lora_adapter(h.sglang_ref("dora", dora))  # in a's place

    assert result.success is False and result.error_message.startswith("LG105")
    assert set(manager.loras) == {"b"} and "dora" not in manager.configs
    after = h.pool_snapshot(manager)
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert (dict(manager.memory_pool.uid_to_buffer_id),
            list(manager.memory_pool.buffer_id_to_uid)) == maps
    manager.fetch_new_loras({"b"})  # b still serves from its slot


def test_an_fp16_adapter_on_a_bf16_model_is_cast_and_served_with_no_violation(
        guard, tmp_path):
    manager = h.sglang_server(dtype=torch.bfloat16)
    half = h.peft_adapter(tmp_path / "half", r=8)
    h.edit_weights(half, lambda t: t.update({k: v.half() for k, v in t.items()}))

    with lg.recording() as seen:
        assert manager.load_lora_adapter(h.sglang_ref("half", half)).success
        manager.fetch_new_loras({"half"})

    assert seen.violations == []  # sglang copies into its bf16 pool: LG106 is not an error
    assert {t.dtype for t in h.pool_snapshot(manager).values()} == {torch.bfloat16}


def test_the_profile_flags_are_the_releases_own_names_defaults_and_choices(env):
    import argparse

    from sglang.srt.server_args import ServerArgs


    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    actions = {name: a for a in parser._actions for name in a.option_strings}
    release = profile("sglang", env.version)
    for flag in release.flags:
        action = actions[flag.name]
        assert action.default == flag.default, flag.name
        if flag.choices:
            assert set(action.choices) == set(flag.choices), flag.name
    lora = {n for n in actions if "lora" in n and not n.startswith("--no-")}
    known = {f.name for f in release.flags} | NO_BEARING
    assert lora <= known, f"LoRA flags of sglang {env.version} the profile lacks: {lora - known}"


NO_BEARING = {"--enable-lora-overlap-loading", "--lora-backend", "--lora-drain-wait-threshold",
              "--lora-eviction-policy", "--lora-use-virtual-experts", "--max-lora-chunk-size",
              "--uno-lora-path"}
"""sglang's LoRA flags that do not change what it loads (kernels, scheduling, transfers); the
sglang page lists them as ignored."""


# --- the pool's modules, measured on the real engine (sglang-field) ------------------------------
# sglang skips an adapter's weights outside its pool's modules with a warning, then fails the
# first batch that uses it ("Cannot find target module name"); a config naming such a module is
# refused at load. LoRA on embed_tokens / lm_head that the adapter's own config does not name is
# dropped as the adapter is read, with a debug line: the base embedding is served.


def _config_cut(tmp_path, name, trained, kept):
    """Trained on ``trained``, its config's target_modules cut to ``kept`` afterwards (a
    conversion script, a hand edit): the weights still hold every trained module."""
    return h.edit_config(h.peft_adapter(tmp_path / name, target_modules=trained),
                         target_modules=kept)


def _qvo_cut_to_qv(tmp_path):
    return _config_cut(tmp_path, "edited", ["q_proj", "v_proj", "o_proj"], ["q_proj", "v_proj"])


def test_without_lora_guard_a_start_up_adapter_outside_the_inferred_pool_fails_its_first_batch(
        env, tmp_path):
    edited = _qvo_cut_to_qv(tmp_path)

    manager = h.sglang_server(max_lora_rank=16, target_modules=None,
                              lora_paths=[h.sglang_ref("edited", edited)])

    assert manager.memory_pool.target_modules == {"qkv_proj"}  # the start-up configs' union
    with pytest.raises(ValueError, match=r"Cannot find target module name for \S+o_proj"):
        manager.fetch_new_loras({"edited"})  # the first batch: the scheduler stops


def test_a_start_up_adapter_outside_the_inferred_pool_stops_the_server_as_check_says(
        guard, env, tmp_path):
    edited = _qvo_cut_to_qv(tmp_path)

    with pytest.raises(lg.AdapterError) as caught:
        h.sglang_server(max_lora_rank=16, target_modules=None,
                        lora_paths=[h.sglang_ref("edited", edited)])

    assert [v.code for v in caught.value.violations] == ["LG104"]
    said = str(caught.value)
    assert "adapter 'edited'" in said and "model.layers.0.self_attn.o_proj (and 1 more)" in said
    checked = lg.check_adapters([edited], lg.ServingLimits.for_engine(
        "sglang", "--max-lora-rank", "16", version=env.version))
    assert checked.codes() == ["LG104"]  # `lora-guard check --engine sglang`: the same


def test_start_up_adapters_whose_union_holds_every_weight_serve_with_no_violation(
        guard, env, tmp_path):
    edited = _qvo_cut_to_qv(tmp_path)
    full = h.peft_adapter(tmp_path / "full", target_modules=["q_proj", "v_proj", "o_proj"],
                          seed=1)

    with lg.recording() as seen:
        manager = h.sglang_server(max_lora_rank=16, target_modules=None, lora_paths=[
            h.sglang_ref("edited", edited), h.sglang_ref("full", full)])
        manager.fetch_new_loras({"edited", "full"})  # o_proj is in the pool: both serve

    assert seen.violations == []
    assert manager.memory_pool.target_modules == {"qkv_proj", "o_proj"}
    assert lg.check_adapters([edited, full], lg.ServingLimits.for_engine(
        "sglang", "--max-lora-rank", "16", version=env.version)).ok


@pytest.mark.parametrize("embedding", ["lm_head", "embed_tokens"])
def test_without_lora_guard_embedding_lora_the_config_does_not_name_is_dropped(
        env, tmp_path, embedding):
    cut = _config_cut(tmp_path, "cut", ["q_proj", "v_proj", embedding], ["q_proj", "v_proj"])
    manager = h.sglang_server(max_lora_rank=16, target_modules={"all"})

    assert manager.load_lora_adapter(h.sglang_ref("cut", cut)).success
    manager.fetch_new_loras({"cut"})

    assert manager.loras["cut"].embedding_layers == {}  # the trained LoRA was never read
    slot = manager.memory_pool.uid_to_buffer_id["cut"]
    buffers = (manager.memory_pool.lm_head_A_buffer if embedding == "lm_head"
               else manager.memory_pool.embedding_A_buffer)
    assert not buffers[embedding][slot].any()  # the slot serves the base embedding


@pytest.mark.lora_guard(expect=["LG104"])  # sglang makes it a failed result
@pytest.mark.parametrize("embedding", ["lm_head", "embed_tokens"])
def test_embedding_lora_the_config_does_not_name_is_refused_at_load(guard, env, tmp_path,
                                                                     embedding):
    cut = _config_cut(tmp_path, "cut", ["q_proj", "v_proj", embedding], ["q_proj", "v_proj"])
    manager = h.sglang_server(max_lora_rank=16, target_modules={"all"})

    result = manager.load_lora_adapter(h.sglang_ref("cut", cut))

    assert result.success is False
    assert result.error_message.startswith("LG104 unsupported-target: adapter 'cut'")
    assert f"does not name {embedding}" in result.error_message
    assert "dropped without a word" in result.error_message
    assert manager.loras == {} and manager.configs == {}


def test_embedding_lora_the_config_names_serves_with_no_violation(guard, env, tmp_path):
    named = h.peft_adapter(tmp_path / "named", target_modules=[
        "q_proj", "v_proj", "lm_head", "embed_tokens"])
    manager = h.sglang_server(max_lora_rank=16, target_modules={"all"})

    with lg.recording() as seen:
        assert manager.load_lora_adapter(h.sglang_ref("named", named)).success
        manager.fetch_new_loras({"named"})

    assert seen.violations == []
    assert manager.loras["named"].embedding_layers  # read, and served from the pool


SEVEN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _refused_or_fails_the_first_batch(manager, result, config):
    """What sglang does with the "seven" adapter's weights outside its pool: a config that
    lists them is refused at load (can_support); one saying "all-linear" loads, and the first
    batch that uses it fails."""
    if config == "listed":
        assert result.success is False and "incompatible with the current LoRA memory pool" \
            in result.error_message
    else:
        assert result.success is True
        with pytest.raises(ValueError, match="Cannot find target module name"):
            manager.fetch_new_loras({"seven"})


@pytest.mark.parametrize("config", ["listed", "all-linear"])
def test_without_lora_guard_weights_outside_the_pool_are_refused_or_fail_the_first_batch(
        env, tmp_path, config):
    """Trained on the seven projections, loaded into --lora-target-modules q_proj v_proj:
    sglang never serves part of it. A config listing them is refused (can_support); one saying
    "all-linear" loads, its o/gate/up/down weights are skipped with a warning, and the first
    batch that uses it fails (the scheduler stops)."""
    folder = h.peft_adapter(tmp_path / "seven", target_modules=SEVEN)
    if config == "all-linear":
        h.edit_config(folder, target_modules="all-linear")
    manager = h.sglang_server(max_lora_rank=16, target_modules={"q_proj", "v_proj"})

    result = manager.load_lora_adapter(h.sglang_ref("seven", folder))

    _refused_or_fails_the_first_batch(manager, result, config)


@pytest.mark.lora_guard(expect=["LG104"])  # sglang makes it a failed result
@pytest.mark.parametrize(("config", "outcome"), [
    ("listed", "refuses the load"),
    ("all-linear", "loads the adapter, skips these weights with a warning and fails the first "
                   "batch that uses it")])
def test_weights_outside_the_pool_are_refused_at_load_saying_what_sglang_would_do(
        guard, env, tmp_path, config, outcome):
    folder = h.peft_adapter(tmp_path / "seven", target_modules=SEVEN)
    if config == "all-linear":
        h.edit_config(folder, target_modules="all-linear")
    manager = h.sglang_server(max_lora_rank=16, target_modules={"q_proj", "v_proj"})

    result = manager.load_lora_adapter(h.sglang_ref("seven", folder))

    assert result.success is False
    said = result.error_message
    assert said.startswith("LG104 unsupported-target: adapter 'seven': module ")
    assert all(f"({t}) is not among sglang=={env.version}'s LoRA modules" in said
               for t in ("o_proj", "gate_proj", "up_proj", "down_proj"))
    assert outcome in said and "--lora-target-modules naming every module" in said
    assert manager.loras == {} and manager.configs == {}


def _flat_moe_adapter(tmp_path):
    """PEFT's target_parameters adapter on the tier's tiny Qwen2-MoE (transformers fuses its
    experts into 3-D parameters): expert LoRA saved as mlp.experts.base_layer.lora_A/B
    (gate_up) and mlp.experts.lora_A/B (down), next to q/v LoRA."""
    import moe
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(moe.qwen2_moe_config())
    get_peft_model(model, LoraConfig(
        r=8, target_modules=["q_proj", "v_proj"],
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
    )).save_pretrained(str(tmp_path / "flat"))
    return tmp_path / "flat"


def _moe_server(env):
    import moe
    from sglang.srt.models.qwen2_moe import Qwen2MoeForCausalLM

    config = moe.qwen2_moe_config()
    return env.manager.LoRAManager(
        Qwen2MoeForCausalLM(config, quant_config=None), config, max_loras_per_batch=2,
        load_config=env.LoadConfig(), dtype=torch.float32, server_args=env.args,
        lora_backend="torch_native", max_lora_rank=16, target_modules={"all"}, lora_paths=None)


def test_without_lora_guard_target_parameters_experts_fail_the_first_batch(env, tmp_path):
    flat = _flat_moe_adapter(tmp_path)
    manager = _moe_server(env)

    assert manager.load_lora_adapter(h.sglang_ref("flat", flat)).success  # loads
    with pytest.raises(ValueError, match=r"Cannot find target module name for \S+experts"):
        manager.fetch_new_loras({"flat"})  # the first batch that uses it


@pytest.mark.lora_guard(expect=["LG104"])  # sglang makes it a failed result
def test_target_parameters_experts_are_refused_at_load_as_check_says(guard, env, tmp_path):
    flat = _flat_moe_adapter(tmp_path)
    manager = _moe_server(env)

    result = manager.load_lora_adapter(h.sglang_ref("flat", flat))

    assert result.success is False
    assert result.error_message.startswith("LG104 unsupported-target: adapter 'flat': ")
    assert "in the layout of PEFT's target_parameters" in result.error_message
    checked = lg.check_adapters([flat], lg.ServingLimits.for_engine(
        "sglang", "--max-lora-rank", "16", "--lora-target-modules", "all",
        version=env.version))
    assert checked.codes() == ["LG104", "LG104"]  # gate_up and down


def _inferred_qv_server(tmp_path):
    """A server started with a q/v adapter and no --lora-target-modules: its pool is
    {qkv_proj}, the start-up adapter's target_modules."""
    qv = h.peft_adapter(tmp_path / "qv")
    return h.sglang_server(max_lora_rank=16, target_modules=None,
                           lora_paths=[h.sglang_ref("qv", qv)])


@pytest.mark.parametrize("config", ["listed", "all-linear"])
def test_without_lora_guard_a_later_load_outside_the_inferred_pool_is_refused_or_fails(
        env, tmp_path, config):
    manager = _inferred_qv_server(tmp_path)
    folder = h.peft_adapter(tmp_path / "seven", target_modules=SEVEN, seed=1)
    if config == "all-linear":
        h.edit_config(folder, target_modules="all-linear")

    result = manager.load_lora_adapter(h.sglang_ref("seven", folder))

    assert manager.memory_pool.target_modules == {"qkv_proj"}
    _refused_or_fails_the_first_batch(manager, result, config)


@pytest.mark.lora_guard(expect=["LG104"])  # sglang makes it a failed result
@pytest.mark.parametrize(("config", "outcome"), [
    ("listed", "refuses the load"), ("all-linear", "fails the first batch that uses it")])
def test_a_later_load_outside_the_inferred_pool_is_refused_saying_what_sglang_would_do(
        guard, env, tmp_path, config, outcome):
    manager = _inferred_qv_server(tmp_path)
    folder = h.peft_adapter(tmp_path / "seven", target_modules=SEVEN, seed=1)
    if config == "all-linear":
        h.edit_config(folder, target_modules="all-linear")

    result = manager.load_lora_adapter(h.sglang_ref("seven", folder))

    assert result.success is False
    assert result.error_message.startswith("LG104 unsupported-target: adapter 'seven': module ")
    assert "(o_proj) is not among" in result.error_message and outcome in result.error_message
    assert set(manager.loras) == {"qv"}  # the server goes on serving its start-up adapter
