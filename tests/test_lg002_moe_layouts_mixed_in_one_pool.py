"""Seed 001: MoE adapters of shared-outer and per-expert layout must not share one pool.

LG002 (mixed-moe-layout): the load guard (`LayoutRegistry`, `@guard_adapter_load`) refuses the
second layout before the loader runs; `check_adapters` says it of a set of adapter folders.
"""

from __future__ import annotations

import pathlib
import threading
from collections import Counter

import pytest
import torch

import lora_guard as lg
from lora_guard._testing.adapter_writer import write_adapter

E, R, H, INTER = 4, 8, 64, 128  # experts, rank, hidden, moe intermediate
PREFIX = "base_model.model.model.layers.{layer}.mlp.experts"


def meta(*shape: int) -> torch.Tensor:
    return torch.empty(shape, device="meta", dtype=torch.bfloat16)


def packed(*, shared_outer: bool, layers: int = 2) -> dict[str, torch.Tensor]:
    """sglang's packed 3D MoE LoRA: gate_up A (E|1, 2R, H), B (E, 2I, R); down A (E, R, INTER),
    B (E|1, H, R)."""
    outer = 1 if shared_outer else E
    weights = {}
    for layer in range(layers):
        p = PREFIX.format(layer=layer)
        weights[f"{p}.gate_up_proj.lora_A"] = meta(outer, 2 * R, H)
        weights[f"{p}.gate_up_proj.lora_B"] = meta(E, 2 * INTER, R)
        weights[f"{p}.down_proj.lora_A"] = meta(E, R, INTER)
        weights[f"{p}.down_proj.lora_B"] = meta(outer, H, R)
    return weights


def per_expert_2d(layers: int = 2) -> dict[str, torch.Tensor]:
    weights = {}
    for layer in range(layers):
        for e in range(E):
            p = f"{PREFIX.format(layer=layer)}.{e}"
            for proj, (out, inp) in {"gate_proj": (INTER, H), "up_proj": (INTER, H),
                                     "down_proj": (H, INTER)}.items():
                weights[f"{p}.{proj}.lora_A.weight"] = meta(R, inp)
                weights[f"{p}.{proj}.lora_B.weight"] = meta(out, R)
    return weights


def flat_target_parameters() -> dict[str, torch.Tensor]:
    p = PREFIX.format(layer=0)
    return {
        f"{p}.base_layer.lora_A.weight": meta(R * E, H),
        f"{p}.base_layer.lora_B.weight": meta(2 * INTER, R * E),
        f"{p}.lora_A.weight": meta(R * E, INTER),
        f"{p}.lora_B.weight": meta(H, R * E),
    }


def dense() -> dict[str, torch.Tensor]:
    p = "base_model.model.model.layers.0.self_attn"
    return {f"{p}.q_proj.lora_A.weight": meta(R, H), f"{p}.q_proj.lora_B.weight": meta(H, R)}


@pytest.mark.parametrize(
    ("weights", "layout"),
    [
        (packed(shared_outer=True), lg.MoELayout.SHARED_OUTER),
        (packed(shared_outer=False), lg.MoELayout.PER_EXPERT),
        (per_expert_2d(), lg.MoELayout.PER_EXPERT),
        (flat_target_parameters(), lg.MoELayout.FLAT),
        (dense(), None),
    ],
    ids=["shared-outer", "packed-per-expert", "per-expert-2d", "flat", "dense"],
)
def test_detect_moe_layout(weights: dict[str, torch.Tensor], layout: lg.MoELayout | None) -> None:
    assert lg.detect_moe_layout(weights) is layout
    # Shapes alone (header metadata) are enough.
    assert lg.detect_moe_layout({k: tuple(v.shape) for k, v in weights.items()}) is layout


def test_an_adapter_that_mixes_layouts_itself_is_reported() -> None:
    weights = {**packed(shared_outer=True, layers=1), **per_expert_2d(layers=1)}
    with pytest.raises(lg.MixedMoELayoutError, match="its own MoE weights mix layouts"):
        lg.detect_moe_layout(weights)


def test_shared_outer_then_per_expert_is_refused_naming_both_adapters() -> None:
    pool = lg.LayoutRegistry()
    assert pool.admit("math-shared", packed(shared_outer=True)) is lg.MoELayout.SHARED_OUTER

    with pytest.raises(lg.MixedMoELayoutError) as info:
        pool.admit("code-per-expert", per_expert_2d())

    err = info.value
    assert isinstance(err, RuntimeError) and err.code == "LG002"
    message = str(err)
    assert "'code-per-expert'" in message and "per-expert" in message
    assert "shared-outer" in message and "'math-shared'" in message
    assert "one MoE layout per server" in err.hint
    # Refused: the pool is exactly as it was.
    assert pool.adapters == {"math-shared": lg.MoELayout.SHARED_OUTER}
    assert pool.layout is lg.MoELayout.SHARED_OUTER


def test_releasing_the_first_lets_the_second_in() -> None:
    pool = lg.LayoutRegistry()
    pool.admit("math-shared", packed(shared_outer=True))
    pool.release("math-shared")
    assert pool.layout is None
    assert pool.admit("code-per-expert", per_expert_2d()) is lg.MoELayout.PER_EXPERT
    assert pool.layout is lg.MoELayout.PER_EXPERT


def test_dense_adapters_do_not_hold_a_layout() -> None:
    pool = lg.LayoutRegistry()
    pool.admit("chat", dense())
    pool.admit("math-shared", packed(shared_outer=True))
    pool.admit("sql", dense())
    pool.release("math-shared")
    assert pool.layout is None  # dense adapters notwithstanding
    pool.admit("code-per-expert", per_expert_2d())
    assert set(pool.adapters) == {"chat", "sql", "code-per-expert"}


def test_the_owner_named_is_an_adapter_still_loaded() -> None:
    pool = lg.LayoutRegistry()
    pool.admit("a", packed(shared_outer=True))
    pool.admit("b", packed(shared_outer=True))
    pool.release("a")
    with pytest.raises(lg.MixedMoELayoutError, match="set by adapter 'b'"):
        pool.admit("c", per_expert_2d())


def test_reloading_an_adapter_under_its_own_id_replaces_it() -> None:
    pool = lg.LayoutRegistry()
    pool.admit("a", packed(shared_outer=True))
    pool.admit("a", per_expert_2d())  # the only MoE adapter: a reload may change layout
    assert pool.layout is lg.MoELayout.PER_EXPERT and len(pool) == 1


def test_guard_adapter_load_refuses_before_the_loader_runs() -> None:
    pool = lg.LayoutRegistry()
    loaded: list[str] = []

    @lg.guard_adapter_load(pool, adapter_id="lora_name", weights="tensors")
    def load_lora_adapter(lora_name: str, tensors: dict[str, torch.Tensor]) -> bool:
        loaded.append(lora_name)
        return True

    assert load_lora_adapter("math", packed(shared_outer=True))
    with pytest.raises(lg.MixedMoELayoutError):
        load_lora_adapter("code", tensors=per_expert_2d())
    assert loaded == ["math"]
    assert "code" not in pool


def test_a_loader_that_fails_releases_its_admission() -> None:
    pool = lg.LayoutRegistry()

    class Manager:
        def __init__(self) -> None:
            self.weights = {"math": packed(shared_outer=True), "code": per_expert_2d()}

        @lg.guard_adapter_load(
            pool,
            adapter_id=lambda args: args["ref"]["name"],
            weights=lambda args: args["self"].weights[args["ref"]["name"]],
        )
        def load(self, ref: dict[str, str]) -> None:
            raise OSError("disk vanished")

    manager = Manager()
    with pytest.raises(OSError, match="disk vanished"):
        manager.load({"name": "math"})
    assert pool.layout is None and len(pool) == 0
    with pytest.raises(OSError, match="disk vanished"):
        manager.load({"name": "code"})  # not refused: the failed 'math' left nothing behind


def test_guard_adapter_load_validates_its_arguments_eagerly() -> None:
    with pytest.raises(TypeError, match="needs an lg.LayoutRegistry"):
        lg.guard_adapter_load({}, adapter_id="a", weights="w")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"adapter_id='name'.*no such parameter"):
        @lg.guard_adapter_load(lg.LayoutRegistry(), adapter_id="name", weights="w")
        def load(lora_name: str, w: dict[str, torch.Tensor]) -> None:
            pass


def test_layouts_uniform_predicate() -> None:
    assert lg.layouts_uniform([packed(shared_outer=True), dense(), packed(shared_outer=True)])
    assert not lg.layouts_uniform({"a": packed(shared_outer=True), "b": per_expert_2d()})


@pytest.mark.lora_guard(expect=["LG002"], reason="half the threads bring the other MoE layout; "
                         "each worker catches its refusal")
def test_eight_threads_admitting_and_releasing_a_thousand_adapters() -> None:
    """Every admission is either kept with the pool's layout or refused with LG002; the pool
    never holds two MoE layouts, and the final bookkeeping adds up exactly."""
    pool = lg.LayoutRegistry()
    shapes = {
        lg.MoELayout.SHARED_OUTER: {k: tuple(v.shape) for k, v in
                                    packed(shared_outer=True, layers=1).items()},
        lg.MoELayout.PER_EXPERT: {k: tuple(v.shape) for k, v in
                                  packed(shared_outer=False, layers=1).items()},
    }
    admitted: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    lock = threading.Lock()
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)
    still_loaded: set[str] = set()

    def worker(t: int) -> None:
        try:
            barrier.wait()
            for i in range(125):
                adapter = f"t{t}-a{i}"
                layout = lg.MoELayout.SHARED_OUTER if t % 2 else lg.MoELayout.PER_EXPERT
                try:
                    got = pool.admit(adapter, shapes[layout])
                except lg.MixedMoELayoutError as err:
                    assert err.details["layout"] == layout.value
                    assert err.details["pool_layout"] != layout.value
                    with lock:
                        refused[layout.value] += 1
                    continue
                assert got is layout
                # While admitted, the pool's layout is this adapter's layout.
                assert pool.layout is layout
                with lock:
                    admitted[layout.value] += 1
                if i % 3:
                    pool.release(adapter)
                else:
                    with lock:
                        still_loaded.add(adapter)
        except BaseException as exc:  # surface worker failures in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not errors, errors[0]
    assert sum(admitted.values()) + sum(refused.values()) == 1000
    kept = pool.adapters
    assert len(set(kept.values())) == 1  # one MoE layout, never two
    assert set(kept) == still_loaded  # no lost admission, no stale entry


def test_mixed_moe_layouts_across_the_set_are_lg002(tmp_path: pathlib.Path) -> None:
    mlp = ("gate_proj", "up_proj", "down_proj")
    write_adapter(tmp_path / "a-shared", moe_layout="shared-outer", targets=mlp)
    write_adapter(tmp_path / "b-flat", moe_layout="flat", targets=mlp)
    write_adapter(tmp_path / "c-dense")
    report = lg.check_adapters(tmp_path)
    assert report.codes() == ["LG002"]
    message = report.violations[0].message
    assert "b-flat" in message and "flat differs from shared-outer" in message
    assert "a-shared" in message
