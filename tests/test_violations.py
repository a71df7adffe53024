"""The violation model: one catalogue, errors that engines' handlers still catch, modes."""

from __future__ import annotations

import json
import os
import pickle
import string
import subprocess
import sys
import threading

import pytest

import lora_guard as lg
from lora_guard._core.catalogue import fix_as_documented
from lora_guard._core.errors import error_class, make_violation

CODES = ["LG001", "LG002", "LG003", "LG004", "LG101", "LG102", "LG103", "LG104", "LG105",
         "LG106", "LG107", "LG108", "LG109", "LG110", "LG201", "LG301"]
BUILTIN = {
    "PoolShapeDriftError": RuntimeError, "MixedMoELayoutError": RuntimeError,
    "CacheKeyCollisionError": ValueError, "ShapeContractError": ValueError,
    "AdapterError": ValueError, "RegistryError": RuntimeError, "RankDivergenceError": RuntimeError,
}


def test_the_catalogue_holds_every_contract_code_once() -> None:
    assert set(CODES) <= set(lg.INVARIANTS)
    slugs = [inv.slug for inv in lg.INVARIANTS.values()]
    assert len(slugs) == len(set(slugs))
    with pytest.raises(TypeError):
        lg.INVARIANTS["LG999"] = lg.INVARIANTS["LG001"]  # type: ignore[index]


@pytest.mark.parametrize("code", sorted(lg.INVARIANTS))
def test_each_entry_is_complete(code: str) -> None:
    inv = lg.INVARIANTS[code]
    assert inv.code == code and inv.title and inv.summary and inv.triggers and inv.fixes
    assert inv.hint == inv.fixes[0] and "\n" not in inv.hint
    for variant, index in inv.variant_fixes.items():
        assert variant in inv.messages and 0 <= index < len(inv.fixes)
    cls = error_class(code)
    assert issubclass(cls, lg.LoRAGuardError) and issubclass(cls, BUILTIN[inv.error])
    assert getattr(lg, inv.error) is cls
    assert inv.docs == f"reference/invariants.md#{code.lower()}"
    explained = inv.explain()
    assert explained.startswith(f"## {code} {inv.slug}")
    # a fix that names what was found shows its fields as <name> (LG105's <feature>)
    assert all(fix_as_documented(fix) in explained for fix in inv.fixes)


@pytest.mark.parametrize(
    ("code", "variant"),
    [(code, variant) for code, inv in sorted(lg.INVARIANTS.items()) for variant in inv.messages],
)
def test_every_message_template_formats_with_its_named_fields(code: str, variant: str) -> None:
    template = lg.INVARIANTS[code].messages[variant]
    fields = {name for _, name, _, _ in string.Formatter().parse(template) if name}
    details = {name.split("!")[0]: f"<{name}>" for name in fields if name != "subject"}
    v = make_violation(code, variant, "adapter 'x'", **details)
    assert "adapter 'x'" in v.message or "\"adapter 'x'\"" in v.message
    assert "{" not in v.message and "}" not in v.message  # every field was filled


def test_an_error_carries_the_whole_story() -> None:
    v1 = make_violation("LG201", "stale", "slot map", slot=2, uid="a", mapped="no slot")
    v2 = make_violation("LG201", "exhausted", "slot map", needed=5, slots=4)
    err = lg.RegistryError([v1, v2])
    assert err.code == "LG201" and err.invariant == "registry-inconsistent"
    assert err.hint == lg.INVARIANTS["LG201"].hint
    assert err.details == {"slot": 2, "uid": "a", "mapped": "no slot"}
    assert err.violations == [v1, v2]
    assert str(err).splitlines() == [str(v1), str(v2)]
    assert str(v1).startswith("LG201 registry-inconsistent: slot map: slot 2 holds 'a'")
    assert "Fix: " in str(v1)


def test_errors_survive_pickling_across_processes() -> None:
    err = lg.PoolShapeDriftError(
        [make_violation("LG001", "expected", "pool", dim="rank", old=16, new=8)])
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is lg.PoolShapeDriftError and copy.violations == err.violations


def test_a_user_can_raise_an_error_with_a_message() -> None:
    err = lg.CacheKeyCollisionError("key 'x' reused")
    assert err.code == "LG003"
    with pytest.raises(TypeError, match="needs code="):
        lg.AdapterError("bad adapter")
    assert lg.AdapterError("bad adapter", code="LG108").code == "LG108"


def test_violation_to_dict_is_json() -> None:
    v = make_violation("LG003", "collision", "k", old_shape=(4, 4), old_dtype="float16",
                       new_shape=(2, 4), new_dtype="float16")
    data = json.loads(json.dumps(v.to_dict()))
    assert data["code"] == "LG003" and data["details"]["old_shape"] == [4, 4]


@pytest.mark.parametrize("bad", ["strict", "", None, "RAISE"])
def test_configure_validates_the_mode(bad: object) -> None:
    with pytest.raises(ValueError, match="must be one of 'raise', 'warn', 'record', 'off'"):
        lg.configure(mode=bad)  # type: ignore[arg-type]
    assert lg.get_mode() == "raise"


@pytest.mark.parametrize(("value", "mode"), [("warn", "warn"), (" Record ", "record"),
                                              ("off", "off"), ("bogus", "raise")])
def test_mode_from_the_environment(value: str, mode: str) -> None:
    out = subprocess.run(
        [sys.executable, "-W", "default", "-c", "import lora_guard as lg; print(lg.get_mode())"],
        env={**os.environ, "LORA_GUARD_MODE": value}, capture_output=True, text=True, check=True,
    )
    assert out.stdout.strip() == mode
    if value == "bogus":
        assert "LORA_GUARD_MODE must be one of" in out.stderr


@pytest.mark.lora_guard(expect=["LG201"], reason="sixteen threads report in record mode")
def test_recording_collects_from_every_thread() -> None:
    lg.configure(mode="record")
    with lg.recording() as rec:
        threads = [
            threading.Thread(target=lg.assert_slot_maps_consistent, args=({f"a{i}": 9}, [None]))
            for i in range(16)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(rec) == 16 and set(rec.codes) == {"LG201"}


def test_recording_in_raise_mode_sees_errors_that_were_caught() -> None:
    with lg.recording() as outer, lg.recording() as inner:
        with pytest.raises(lg.RegistryError):
            lg.assert_slot_maps_consistent({"a": 3}, [None])
    assert outer.codes == inner.codes == ["LG201"]
    with lg.recording() as after:
        pass
    assert after.violations == []


def test_off_mode_records_nothing() -> None:
    lg.configure(mode="off")
    with lg.recording() as rec:
        lg.assert_slot_maps_consistent({"a": 3}, [None])
    assert rec.violations == []


@pytest.mark.lora_guard(expect=["LG201"], reason="the test catches the error to narrow it")
def test_is_lora_guard_error_narrows() -> None:
    try:
        lg.assert_slot_maps_consistent({"a": 3}, [None])
    except RuntimeError as exc:
        assert lg.is_lora_guard_error(exc) and exc.code == "LG201"
    assert not lg.is_lora_guard_error(RuntimeError("other"))
