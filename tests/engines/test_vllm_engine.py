"""lora_guard's vLLM integration on the real vLLM LoRA worker and model manager (0.29 to 0.34).

A server is a real ``LRUCacheWorkerLoRAManager`` with its model manager over vLLM's own tiny
Llama (`_harness.vllm_server`), as a GPU worker builds it; adapters are real PEFT adapters.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import re
import warnings

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed: the engine tier runs in its own environment "
                "(tests/engines/run builds it and runs the tier)", allow_module_level=True)

torch = pytest.importorskip("torch")

import _harness as h  # noqa: E402

import lora_guard as lg  # noqa: E402
from lora_guard._checking.engines import profile  # noqa: E402
from lora_guard.integrations import vllm as vllm_guard  # noqa: E402

pytestmark = pytest.mark.xdist_group("vllm")  # one process per engine (see _harness)


@pytest.fixture(scope="module")
def env():
    return h.vllm_env()


@pytest.fixture
def guard(env):
    vllm_guard.instrument()
    yield vllm_guard.INTEGRATION
    vllm_guard.uninstrument()


@pytest.fixture
def base(tmp_path):
    return h.vllm_base_dir(tmp_path)


def lora_weights(worker) -> dict[str, torch.Tensor]:
    """Every LoRA weight slot of the served model (what a refused load must not touch)."""
    out = {}
    for name, tensor in worker._adapter_manager.model.named_buffers():
        out[name] = tensor.detach().clone()
    for name, module in worker._adapter_manager.modules.items():
        for attr in ("lora_a_stacked", "lora_b_stacked"):
            stacked = getattr(module, attr, None)
            tensors = [stacked] if isinstance(stacked, torch.Tensor) else list(stacked or ())
            for i, tensor in enumerate(tensors):
                out[f"{name}.{attr}.{i}"] = tensor.detach().clone()
    return out


def test_every_hook_attaches_on_the_installed_release(env):
    for module in {p.module for p in vllm_guard.INTEGRATION.patches}:
        importlib.import_module(module)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = vllm_guard.INTEGRATION.instrument()
    try:
        assert profile("vllm", env.version).version == env.version  # a supported release
        assert report.missing == {} and report.pending == (), report
        assert report.supported is True
    finally:
        vllm_guard.uninstrument()


def test_the_supported_range_is_the_release_the_tier_tests(env):
    # vLLM 0.29 to 0.34 keep every hooked function (tests/engines/fingerprints/)
    assert vllm_guard.INTEGRATION.supports(env.version)
    assert not vllm_guard.INTEGRATION.supports("0.11.2")
    assert vllm_guard.INTEGRATION.supported_range == ">=0.29.0,<0.34.1"


def test_a_good_adapter_loads_activates_and_swaps_with_no_violation(guard, base, tmp_path):
    worker = h.vllm_server(base, max_loras=2, max_cpu_loras=3)
    paths = [h.peft_adapter(tmp_path / f"a{i}", r=4 * (i + 1), seed=i) for i in range(3)]

    with lg.recording() as seen:
        for i, path in enumerate(paths):
            assert worker.add_adapter(h.vllm_request(f"a{i}", i + 1, path))
        worker.set_active_adapters({h.vllm_request("a2", 3, paths[2]),
                                    h.vllm_request("a0", 1, paths[0])}, None)
        assert worker.remove_adapter(2)

    assert seen.violations == []
    table = worker._adapter_manager.lora_index_to_id
    assert sorted(x for x in table if x is not None) == sorted(
        worker._adapter_manager._active_adapters)


def test_a_rank_pattern_above_max_lora_rank_is_refused_and_the_server_is_untouched(
        guard, base, tmp_path):
    worker = h.vllm_server(base)
    good = h.peft_adapter(tmp_path / "good", r=8)
    assert worker.add_adapter(h.vllm_request("good", 1, good))
    before, adapters = lora_weights(worker), set(worker.list_adapters())
    slots = list(worker._adapter_manager.lora_index_to_id)
    for name, kwargs in (("sneaky", dict(r=8, rank_pattern={"q_proj": 32})),
                         ("dora", dict(r=8, use_dora=True))):
        bad = h.peft_adapter(tmp_path / name, **kwargs)

        with pytest.raises(ValueError):  # vLLM's own refusal, or lora_guard's first
            worker.add_adapter(h.vllm_request(name, 2, bad))

    after = lora_weights(worker)
    assert set(worker.list_adapters()) == adapters
    assert list(worker._adapter_manager.lora_index_to_id) == slots
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_from_local_checkpoint_called_directly_knows_the_max_rank(guard, env, tmp_path):
    # an offline tool that reads the adapter with vLLM's own loader, outside a worker
    path = h.peft_adapter(tmp_path / "wide", r=8, rank_pattern={"v_proj": 32})
    helper = env.peft_helper.PEFTHelper.from_local_dir(str(path), None)

    with pytest.raises(lg.AdapterError, match=r"LG101.*rank 32.*max rank 16"):  # the default
        env.lora_model.LoRAModel.from_local_checkpoint(
            str(path), {"q_proj", "k_proj", "v_proj", "o_proj"}, helper, device="cpu",
            dtype=torch.float32)


def test_from_local_checkpoint_takes_the_max_rank_the_helper_was_validated_for(
        guard, env, tmp_path):
    path = h.peft_adapter(tmp_path / "wide", r=8, rank_pattern={"v_proj": 32})
    helper = env.peft_helper.PEFTHelper.from_local_dir(str(path), None)
    helper.validate_legal(env.LoRAConfig(max_lora_rank=64, lora_dtype=torch.float32))
    small = env.peft_helper.PEFTHelper.from_local_dir(str(path), None)
    load = functools.partial(
        env.lora_model.LoRAModel.from_local_checkpoint, str(path),
        {"q_proj", "k_proj", "v_proj", "o_proj"}, helper, device="cpu", dtype=torch.float32)
    if profile("vllm", env.version).version >= "0.32.0":  # rank_pattern read from 0.32
        with pytest.raises(ValueError, match="greater than max_lora_rank"):
            small.validate_legal(env.LoRAConfig(max_lora_rank=16, lora_dtype=torch.float32))
        with lg.recording() as seen:
            load()
        assert seen.violations == []
    else:  # before 0.32 validate_legal reads r only: rank 32 passes a max rank of 16
        small.validate_legal(env.LoRAConfig(max_lora_rank=16, lora_dtype=torch.float32))
        # and one scaling, lora_alpha / r, for every module: v_proj at rank 32 is mis-scaled
        with pytest.raises(lg.AdapterError, match="LG112"):
            load()


def test_a_sequence_classification_adapter_with_score_saved_loads_clean(guard, env, tmp_path):
    lora_config = env.LoRAConfig(max_lora_rank=16, lora_dtype=torch.float32)
    path = h.peft_adapter(tmp_path / "cls", r=8, task_type="SEQ_CLS")
    helper = env.peft_helper.PEFTHelper.from_local_dir(str(path), None)
    if profile("vllm", env.version).version < "0.31.0":  # no head served before 0.31
        with pytest.raises(ValueError, match="modules_to_save being None"):
            helper.validate_legal(lora_config)
        return
    helper.validate_legal(lora_config)  # vLLM 0.31+ serves score in modules_to_save

    with lg.recording() as seen:
        for expected in ({"q_proj", "k_proj", "v_proj", "o_proj", "score"},
                         {"q_proj", "k_proj", "v_proj", "o_proj"}):
            model = env.lora_model.LoRAModel.from_local_checkpoint(
                str(path), expected, helper, device="cpu", dtype=torch.float32)
            assert "score" in model.modules_to_save

    assert seen.violations == []


def test_a_sequence_classification_adapter_saving_lm_head_is_still_refused(
        guard, env, tmp_path):
    path = h.peft_adapter(tmp_path / "lm", r=8, modules_to_save=["lm_head"])
    helper = env.peft_helper.PEFTHelper.from_local_dir(str(path), None)

    with pytest.raises(lg.AdapterError, match="LG105"):
        env.lora_model.LoRAModel.from_local_checkpoint(
            str(path), {"q_proj", "k_proj", "v_proj", "o_proj"}, helper, device="cpu",
            dtype=torch.float32)


def test_a_worker_load_is_checked_on_what_vllm_read_not_read_again(
        guard, base, tmp_path, monkeypatch):
    # the checks run on vLLM's own PEFTHelper config and tensors: lora_guard opens no file
    # of the folder (added_tokens.json, which vLLM does not read, is looked for only)
    worker = h.vllm_server(base, max_loras=2, max_cpu_loras=3)

    def read_again(*args, **kwargs):
        raise AssertionError("lora_guard read the adapter folder a second time")

    monkeypatch.setattr(vllm_guard, "local_adapter", read_again)
    good = h.peft_adapter(tmp_path / "good", r=8)
    lies = h.edit_weights(h.peft_adapter(tmp_path / "lies", r=8),  # config r=8, rank 4
                          lambda t: t.update({k: v[:4].clone() if "lora_A" in k
                                              else v[:, :4].clone() for k, v in t.items()}))

    with lg.recording() as seen:
        assert worker.add_adapter(h.vllm_request("good", 1, good))
    with pytest.raises(lg.AdapterError, match="LG102"):  # vLLM itself would pad and serve it
        worker.add_adapter(h.vllm_request("lies", 2, lies))

    assert seen.violations == []
    assert set(worker.list_adapters()) == {1}


def test_integer_weights_vllm_would_cast_and_serve_are_refused_at_load(guard, base, tmp_path):
    # a conversion script "compressed" the adapter to int8 without scales: vLLM casts it to
    # its LoRA dtype and serves garbage; bf16 and fp32 weights of one adapter still load
    worker = h.vllm_server(base, max_loras=2, max_cpu_loras=3)
    packed = h.edit_weights(h.peft_adapter(tmp_path / "int8", r=8),
                            lambda t: t.update({k: (v * 100).to(torch.int8)
                                                for k, v in t.items()}))
    mixed = h.edit_weights(h.peft_adapter(tmp_path / "mixed", r=8),
                           lambda t: t.update({k: v.to(torch.bfloat16)
                                               for k, v in t.items() if "lora_A" in k}))

    with pytest.raises(lg.AdapterError, match="LG106") as refused:
        worker.add_adapter(h.vllm_request("int8", 1, packed))
    assert "int8" in str(refused.value)
    with lg.recording() as seen:
        assert worker.add_adapter(h.vllm_request("mixed", 2, mixed))
    assert seen.violations == []
    assert set(worker.list_adapters()) == {2}


def test_an_adapter_vllm_refuses_first_still_gets_every_defect_with_its_fix(
        guard, base, tmp_path):
    # vLLM's PEFTHelper refuses the rank before any tensor is read: lora_guard reads the
    # folder then, and its error (every code, each fix) is raised from vLLM's
    worker = h.vllm_server(base)
    bad = h.peft_adapter(tmp_path / "wide", r=32, use_dora=True)

    with pytest.raises(lg.AdapterError, match="LG101") as refused:
        worker.add_adapter(h.vllm_request("wide", 1, bad))

    assert "LG105" in str(refused.value)
    assert isinstance(refused.value.__context__, ValueError)  # vLLM's own refusal
    assert worker.list_adapters() == set()


def test_a_clean_verdict_is_not_reused_for_a_folder_shipping_added_tokens(
        guard, base, tmp_path):
    # two adapters of one recipe (same config, same tensors): the second ships an
    # added_tokens.json with tokens past the base's vocabulary
    worker = h.vllm_server(base, max_loras=2, max_cpu_loras=3)
    first = h.peft_adapter(tmp_path / "first", r=8, seed=1)
    second = h.peft_adapter(tmp_path / "second", r=8, seed=1)
    (second / "added_tokens.json").write_text('{"<sql>": 128, "</sql>": 129}')

    with lg.recording() as seen:
        assert worker.add_adapter(h.vllm_request("first", 1, first))
    with pytest.raises(lg.AdapterError, match="LG105"):
        worker.add_adapter(h.vllm_request("second", 2, second))

    assert seen.violations == []


def test_weights_symlinked_out_of_the_folder_are_refused_even_after_a_clean_twin(
        guard, base, tmp_path):
    # an uploaded folder whose weights are a link to another adapter's file on the server:
    # vLLM follows it; lora_guard refuses it as its reader does (LG108), also when the same
    # config and tensors were found clean a moment before
    worker = h.vllm_server(base, max_loras=2, max_cpu_loras=3)
    first = h.peft_adapter(tmp_path / "first", r=8, seed=1)
    uploaded = h.peft_adapter(tmp_path / "uploaded", r=8, seed=1)
    (uploaded / "adapter_model.safetensors").unlink()
    (uploaded / "adapter_model.safetensors").symlink_to(first / "adapter_model.safetensors")

    assert worker.add_adapter(h.vllm_request("first", 1, first))
    with pytest.raises(lg.AdapterError, match="LG108") as refused:
        worker.add_adapter(h.vllm_request("uploaded", 2, uploaded))

    assert "leads outside the adapter folder" in str(refused.value)
    assert set(worker.list_adapters()) == {1}


def _deployed(folder):
    """An adapter folder as a server finds one deployed earlier: unchanged for longer than a
    file system's coarsest clock (lora_guard keeps no stamp of a folder changed just now)."""
    import time

    from lora_guard.integrations._base import _SETTLED_NS

    wait = _SETTLED_NS - (time.time_ns() - os.stat(folder).st_ctime_ns)
    if wait > 0:
        time.sleep(wait / 1e9 + 0.05)
    return folder


def _counted(real, name, calls):
    """``os.<name>`` that also writes down each call's path."""
    def call(path, *args, **kwargs):
        calls.append((name, os.fspath(path)))
        return real(path, *args, **kwargs)
    return call


def _reloaded(worker, request, times=3):
    """The adapter loaded, evicted and loaded again (a busy server's LRU)."""
    for _ in range(times):
        assert worker.add_adapter(request)
        assert worker.remove_adapter(request.lora_int_id)


def test_an_added_tokens_json_put_in_a_folder_between_two_loads_is_refused_at_the_next(
        guard, base, tmp_path):
    # the adapter is loaded clean many times (its folder then costs one stat a load); someone
    # then drops an added_tokens.json with tokens past the base's vocabulary next to it
    worker = h.vllm_server(base, max_loras=2, max_cpu_loras=3)
    folder = _deployed(h.peft_adapter(tmp_path / "sql", r=8))
    request = h.vllm_request("sql", 1, folder)
    with lg.recording() as seen:
        _reloaded(worker, request)

    (folder / "added_tokens.json").write_text('{"<sql>": 128, "</sql>": 129}')

    with pytest.raises(lg.AdapterError, match="LG105"):
        worker.add_adapter(request)
    assert seen.violations == [] and worker.list_adapters() == set()


def test_weights_relinked_out_of_the_folder_between_two_loads_are_refused_at_the_next(
        guard, base, tmp_path):
    worker = h.vllm_server(base, max_loras=2, max_cpu_loras=3)
    other = h.peft_adapter(tmp_path / "other", r=8, seed=1)
    folder = _deployed(h.peft_adapter(tmp_path / "uploaded", r=8, seed=1))
    request = h.vllm_request("uploaded", 1, folder)
    _reloaded(worker, request)

    (folder / "adapter_model.safetensors").unlink()
    (folder / "adapter_model.safetensors").symlink_to(other / "adapter_model.safetensors")

    with pytest.raises(lg.AdapterError, match="LG108") as refused:
        worker.add_adapter(request)
    assert "leads outside the adapter folder" in str(refused.value)
    assert worker.list_adapters() == set()


def test_a_load_found_clean_before_costs_one_stat_beyond_what_vllm_does(
        guard, base, tmp_path, monkeypatch):
    # the file rules and the added_tokens.json look of an adapter loaded again: one stat of
    # its folder, the only file-system call lora_guard adds to vLLM's own for that load
    worker = h.vllm_server(base, max_loras=2, max_cpu_loras=3)
    folder = _deployed(h.peft_adapter(tmp_path / "a", r=8))
    request = h.vllm_request("a", 1, folder)
    _reloaded(worker, request)
    calls: list[tuple[str, str]] = []
    for name in ("stat", "lstat", "access", "open", "listdir", "scandir"):
        monkeypatch.setattr(os, name, _counted(getattr(os, name), name, calls))

    def one_load():
        calls.clear()
        _reloaded(worker, request, times=1)
        return [c for c in calls if c[1].startswith(str(folder))]

    guarded = one_load()
    vllm_guard.uninstrument()
    plain = one_load()
    vllm_guard.instrument()

    extra = list(guarded)
    for call in plain:
        extra.remove(call)
    assert extra == [("stat", str(folder))]


def test_a_helper_made_before_instrument_is_checked_from_the_folder(env, tmp_path):
    path = h.peft_adapter(tmp_path / "wide", r=8, rank_pattern={"v_proj": 32})
    helper = env.peft_helper.PEFTHelper.from_local_dir(str(path), None)  # lora_guard off
    vllm_guard.instrument()
    try:
        with pytest.raises(lg.AdapterError, match=r"LG101.*rank 32"):
            env.lora_model.LoRAModel.from_local_checkpoint(
                str(path), {"q_proj", "k_proj", "v_proj", "o_proj"}, helper, device="cpu",
                dtype=torch.float32)
    finally:
        vllm_guard.uninstrument()


def test_a_slot_table_out_of_step_with_the_active_adapters_is_reported(guard, base, tmp_path):
    worker = h.vllm_server(base, max_loras=2)
    assert worker.add_adapter(h.vllm_request("a", 1, h.peft_adapter(tmp_path / "a", r=8)))
    manager = worker._adapter_manager
    manager.lora_index_to_id[manager.lora_index_to_id.index(1)] = None  # a slot lost its id

    with pytest.raises(lg.RegistryError, match="LG201"):
        manager.activate_adapter(1)


def test_steps_of_resident_adapters_go_straight_to_vllm(guard, base, tmp_path, monkeypatch):
    # every step activates each adapter of the batch again: with the slot table unwritten
    # since the guard verified it, vLLM's own early return runs and nothing is checked
    worker = h.vllm_server(base, max_loras=2)
    batch = {h.vllm_request(n, i, h.peft_adapter(tmp_path / n, r=8, seed=i))
             for i, n in ((1, "a"), (2, "b"))}
    worker.set_active_adapters(batch, None)  # the first step: loaded, activated, verified
    checks = []
    verify = vllm_guard.slot_violations

    def counted(manager):
        checks.append(manager)
        return verify(manager)

    monkeypatch.setattr(vllm_guard, "slot_violations", counted)
    for _ in range(5):
        worker.set_active_adapters(batch, None)
    assert checks == []

    worker.set_active_adapters({next(iter(batch))}, None)  # a batch of one: nothing moves
    assert checks == []


def test_a_slot_table_broken_after_many_clean_steps_is_reported_at_the_next_step(
        guard, base, tmp_path):
    # steps are not re-checked, but the table hears every write to it: a slot that loses
    # its adapter behind vLLM's back is caught at the very next activation
    worker = h.vllm_server(base, max_loras=2)
    batch = {h.vllm_request("a", 1, h.peft_adapter(tmp_path / "a", r=8))}
    for _ in range(3):
        worker.set_active_adapters(batch, None)
    table = worker._adapter_manager.lora_index_to_id
    table[table.index(1)] = None

    with pytest.raises(lg.RegistryError, match="LG201"):
        worker.set_active_adapters(batch, None)


def test_a_slot_table_vllm_replaces_is_verified_again(guard, base, tmp_path):
    # remove_all_adapters gives the manager a fresh list: the guard checks the next
    # activations as new (a table replaced behind vLLM's back is not taken on trust)
    worker = h.vllm_server(base, max_loras=2)
    batch = {h.vllm_request("a", 1, h.peft_adapter(tmp_path / "a", r=8))}
    worker.set_active_adapters(batch, None)
    manager = worker._adapter_manager
    manager.lora_index_to_id = [1, 1]  # a table put in place wholesale, wrong

    with pytest.raises(lg.RegistryError, match="LG201"):
        manager.activate_adapter(1)

    manager.remove_all_adapters()
    with lg.recording() as seen:
        worker.set_active_adapters(batch, None)
        worker.set_active_adapters(batch, None)
    assert seen.violations == []
    assert [x for x in manager.lora_index_to_id if x is not None] == [1]


def test_uninstrument_gives_vllm_its_own_slot_table_back(env, base, tmp_path):
    worker = h.vllm_server(base, max_loras=2)
    vllm_guard.instrument()
    try:
        worker.set_active_adapters({h.vllm_request("a", 1, h.peft_adapter(tmp_path / "a"))},
                                   None)
        slots = list(worker._adapter_manager.lora_index_to_id)
    finally:
        vllm_guard.uninstrument()
    table = worker._adapter_manager.lora_index_to_id
    assert type(table) is list and table == slots


def test_uninstrument_restores_every_real_original_exactly(env):
    def owner(patch):
        found = importlib.import_module(patch.module)
        for part in patch.path.split(".")[:-1]:
            found = getattr(found, part)
        return found

    leaf = {p.path: p.path.rsplit(".", 1)[-1] for p in vllm_guard.INTEGRATION.patches}
    originals = {p.path: vars(owner(p))[leaf[p.path]] for p in vllm_guard.INTEGRATION.patches}
    vllm_guard.instrument()
    assert all(vars(owner(p))[leaf[p.path]] is not originals[p.path]
               for p in vllm_guard.INTEGRATION.patches)
    vllm_guard.uninstrument()
    assert all(vars(owner(p))[leaf[p.path]] is originals[p.path]
               for p in vllm_guard.INTEGRATION.patches)


def test_a_hook_whose_target_this_release_lacks_warns_naming_it_and_the_version(
        env, monkeypatch):
    # as if a release had dropped PEFTHelper.validate_legal: that hook cannot attach
    monkeypatch.delattr(env.peft_helper.PEFTHelper, "validate_legal")
    try:
        with pytest.warns(lg.integrations.IntegrationWarning,
                          match=rf"vllm {re.escape(env.version)} has no vllm\.lora\.peft_helper\."
                                r"PEFTHelper\.validate_legal"):
            report = vllm_guard.instrument()
        assert "vllm.lora.peft_helper:PEFTHelper.validate_legal" in report.missing
        assert "vllm.lora.lora_model:LoRAModel.from_local_checkpoint" in report.attached
    finally:
        vllm_guard.uninstrument()


def test_a_refused_swap_leaves_the_served_adapters_and_every_slot_bitwise_unchanged(
        guard, base, tmp_path):
    # the scheduler swaps in the adapters of the next batch: one of them is broken
    worker = h.vllm_server(base, max_loras=2, max_cpu_loras=2)
    good = h.peft_adapter(tmp_path / "good", r=8)
    worker.set_active_adapters({h.vllm_request("good", 1, good)}, None)
    before, adapters = lora_weights(worker), set(worker.list_adapters())
    slots = list(worker._adapter_manager.lora_index_to_id)
    wide = h.peft_adapter(tmp_path / "wide", r=8, rank_pattern={"q_proj": 32})

    with pytest.raises(lg.AdapterError, match="LG101"):
        worker.set_active_adapters({h.vllm_request("good", 1, good),
                                    h.vllm_request("wide", 2, wide)}, None)

    assert set(worker.list_adapters()) == adapters == {1}
    assert list(worker._adapter_manager.lora_index_to_id) == slots
    after = lora_weights(worker)
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_an_fp16_adapter_on_a_bf16_model_is_cast_and_served_with_no_violation(
        guard, base, tmp_path):
    worker = h.vllm_server(base, dtype="bfloat16")
    half = h.peft_adapter(tmp_path / "half", r=8)
    h.edit_weights(half, lambda t: t.update({k: v.half() for k, v in t.items()}))

    with lg.recording() as seen:
        assert worker.add_adapter(h.vllm_request("half", 1, half))
        worker.set_active_adapters({h.vllm_request("half", 1, half)}, None)

    assert seen.violations == []  # vLLM casts to its LoRA dtype: LG106 is not an error here
    served = worker._adapter_manager._registered_adapters[1]
    loaded = [a for w in served.loras.values()
              for a in (w.lora_a if isinstance(w.lora_a, list) else [w.lora_a]) if a is not None]
    assert loaded and {a.dtype for a in loaded} == {torch.bfloat16}  # cast by vLLM


def test_the_profile_flags_are_the_releases_own_names_defaults_and_choices(env):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser


    parser = FlexibleArgumentParser()
    EngineArgs.add_cli_args(parser)
    actions = {name: a for a in parser._actions for name in a.option_strings}
    release = profile("vllm", env.version)
    for flag in release.flags:
        if flag.name == "--lora-modules":  # `vllm serve`'s own (frontend) flag
            continue
        action = actions[flag.name]
        assert action.default == flag.default, flag.name
        if flag.choices:
            assert sorted(map(str, action.choices)) == sorted(map(str, flag.choices)), flag.name
    lora = {n for n in actions if "lora" in n and not n.startswith(("--no-", "--disable-"))}
    known = {f.name for f in release.flags} | {"--default-mm-loras"}  # named on its page
    assert lora <= known, f"LoRA flags of vLLM {env.version} the profile lacks: {lora - known}"
