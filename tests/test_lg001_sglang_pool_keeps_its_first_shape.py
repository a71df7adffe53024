"""Seed 000: sglang's shared-sink pool is allocated on the first set_lora_info and must keep
its shape. The sink here mirrors sglang's Inkling `SharedSink`: the first call allocates the
derived pools `_w1_delta (S, n*2F, 2R)` and `_a_cat (S, R, n*F)`, later calls refill them."""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import lora_guard as lg

DEVICES = ["cpu", "meta"]


class SharedSink(torch.nn.Module):
    """What a server writes: buffers allocated on first use, refilled on every update."""

    def __init__(self) -> None:
        super().__init__()
        self._w1_delta: torch.Tensor | None = None
        self._a_cat: torch.Tensor | None = None
        self.updates = 0

    @lg.shapes(
        gate_up_a="slots outer 2*rank hidden",
        gate_up_b="slots n 2*f rank",
        down_a="slots n rank f",
        down_b="slots outer hidden rank",
        where=lambda d: d["outer"] in (1, d["n"]),
        frozen=("slots", "n", "f", "rank"),
    )
    def set_lora_info(
        self,
        gate_up_a: torch.Tensor,
        gate_up_b: torch.Tensor,
        down_a: torch.Tensor,
        down_b: torch.Tensor,
    ) -> None:
        """Install the LoRA weights of every slot."""
        slots, n, two_f, rank = gate_up_b.shape
        f = down_a.shape[-1]
        if self._w1_delta is None:
            self._w1_delta = gate_up_b.new_zeros((slots, n * two_f, 2 * rank))
            self._a_cat = down_a.new_zeros((slots, rank, n * f))
        self.updates += 1
        if gate_up_b.device.type != "meta":
            assert self._w1_delta is not None and self._a_cat is not None
            self._w1_delta[..., :rank] = gate_up_b.reshape(slots, n * two_f, rank)
            self._a_cat.copy_(down_a.permute(0, 2, 1, 3).reshape(slots, rank, n * f))


def sink_weights(
    *, slots: int = 4, n: int = 8, f: int = 32, rank: int = 16, hidden: int = 64,
    outer: int = 1, device: str = "cpu",
) -> tuple[torch.Tensor, ...]:
    def make(*shape: int) -> torch.Tensor:
        if device == "meta":
            return torch.empty(shape, device="meta")
        return torch.randn(shape)

    return (
        make(slots, outer, 2 * rank, hidden),
        make(slots, n, 2 * f, rank),
        make(slots, n, rank, f),
        make(slots, outer, hidden, rank),
    )


def snapshot(sink: SharedSink) -> dict[str, Any]:
    assert sink._w1_delta is not None and sink._a_cat is not None
    state = {"updates": sink.updates, "shapes": (sink._w1_delta.shape, sink._a_cat.shape)}
    if sink._w1_delta.device.type != "meta":
        state["w1"] = sink._w1_delta.clone()
        state["a"] = sink._a_cat.clone()
    return state


def assert_untouched(sink: SharedSink, before: dict[str, Any]) -> None:
    after = snapshot(sink)
    assert after["updates"] == before["updates"]
    assert after["shapes"] == before["shapes"]
    if "w1" in before:
        assert torch.equal(after["w1"], before["w1"]) and torch.equal(after["a"], before["a"])


@pytest.mark.parametrize("device", DEVICES)
def test_rank_16_then_rank_8_is_refused_before_the_pool_changes(device: str) -> None:
    sink = SharedSink()
    sink.set_lora_info(*sink_weights(rank=16, device=device))
    before = snapshot(sink)

    with pytest.raises(lg.PoolShapeDriftError) as info:
        sink.set_lora_info(*sink_weights(rank=8, device=device))

    err = info.value
    assert isinstance(err, RuntimeError), "existing `except RuntimeError` must keep working"
    assert err.code == "LG001" and err.invariant == "pool-shape-drift"
    message = str(err)
    assert "SharedSink.set_lora_info" in message
    assert "'rank'" in message and "frozen at 16" in message and "now 8" in message
    assert "gate_up_b" in message  # the argument that brought the new value
    assert "unfreeze" in err.hint
    assert err.details["old"] == 16 and err.details["new"] == 8
    assert_untouched(sink, before)


@pytest.mark.parametrize("device", DEVICES)
def test_more_slots_after_start_up_is_refused(device: str) -> None:
    sink = SharedSink()
    sink.set_lora_info(*sink_weights(slots=4, device=device))
    before = snapshot(sink)

    with pytest.raises(lg.PoolShapeDriftError, match=r"dim 'slots' was frozen at 4 .* now 6"):
        sink.set_lora_info(*sink_weights(slots=6, device=device))
    assert_untouched(sink, before)


@pytest.mark.parametrize("device", DEVICES)
def test_the_same_shapes_keep_serving(device: str) -> None:
    sink = SharedSink()
    for _ in range(3):
        sink.set_lora_info(*sink_weights(device=device))
    assert sink.updates == 3
    assert lg.frozen_dims(sink) == {"slots": 4, "n": 8, "f": 32, "rank": 16}


def test_two_sinks_freeze_independently() -> None:
    a, b = SharedSink(), SharedSink()
    a.set_lora_info(*sink_weights(rank=16, device="meta"))
    b.set_lora_info(*sink_weights(rank=8, device="meta"))
    assert lg.frozen_dims(a)["rank"] == 16 and lg.frozen_dims(b)["rank"] == 8


def test_unfreeze_allows_a_deliberate_rebuild() -> None:
    sink = SharedSink()
    sink.set_lora_info(*sink_weights(rank=16, device="meta"))
    lg.unfreeze(sink)
    sink._w1_delta = sink._a_cat = None  # the server rebuilds its pools
    sink.set_lora_info(*sink_weights(rank=8, device="meta"))
    assert lg.frozen_dims(sink)["rank"] == 8


def test_a_failed_first_call_freezes_nothing() -> None:
    class FlakySink:
        @lg.shapes(a="slots rank", frozen=("rank",))
        def set_lora_info(self, a: torch.Tensor) -> None:
            raise MemoryError("allocation failed")

    sink = FlakySink()
    with pytest.raises(MemoryError):
        sink.set_lora_info(torch.empty(4, 16, device="meta"))
    assert lg.frozen_dims(sink) == {}


def test_a_failed_first_call_keeps_dims_a_concurrent_call_allocated_with() -> None:
    """Two threads make the first call at once: one fails mid-allocation, the other
    allocates the pool. The dims stay frozen: the pool that exists was built with them."""
    import threading

    first_inside, second_done = threading.Event(), threading.Event()

    class RacingSink:
        allocated: tuple[int, ...] | None = None

        @lg.shapes(a="slots rank", frozen=("slots", "rank"))
        def set_lora_info(self, a: torch.Tensor, *, fail: bool = False) -> None:
            if fail:
                first_inside.set()
                second_done.wait(timeout=10)
                raise MemoryError("allocation failed")
            self.allocated = tuple(a.shape)

    sink = RacingSink()

    def failing() -> None:
        with pytest.raises(MemoryError):
            sink.set_lora_info(torch.empty(4, 16, device="meta"), fail=True)

    thread = threading.Thread(target=failing)
    thread.start()
    assert first_inside.wait(timeout=10)
    sink.set_lora_info(torch.empty(4, 16, device="meta"))  # succeeds while the first fails
    second_done.set()
    thread.join(timeout=10)
    assert sink.allocated == (4, 16)
    assert lg.frozen_dims(sink) == {"slots": 4, "rank": 16}
    with pytest.raises(lg.PoolShapeDriftError):
        sink.set_lora_info(torch.empty(4, 8, device="meta"))


@pytest.mark.parametrize(
    ("weights", "fragment"),
    [
        (sink_weights(outer=3, device="meta"), "fail the guard's where= predicate"),
        (
            (torch.empty(4, 1, 33, 64, device="meta"), *sink_weights(device="meta")[1:]),
            "not a multiple of 2",
        ),
        (
            (torch.empty(4, 1, 32, device="meta"), *sink_weights(device="meta")[1:]),
            "has 3 dims",
        ),
        (
            (*sink_weights(device="meta")[:3], torch.empty(4, 1, 64, 8, device="meta")),
            "should be 'rank' = 16",
        ),
    ],
    ids=["outer-not-1-or-n", "odd-gate-up", "wrong-ndim", "rank-of-a-vs-b"],
)
def test_arguments_that_disagree_within_one_call(
    weights: tuple[torch.Tensor, ...], fragment: str
) -> None:
    sink = SharedSink()
    with pytest.raises(lg.ShapeContractError) as info:
        sink.set_lora_info(*weights)
    assert isinstance(info.value, ValueError)
    assert info.value.code == "LG004"
    assert fragment in str(info.value)
    assert sink.updates == 0 and sink._w1_delta is None


def test_a_guarded_call_dispatches_no_tensor_operation() -> None:
    """Metadata only: no allocation, no kernel, no device sync inside the guard."""

    class Recorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __init__(self) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    class Pool:
        @lg.shapes(a="slots rank hidden", b="slots hidden rank", frozen=("slots", "rank"))
        def set_lora_info(self, a: torch.Tensor, b: torch.Tensor) -> None:
            pass

    pool = Pool()
    a, b = torch.randn(4, 16, 64), torch.randn(4, 64, 16)
    a8, b8 = torch.randn(4, 8, 64), torch.randn(4, 64, 8)
    with Recorder() as rec:
        pool.set_lora_info(a, b)  # first call: binds and freezes
        pool.set_lora_info(a, b)  # fast path
        with pytest.raises(lg.PoolShapeDriftError):
            pool.set_lora_info(a8, b8)  # slow path: diagnosis and report
        with pytest.raises(lg.ShapeContractError):
            pool.set_lora_info(a, b8)
    assert rec.ops == []


def test_arguments_are_found_by_name_or_position() -> None:
    sink = SharedSink()
    ga, gb, da, db = sink_weights(device="meta")
    sink.set_lora_info(ga, gb, down_a=da, down_b=db)
    with pytest.raises(lg.PoolShapeDriftError):
        ga8, gb8, da8, db8 = sink_weights(rank=8, device="meta")
        sink.set_lora_info(down_b=db8, down_a=da8, gate_up_b=gb8, gate_up_a=ga8)


def test_the_decorated_method_keeps_its_identity() -> None:
    method = SharedSink.set_lora_info
    assert method.__name__ == "set_lora_info"
    assert method.__qualname__ == "SharedSink.set_lora_info"
    assert method.__doc__ == "Install the LoRA weights of every slot."
    assert list(inspect.signature(method).parameters) == [
        "self", "gate_up_a", "gate_up_b", "down_a", "down_b"]
    assert inspect.unwrap(method) is method.__wrapped__  # type: ignore[attr-defined]


def test_plain_static_and_class_methods() -> None:
    @lg.shapes(a="rank hidden", frozen=("rank",))
    def load(a: torch.Tensor, *, scale: float = 1.0) -> float:
        return scale

    assert load(torch.empty(8, 64, device="meta"), scale=2.0) == 2.0
    with pytest.raises(lg.PoolShapeDriftError):
        load(torch.empty(16, 64, device="meta"))
    assert lg.frozen_dims(load) == {"rank": 8}

    class Pools:
        @staticmethod
        @lg.shapes(a="rank hidden")
        def stat(a: torch.Tensor) -> str:
            return "static"

        @lg.shapes(a="rank hidden", frozen=("rank",))
        @classmethod
        def klass(cls, a: torch.Tensor) -> str:
            return cls.__name__

    assert Pools.stat(torch.empty(8, 64)) == "static"
    with pytest.raises(lg.ShapeContractError):
        Pools.stat(torch.empty(8))
    assert Pools.klass(torch.empty(8, 64)) == "Pools"
    with pytest.raises(lg.PoolShapeDriftError):
        Pools().klass(torch.empty(4, 64))
    assert lg.frozen_dims(Pools) == {"rank": 8}


def test_optional_arguments_that_are_none_are_skipped() -> None:
    class Pool:
        @lg.shapes(a="slots rank", b="slots rank", frozen=("rank",))
        def set_lora_info(self, a: torch.Tensor, b: torch.Tensor | None = None) -> str:
            return "ok"

    pool = Pool()
    assert pool.set_lora_info(torch.empty(4, 16)) == "ok"
    assert pool.set_lora_info(torch.empty(4, 16), torch.empty(4, 16)) == "ok"
    with pytest.raises(lg.ShapeContractError, match="argument 'b' dim 1"):
        pool.set_lora_info(torch.empty(4, 16), torch.empty(4, 8))


def test_something_without_a_shape_is_a_contract_error_not_an_attribute_error() -> None:
    sink = SharedSink()
    with pytest.raises(lg.ShapeContractError, match="argument 'gate_up_a' is a list with no"):
        sink.set_lora_info([1, 2], *sink_weights(device="meta")[1:])  # type: ignore[arg-type]


def test_ellipsis_literal_and_any() -> None:
    @lg.shapes(x="... 3 _ rank", y="rank*2")
    def f(x: torch.Tensor, y: torch.Tensor) -> None:
        pass

    f(torch.empty(3, 5, 4, device="meta"), torch.empty(8, device="meta"))
    f(torch.empty(7, 7, 3, 1, 4, device="meta"), torch.empty(8, device="meta"))
    with pytest.raises(lg.ShapeContractError, match="fixes it at 3"):
        f(torch.empty(2, 5, 4, device="meta"), torch.empty(8, device="meta"))
    with pytest.raises(lg.ShapeContractError, match="at least 3"):
        f(torch.empty(5, 4, device="meta"), torch.empty(8, device="meta"))


def test_dtype_options() -> None:
    @lg.shapes(a="r h", b="h r", dtypes=(torch.bfloat16, "float16"), same_dtype=True)
    def f(a: torch.Tensor, b: torch.Tensor) -> None:
        pass

    f(torch.empty(4, 8, dtype=torch.bfloat16), torch.empty(8, 4, dtype=torch.bfloat16))
    with pytest.raises(lg.ShapeContractError, match="dtype float32"):
        f(torch.empty(4, 8), torch.empty(8, 4))
    with pytest.raises(lg.ShapeContractError, match="disagree on dtype"):
        f(torch.empty(4, 8, dtype=torch.bfloat16), torch.empty(8, 4, dtype=torch.float16))


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({}, TypeError, "at least one argument spec"),
        ({"a": "slots 2**rank"}, ValueError, "is invalid"),
        ({"a": "slots ... rank"}, ValueError, "'...' may only come first"),
        ({"a": "slots rank", "frozen": ("hidden",)}, ValueError, "not dims named in the specs"),
        ({"a": "slots rank", "dtypes": ("float99",)}, ValueError, "not a torch dtype"),
        ({"a": "slots rank", "where": 3}, TypeError, "must be a callable"),
    ],
)
def test_bad_declarations_fail_at_decoration_with_a_fix(
    kwargs: dict[str, Any], error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error, match=fragment):
        lg.shapes(**kwargs)


def test_a_spec_for_a_missing_parameter_fails_at_decoration() -> None:
    with pytest.raises(TypeError, match=r"\['weights'\] are not parameters"):
        @lg.shapes(weights="slots rank")
        def f(a: torch.Tensor) -> None:
            pass


def test_off_mode_returns_the_undecorated_function() -> None:
    def set_lora_info(a: torch.Tensor) -> None:
        pass

    lg.configure(mode="off")
    assert lg.shapes(a="rank")(set_lora_info) is set_lora_info


@pytest.mark.lora_guard(expect=["LG001"], reason="record mode proceeds past a rank-8 write")
def test_warn_and_record_modes_proceed() -> None:
    sink = SharedSink()
    sink.set_lora_info(*sink_weights(rank=16, device="meta"))
    lg.configure(mode="warn")
    with pytest.warns(lg.LoRAGuardWarning, match="LG001") as caught:
        sink.set_lora_info(*sink_weights(rank=8, device="meta"))
    assert caught[0].filename == __file__  # the warning points at the caller, not at us
    assert sink.updates == 2
    lg.configure(mode="record")
    with lg.recording() as rec, warnings.catch_warnings():
        warnings.simplefilter("error")
        sink.set_lora_info(*sink_weights(rank=8, device="meta"))
    assert rec.codes == ["LG001"] and sink.updates == 3
    assert rec.violations[0].location.endswith("in test_warn_and_record_modes_proceed")


@pytest.mark.lora_guard(expect=["LG001"], reason="the loader swallows LG001, as sglang's does")
def test_a_swallowed_error_is_still_recorded() -> None:
    sink = SharedSink()
    sink.set_lora_info(*sink_weights(rank=16, device="meta"))
    with lg.recording() as rec:
        try:
            sink.set_lora_info(*sink_weights(rank=8, device="meta"))
        except RuntimeError:
            pass  # what sglang's loader does with every exception
    assert rec.codes == ["LG001"]


def test_torch_compile_traces_through_without_a_graph_break() -> None:
    class Pool(torch.nn.Module):
        @lg.shapes(a="slots rank", frozen=("rank",))
        def scale(self, a: torch.Tensor) -> torch.Tensor:
            return a * 2

        def forward(self, a: torch.Tensor) -> torch.Tensor:
            return self.scale(a) + 1

    pool = Pool()
    compiled = torch.compile(pool, backend="eager", fullgraph=True)
    out = compiled(torch.ones(2, 4))
    assert torch.equal(out, torch.full((2, 4), 3.0))
    assert lg.frozen_dims(pool) == {}  # the guard stood aside while tracing


def _readme_sink() -> Any:
    class SharedSink(torch.nn.Module):
        @lg.shapes(
            gate_up_a="slots outer 2*rank hidden",
            gate_up_b="slots n 2*f rank",
            down_a="slots n rank f",
            down_b="slots outer hidden rank",
            where=lambda d: d["outer"] in (1, d["n"]),
            frozen=("slots", "n", "f", "rank"),
        )
        def set_lora_info(self, gate_up_a: Any, gate_up_b: Any, down_a: Any,
                          down_b: Any) -> None: ...

    return SharedSink


def test_the_readme_where_runs_inline_in_the_wrapper_without_a_dict_per_call() -> None:
    sink_cls = _readme_sink()
    source = sink_cls.set_lora_info.__lora_guard_source__
    assert "_lg_where(" not in source  # the lambda's body is compiled into the wrapper
    assert "_lg_d_outer in (1, _lg_d_n)" in source
    sink = sink_cls()
    meta = functools.partial(torch.empty, device="meta")
    sink.set_lora_info(meta(4, 1, 32, 64), meta(4, 8, 64, 16), meta(4, 8, 16, 32),
                       meta(4, 1, 64, 16))
    sink.set_lora_info(meta(4, 8, 32, 64), meta(4, 8, 64, 16), meta(4, 8, 16, 32),
                       meta(4, 8, 64, 16))  # outer == n: per-expert, allowed
    with pytest.raises(lg.ShapeContractError) as info:  # outer 3: neither 1 nor n
        sink.set_lora_info(meta(4, 3, 32, 64), meta(4, 8, 64, 16), meta(4, 8, 16, 32),
                           meta(4, 3, 64, 16))
    assert info.value.code == "LG004"


def test_a_where_that_reads_a_global_is_still_called_with_the_dims() -> None:
    seen: list[dict[str, int]] = []

    def predicate(d: dict[str, int]) -> bool:
        seen.append(dict(d))
        return d["rank"] <= 16

    @lg.shapes(a="slots rank", where=predicate)
    def load(a: Any) -> None: ...

    assert "_lg_where(" in load.__lora_guard_source__  # type: ignore[attr-defined]
    load(torch.empty(2, 8, device="meta"))
    assert seen[-1] == {"slots": 2, "rank": 8}
    with pytest.raises(lg.ShapeContractError):
        load(torch.empty(2, 32, device="meta"))
    limit = 4

    @lg.shapes(a="slots rank", where=lambda d: d["rank"] <= limit)
    def closure(a: Any) -> None: ...

    # a closure: called, not inlined
    assert "_lg_where(" in closure.__lora_guard_source__  # type: ignore[attr-defined]
    with pytest.raises(lg.ShapeContractError):
        closure(torch.empty(2, 8, device="meta"))
