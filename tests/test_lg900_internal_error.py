"""LG900 (internal-error): a bug in lora_guard's checker is a bug, never a verdict on the file.

The adapter it hit gets LG900 (naming the exception and where it was raised), the other
adapters are still read and checked, and `LORA_GUARD_DEBUG=1` raises it with its traceback.
A problem with the file stays LG108 on the file, even when debugging.
"""

from __future__ import annotations

import os
import pathlib

import pytest

import lora_guard as lg
from lora_guard._checking import run_checks
from lora_guard._checking.invariants import lg101_rank_exceeds_limit, lg115_no_weights
from lora_guard._checking.rules.context import AdapterContext
from lora_guard._testing.adapter_writer import write_adapter


def _broken_check(*args: object, **kwargs: object) -> None:
    raise KeyError("dims")  # what a bug in a check looks like


def _replace_check(monkeypatch: pytest.MonkeyPatch, real: object, check: object) -> None:
    """Run ``check`` where the checker runs the built-in check ``real``."""
    monkeypatch.setattr(run_checks, "_CHECKS",
                        tuple(check if c is real else c for c in run_checks._CHECKS))


@pytest.mark.lora_guard(expect=["LG900"], reason="a check made to fail on purpose")
def test_a_bug_in_a_check_is_lg900_and_the_other_adapters_are_still_checked(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    write_adapter(tmp_path / "set" / "a", rank=8)
    write_adapter(tmp_path / "set" / "b", rank=64)
    monkeypatch.delenv("LORA_GUARD_DEBUG", raising=False)
    real = lg101_rank_exceeds_limit.rank_exceeds_limit
    calls = []

    def fails_on_a(ctx: AdapterContext) -> object:
        calls.append(ctx.subject)
        if ctx.subject.endswith("/a'"):
            _broken_check()
        return real(ctx)

    _replace_check(monkeypatch, real, fails_on_a)
    report = lg.check_adapters(tmp_path / "set", lg.ServingLimits(max_rank=16))
    assert report.codes() == ["LG900", "LG101"]
    bug = report.violations[0]
    assert "bug in lora_guard, not a verdict on the adapter" in bug.message
    assert "KeyError" in bug.message and "test_lg900_internal_error.py" in bug.message
    assert "LG108" not in report.codes() and len(calls) == 2
    assert "LORA_GUARD_DEBUG=1" in bug.hint
    with pytest.raises(lg.AdapterError, match="LG900"):
        report.enforce()


def test_with_lora_guard_debug_the_bug_raises_with_its_traceback(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = write_adapter(tmp_path / "a")
    monkeypatch.setenv("LORA_GUARD_DEBUG", "1")
    _replace_check(monkeypatch, lg115_no_weights.no_weights, _broken_check)
    with pytest.raises(KeyError, match="dims") as raised:
        lg.check_adapters(folder)
    assert raised.traceback[-1].name == "_broken_check"


@pytest.mark.lora_guard(expect=["LG900"], reason="the reader made to fail on purpose")
def test_a_bug_in_the_reader_is_lg900_for_its_adapter_only(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checker reads a folder's adapters together, a phase at a time: a reader bug on
    one adapter is that adapter's LG900, and the adapters around it are read and checked."""
    from lora_guard._reading import adapters

    for name, rank in (("a", 8), ("b", 64), ("c", 8)):
        write_adapter(tmp_path / "set" / name, rank=rank)
    monkeypatch.delenv("LORA_GUARD_DEBUG", raising=False)
    real = adapters.member_spec

    def fails_on_b(folder: pathlib.Path, *args: object, **kwargs: object) -> object:
        if folder.name == "b":
            _broken_check()
        return real(folder, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(adapters, "member_spec", fails_on_b)
    report = lg.check_adapters(tmp_path / "set", lg.ServingLimits(max_rank=16))
    assert report.codes() == ["LG900"]
    assert report.violations[0].subject.endswith("/b'")
    assert [spec.name for spec in report.adapters] == ["a", "c"]
    with pytest.raises(lg.AdapterError, match="LG900"):
        report.enforce()

    monkeypatch.setenv("LORA_GUARD_DEBUG", "1")
    with pytest.raises(KeyError, match="dims") as raised:
        lg.check_adapters(tmp_path / "set")
    assert raised.traceback[-1].name == "_broken_check"


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        (b'{"r": 8, "lora_alpha": ' + b"9" * 5000 + b', "target_modules": ["q_proj"]}',
         "invalid JSON"),
        (b'{"r": 8, "lora_alpha": 16, "target_modules": ["q_\xff"]}', "not UTF-8"),
        (b'{"r": 8, "lora_alpha": NaN, "target_modules": ["q_proj"]}', "NaN"),
        (b'{"r": 8, "r": 16, "lora_alpha": 16, "target_modules": ["q_proj"]}',
         "duplicate key 'r'"),
    ],
)
def test_a_problem_with_the_file_stays_lg108_on_the_file(
    tmp_path: pathlib.Path, config: bytes, problem: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LORA_GUARD_DEBUG", "1")  # not a bug: never raised
    folder = write_adapter(tmp_path / "a")
    (folder / "adapter_config.json").write_bytes(config)
    report = lg.check_adapters(folder)
    assert report.codes() == ["LG108"]
    assert problem in report.violations[0].message


def test_an_os_error_while_reading_is_lg108_even_when_debugging(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = write_adapter(tmp_path / "a")
    monkeypatch.setenv("LORA_GUARD_DEBUG", "1")

    def failing_read(*args: object) -> bytes:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "read", failing_read)
    report = lg.check_adapters(folder)
    assert report.codes() == ["LG108"]
    assert "Input/output error" in report.violations[0].message
