"""`lora_guard.testing` in a user's own tests: capture, assert, and write adapters."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

import lora_guard as lg
from lora_guard import testing
from lora_guard.testing import AdapterFactory, assert_violations, capture_violations, check_codes

# These tests break invariants on purpose and check them with lora_guard.testing itself.
pytestmark = pytest.mark.lora_guard(allow=tuple(lg.INVARIANTS))


def broken_slot_maps() -> None:
    lg.assert_slot_maps_consistent({"a": 0}, ["b"])


class Meta:
    def __init__(self, *shape: int, dtype: str = "bfloat16") -> None:
        self.shape, self.dtype = shape, dtype


def test_assert_violations_suppresses_the_expected_error_and_keeps_the_record() -> None:
    with assert_violations("LG201") as seen:
        broken_slot_maps()
        pytest.fail("not reached: assert_slot_maps_consistent raised in raise mode")
    assert seen.codes == ["LG201", "LG201"]
    assert "adapter 'a' maps to slot 0, but slot 0 holds 'b'" in seen.violations[0].message


def test_assert_violations_works_in_record_mode_too() -> None:
    lg.configure(mode="record")
    try:
        with assert_violations(("LG201",)) as seen:
            broken_slot_maps()
            reached = True
    finally:
        lg.configure(mode="raise")
    assert reached and len(seen) == 2


def test_a_missing_code_fails_with_what_was_seen() -> None:
    with pytest.raises(AssertionError) as failure, assert_violations(["LG201", "LG003"]):
        broken_slot_maps()
    text = str(failure.value)
    assert "expected LG003 (cache-key-collision) but it was not reported" in text
    assert "LG201 registry-inconsistent: slot map: adapter 'a' maps to slot 0" in text


def test_an_unexpected_code_fails_the_assertion_naming_it() -> None:
    with pytest.raises(AssertionError, match=r"unexpected LG201 \(registry-inconsistent\)"), \
            assert_violations("LG003"):
        broken_slot_maps()


def test_only_false_tolerates_other_codes_reported_without_raising() -> None:
    lg.configure(mode="record")
    try:
        with assert_violations("LG003", only=False) as seen:
            cache = lg.GuardedCache({})
            cache["k"] = Meta(2, 3)
            cache["k"] = Meta(2, 4)
            broken_slot_maps()
    finally:
        lg.configure(mode="raise")
    assert seen.codes == ["LG003", "LG201", "LG201"]


def test_nothing_reported_passes_with_no_codes_and_fails_with_one() -> None:
    with assert_violations(()) as seen:
        lg.assert_slot_maps_consistent({"a": 0}, ["a"])
    assert seen.codes == []
    with pytest.raises(AssertionError, match="expected LG201.*reported in the block:\n  nothing"), \
            assert_violations("LG201"):
        pass


def test_other_exceptions_pass_through() -> None:
    with pytest.raises(KeyError), assert_violations("LG201"):
        raise KeyError("not ours")


@pytest.mark.parametrize(
    ("codes", "message"),
    [
        ("LG01", r"'LG01' is not a lora_guard code \(did you mean 'LG001'\?\)"),
        (["lg201"], r"'lg201' is not a lora_guard code \(did you mean 'LG201'\?\)"),
        (("LG999",), r"'LG999' is not a lora_guard code; valid codes: LG001, LG002"),
        ([1], r"1 is not a string"),
    ],
)
def test_unknown_codes_are_refused_before_the_block_runs(codes: object, message: str) -> None:
    ran = []
    with pytest.raises(ValueError, match=message), assert_violations(codes):  # type: ignore[arg-type]
        ran.append(True)
    assert ran == []


def test_check_codes_refuses_a_non_iterable() -> None:
    with pytest.raises(TypeError, match="expected a code or a tuple of codes"):
        check_codes(3, where="allow")  # type: ignore[arg-type]


def test_capture_sees_violations_from_other_threads_and_stops_at_exit() -> None:
    lg.configure(mode="record")
    try:
        with capture_violations() as seen:
            worker = threading.Thread(target=broken_slot_maps)
            worker.start()
            worker.join()
        broken_slot_maps()  # after the block: not captured
    finally:
        lg.configure(mode="raise")
    assert seen.codes == ["LG201", "LG201"]
    assert testing._ACTIVE == []


def test_capture_does_not_swallow_the_error() -> None:
    with pytest.raises(lg.RegistryError), capture_violations() as seen:
        broken_slot_maps()
    assert seen.codes == ["LG201", "LG201"]


def test_the_factory_writes_peft_folders_named_in_order(tmp_path: Path) -> None:
    make_adapter = AdapterFactory(tmp_path)
    first = make_adapter(rank=16, targets=("q_proj", "k_proj", "v_proj"))
    second = make_adapter(moe_layout="shared-outer", targets=("gate_proj", "up_proj"))
    named = make_adapter(name="dora", defects=("dora",))
    assert [p.name for p in make_adapter.made] == ["adapter0", "adapter1", "dora"]
    config = json.loads((first / "adapter_config.json").read_text())
    assert (config["r"], sorted(config["target_modules"])) == (16, ["k_proj", "q_proj", "v_proj"])
    assert lg.detect_moe_layout(lg.inspect_adapter(second)) is lg.MoELayout.SHARED_OUTER
    assert json.loads((named / "adapter_config.json").read_text())["use_dora"] is True


def test_every_defect_is_reported_by_the_checker_with_its_code(tmp_path: Path) -> None:
    make_adapter = AdapterFactory(tmp_path)
    base = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 128}
    limits = lg.ServingLimits(base_config=base)
    for defect, code in testing.DEFECTS.items():
        report = lg.check_adapters([make_adapter(name=defect, defects=(defect,))], limits)
        assert code in {v.code for v in report.violations}, (defect, report.violations)


def test_the_factory_refuses_to_overwrite_and_bad_names(tmp_path: Path) -> None:
    make_adapter = AdapterFactory(tmp_path)
    make_adapter(name="a")
    with pytest.raises(FileExistsError, match="already exists; pass another name="):
        make_adapter(name="a")
    with pytest.raises(ValueError, match="must be a plain folder name"):
        make_adapter(name="../escape")
    assert not (tmp_path.parent / "escape").exists()


def test_the_factory_skips_names_already_on_disk(tmp_path: Path) -> None:
    (tmp_path / "adapter0").mkdir()
    assert AdapterFactory(tmp_path)().name == "adapter1"


def test_write_adapter_is_re_exported() -> None:
    from lora_guard._testing import adapter_writer as _adapter_writer

    assert testing.write_adapter is _adapter_writer.write_adapter
    assert testing.DEFECTS is _adapter_writer.DEFECTS
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        testing.nope  # noqa: B018
