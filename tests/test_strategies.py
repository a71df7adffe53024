"""`lora_guard.strategies`: property-testing a user's own pool in a few lines."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, assume, find, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

import lora_guard as lg
from lora_guard import strategies as lgst
from lora_guard.testing import DEFECTS

FAST = settings(max_examples=25, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


# -- a user's pool: slots x max_rank buffers and the slot maps, guarded by lora_guard ------


class TinyPool:
    """A toy LoRA pool. ``pad`` False is the bug: it writes an adapter at its own rank."""

    def __init__(self, slots: int = 2, max_rank: int = 16, hidden: int = 64, *,
                 pad: bool = True) -> None:
        self.pad = pad
        self.allocate(slots, max_rank, hidden)

    def allocate(self, slots: int, max_rank: int, hidden: int) -> None:
        lg.unfreeze(self)  # a deliberate rebuild
        self.max_rank, self.hidden = max_rank, hidden
        self.uid_to_slot: dict[str, int] = {}
        self.slot_to_uid: list[str | None] = [None] * slots
        self.write(torch.empty(slots, max_rank, hidden, device="meta"))

    @lg.shapes(buffer="slots rank hidden", frozen=("slots", "rank", "hidden"))
    def write(self, buffer: torch.Tensor) -> None:
        self.buffer = buffer

    def _store(self, rank: int) -> None:
        width = self.max_rank if self.pad else rank
        self.write(torch.empty(len(self.slot_to_uid), width, self.hidden, device="meta"))

    def load(self, name: str, rank: int) -> None:
        if name in self.uid_to_slot or None not in self.slot_to_uid or rank > self.max_rank:
            raise ValueError(f"cannot load {name!r} (rank {rank})")
        slot = self.slot_to_uid.index(None)
        self._store(rank)
        self.uid_to_slot[name], self.slot_to_uid[slot] = slot, name
        lg.assert_slot_maps_consistent(self.uid_to_slot, self.slot_to_uid)

    def unload(self, name: str) -> None:
        slot = self.uid_to_slot.pop(name)
        self.slot_to_uid[slot] = None
        lg.assert_slot_maps_consistent(self.uid_to_slot, self.slot_to_uid)

    def swap(self, name: str, rank: int) -> None:
        if name not in self.uid_to_slot or rank > self.max_rank:
            raise ValueError(f"cannot swap {name!r} (rank {rank})")
        self._store(rank)


def apply(pool: TinyPool, op: lgst.Operation) -> None:
    assert op.plan is not None or op.kind in ("unload", "resize")
    if op.kind == "load":
        pool.load(op.name, op.plan.rank)  # type: ignore[union-attr]
    elif op.kind == "swap":
        pool.swap(op.name, op.plan.rank)  # type: ignore[union-attr]
    elif op.kind == "unload":
        pool.unload(op.name)
    else:
        pool.allocate(op.slots or 1, op.max_rank or 16, pool.hidden)


RANKS_UP_TO_16 = lgst.adapter_plans(ranks=(4, 8, 16))


@FAST
@given(lgst.operations(RANKS_UP_TO_16, kinds=("load", "unload", "swap"), max_loaded=2))
def test_the_padded_pool_survives_any_valid_sequence(ops: list[lgst.Operation]) -> None:
    pool = TinyPool(slots=2, max_rank=16)
    for op in ops:
        apply(pool, op)
    assert lg.slot_maps_consistent(pool.uid_to_slot, pool.slot_to_uid)


@pytest.mark.lora_guard(expect=("LG001",))
def test_the_unpadded_pool_is_caught_with_a_minimal_sequence() -> None:
    def breaks(ops: list[lgst.Operation]) -> bool:
        try:
            pool = TinyPool(slots=2, max_rank=16, pad=False)
            for op in ops:
                apply(pool, op)
        except lg.PoolShapeDriftError:
            return True
        return False

    ops = find(lgst.operations(RANKS_UP_TO_16, kinds=("load", "unload", "swap"), max_loaded=2,
                               max_size=4),
               breaks, settings=settings(database=None, max_examples=100))
    assert [str(op) for op in ops] == ["load a(rank 4, q_proj)"]


class PoolMachine(RuleBasedStateMachine):
    """The same pool as a state machine: Hypothesis picks the next step from the state."""

    loaded = Bundle("loaded")

    def __init__(self) -> None:
        super().__init__()
        self.pool = TinyPool(slots=4, max_rank=16)
        self.free = 4

    @rule(target=loaded, plan=RANKS_UP_TO_16, name=st.uuids().map(str))
    def load(self, plan: lgst.AdapterPlan, name: str) -> str:
        if self.free:
            self.pool.load(name, plan.rank)
            self.free -= 1
        return name

    @rule(name=loaded, plan=RANKS_UP_TO_16)
    def swap(self, name: str, plan: lgst.AdapterPlan) -> None:
        if name in self.pool.uid_to_slot:
            self.pool.swap(name, plan.rank)

    @rule(name=loaded)
    def unload(self, name: str) -> None:
        if name in self.pool.uid_to_slot:
            self.pool.unload(name)
            self.free += 1

    @invariant()
    def frozen_shape_holds(self) -> None:
        assert lg.frozen_dims(self.pool) == {"slots": 4, "rank": 16, "hidden": 64}


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=15, stateful_step_count=10, deadline=None,
                                    database=None)


# -- the strategies themselves --------------------------------------------------------------


@FAST
@given(lgst.adapter_plans(ranks=(8, 32), targets=("q_proj", "gate_proj"),
                          moe_layouts=(*lgst.MOE_LAYOUTS, None), dtypes=("bfloat16",)))
def test_plans_respect_every_option(plan: lgst.AdapterPlan) -> None:
    assert plan.rank in (8, 32) and plan.dtype == "bfloat16"
    assert plan.targets and set(plan.targets) <= {"q_proj", "gate_proj"}
    if plan.moe_layout is not None:
        assert "gate_proj" in plan.targets
    assert plan.defects == () and plan.expected_codes == frozenset()


def test_plans_with_defects_are_what_the_checker_reports(tmp_path_factory: pytest.TempPathFactory
                                                          ) -> None:
    root = tmp_path_factory.mktemp("plans")
    content = sorted(d for d in DEFECTS if d not in ("symlink-escape", "layer-out-of-range"))
    seen: set[str] = set()

    @settings(max_examples=30, deadline=None, database=None)
    @given(lgst.adapters(root, lgst.adapter_plans(defects=content, max_defects=1)))
    def check(path: Path) -> None:
        config_text = (path / "adapter_config.json")
        report = lg.check_adapters([path])
        codes = {v.code for v in report.violations}
        seen.update(codes)
        if config_text.exists() and not codes:
            json.loads(config_text.read_text())  # a healthy adapter: readable

    check()
    assert seen, "no defect was ever drawn"
    assert all(p.is_relative_to(root) for p in root.rglob("*"))


def test_plans_with_several_defects_write_and_each_is_reported(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Up to three defects on one adapter, dense or MoE, one layer or two: every plan writes
    (defects that break a LoRA pair each get one, as many as the adapter has) and each of
    its defects is reported."""
    root = tmp_path_factory.mktemp("several")
    defects = ("orphan-a", "orphan-b", "rank-mismatch", "empty-tensor", "mixed-dtype",
               "bad-key", "config-rank", "layer-out-of-range")

    @settings(max_examples=60, deadline=None, database=None)
    # (not "flat": its rows are rank x experts, so a config's other r reads as another
    # expert count, LG109, not as another rank)
    @given(lgst.adapter_plans(defects=defects, max_defects=3, layers=(1, 2),
                              moe_layouts=("per-expert", "packed", "shared-outer", None)))
    def check(plan: lgst.AdapterPlan) -> None:
        path = plan.write(tempfile.mkdtemp(dir=root))
        # a module whose pair is broken (orphaned, emptied) is not compared with the config
        # or the base: config-rank and layer-out-of-range need a module left whole
        assume(len(lg.inspect_adapter(path).modules) > len(plan.defects))
        report = lg.check_adapters([path], lg.ServingLimits(base_config={
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": plan.layers,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
            "num_local_experts": plan.experts}))
        assert plan.expected_codes <= set(report.codes()), (plan, report.violations)

    check()


@FAST
@given(lgst.adapter_plans(defects=("orphan-b", "dora"), max_defects=2))
def test_expected_codes_follow_the_defects(plan: lgst.AdapterPlan) -> None:
    assert plan.expected_codes == {DEFECTS[d] for d in plan.defects}


@FAST
@given(lgst.adapter_sets(lgst.adapter_plans(moe_layouts=lgst.MOE_LAYOUTS), min_size=2,
                         max_size=3, same_layout=True))
def test_sets_have_distinct_names_and_one_layout_when_asked(plans: list[lgst.AdapterPlan]
                                                            ) -> None:
    assert [p.name for p in plans] == [f"a{i}" for i in range(len(plans))]
    assert 2 <= len(plans) <= 3
    assert len({p.moe_layout for p in plans}) == 1


@pytest.mark.lora_guard(expect=("LG002",))
def test_mixed_layout_sets_reach_lg002(tmp_path: Path) -> None:
    plans = find(
        lgst.adapter_sets(lgst.adapter_plans(moe_layouts=("per-expert", "shared-outer"),
                                             targets=("gate_proj", "up_proj")), max_size=2),
        lambda ps: len({p.moe_layout for p in ps}) == 2,
        settings=settings(database=None),
    )
    registry = lg.LayoutRegistry()
    registry.admit(plans[0].name, lg.inspect_adapter(plans[0].write(tmp_path)))
    with pytest.raises(lg.MixedMoELayoutError):
        registry.admit(plans[1].name, lg.inspect_adapter(plans[1].write(tmp_path)))


@FAST
@given(lgst.operations(max_loaded=2, min_size=3, max_size=15))
def test_valid_sequences_only_touch_loaded_adapters(ops: list[lgst.Operation]) -> None:
    loaded: set[str] = set()
    for op in ops:
        if op.kind == "load":
            assert op.name not in loaded and len(loaded) < 2 and op.plan is not None
            assert op.plan.name == op.name
            loaded.add(op.name)
        elif op.kind in ("unload", "swap"):
            assert op.name in loaded
            if op.kind == "unload":
                loaded.remove(op.name)
        else:
            assert op.slots in (1, 2, 4, 8) and op.max_rank in (8, 16, 32, 64)


def test_invalid_sequences_are_drawn_when_asked() -> None:
    ops = find(lgst.operations(valid_only=False, kinds=("load", "unload")),
               lambda ops: ops[0].kind == "unload", settings=settings(database=None))
    assert str(ops[0]) == "unload a"


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: lgst.adapter_plans(targets=("qproj",)), ValueError, r"unknown \['qproj'\]"),
        (lambda: lgst.adapter_plans(defects=("typo",)), ValueError, r"unknown \['typo'\]"),
        (lambda: lgst.adapter_plans(targets=("q_proj",), moe_layouts=("flat",)), ValueError,
         "an MoE layout needs an MLP target"),
        (lambda: lgst.adapter_plans(ranks=()), ValueError, "needs at least one value"),
        (lambda: lgst.adapter_plans(ranks=8), TypeError, "a Hypothesis strategy or a collection"),  # type: ignore[arg-type]
        (lambda: lgst.adapter_sets(max_size=0), ValueError, "must be an int >= 1"),
        (lambda: lgst.operations(kinds=("evict",)), ValueError, r"unknown \['evict'\]"),
        (lambda: lgst.operations(kinds=("unload",)), ValueError, "need 'load'"),
        (lambda: lgst.operations(names=()), ValueError, "non-empty adapter ids"),
        (lambda: lgst.adapters(3), TypeError, "tmp_path_factory"),  # type: ignore[arg-type]
    ],
)
def test_bad_options_are_refused_when_the_strategy_is_built(
    make: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        make()  # type: ignore[operator]


def test_adapters_needs_an_existing_directory(tmp_path: Path) -> None:
    strategy = lgst.adapters(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="is not a directory; create it first"):
        find(strategy, lambda p: True, settings=settings(database=None))
