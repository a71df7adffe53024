"""What a third-party server calls: read an adapter, check it against its limits, one by one."""

from __future__ import annotations

import pathlib

import pytest

import lora_guard as lg
from conftest_adapters import peft_adapter


def test_check_adapter_gives_the_verdict_check_adapters_gives(tmp_path: pathlib.Path) -> None:
    """A server that reads each adapter itself sees what `lora-guard check` would say."""
    folder = peft_adapter(tmp_path / "rank32", r=32, target_modules=["q_proj", "v_proj"])
    limits = lg.ServingLimits.for_engine("vllm", "--max-lora-rank", "16")
    spec = lg.inspect_adapter(folder)
    one = lg.check_adapter(spec, limits, subject="adapter 'rank32'")
    whole = lg.check_adapters(folder, limits)
    assert one.codes() == whole.codes() == ["LG101"]
    assert one.violations[0].message.startswith("adapter 'rank32': rank 32")
    assert one.adapters == (spec,) and not one.ok
    with pytest.raises(lg.AdapterError, match="LG101"):
        one.enforce()
    assert lg.check_adapter(spec, lg.ServingLimits.for_engine("vllm", max_lora_rank=64)).ok


def test_check_adapter_says_what_it_takes(tmp_path: pathlib.Path) -> None:
    folder = peft_adapter(tmp_path / "a", r=4, target_modules=["q_proj"])
    with pytest.raises(TypeError, match=r"lg.inspect_adapter\(path\).*use lg.check_adapters"):
        lg.check_adapter(folder)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\['LG999'\].*LG101"):
        lg.check_adapter(lg.inspect_adapter(folder), skip=("LG999",))
