"""check_adapters: will this set of adapters serve on this model with these limits?

The checker's own jobs: a set passes or fails as a whole, a bad adapter never stops the others,
discovery, limits validated when made, the report's schema, the fix that fits each unreadable
adapter. Each code's own tests are in its file, tests/test_lgNNN_<slug>.py.
"""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

import lora_guard as lg
from conftest_adapters import TINY_LLAMA
from lora_guard._testing.adapter_writer import DEFECTS, write_adapter

pytest.importorskip("peft")


@pytest.fixture
def served(zoo: dict[str, pathlib.Path], tmp_path: pathlib.Path) -> pathlib.Path:
    """A folder of adapters a Llama server serves: PEFT's own, copied."""
    for name in ("r8-qv", "r16-all-bf16", "rank-pattern-fp16", "embedding-fp16"):
        shutil.copytree(zoo[name], tmp_path / "served" / name)
    return tmp_path / "served"


def test_a_compatible_set_passes(served: pathlib.Path, zoo: dict[str, pathlib.Path]) -> None:
    report = lg.check_adapters(served, lg.ServingLimits(
        max_rank=16, max_loras=4, base_config=zoo["base-llama"]))
    assert report.ok, report.violations
    assert [s.name for s in report.adapters] == [
        "embedding-fp16", "r16-all-bf16", "r8-qv", "rank-pattern-fp16"]
    assert report.to_dict()["summary"] == {
        "adapters": 4, "failed": 0, "violations": 0, "by_code": {}}


@pytest.mark.parametrize("defect", sorted(d for d, c in DEFECTS.items() if c != "LG108"))
def test_each_content_defect_has_its_code_and_nothing_else(
    tmp_path: pathlib.Path, defect: str
) -> None:
    folder = write_adapter(tmp_path / "a", defects=(defect,))
    report = lg.check_adapters(folder, lg.ServingLimits(base_config=TINY_LLAMA))
    assert set(report.codes()) == {DEFECTS[defect]}, report.violations
    assert report.by_adapter[str(folder)] == report.violations


def test_a_bad_adapter_never_stops_the_others(tmp_path: pathlib.Path) -> None:
    for defect in ("truncated-header", "pickle-bin", "symlink-escape", "invalid-config-json"):
        write_adapter(tmp_path / "set" / defect, defects=(defect,))
    write_adapter(tmp_path / "set" / "fine")
    report = lg.check_adapters(tmp_path / "set")
    assert [s.name for s in report.adapters] == ["fine"]
    assert report.codes() == ["LG108"] * 4
    assert report.by_adapter.get(str(tmp_path / "set" / "fine")) is None
    assert all(v.details["problem"] for v in report.violations)


def test_explicit_paths_without_an_adapter_are_lg108(tmp_path: pathlib.Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("hi")
    report = lg.check_adapters([tmp_path / "empty", tmp_path / "notes.txt",
                                tmp_path / "missing"])
    assert report.codes() == ["LG108"] * 3
    problems = [v.details["problem"] for v in report.violations]
    assert problems == ["no adapter found (no folder holding adapter_config.json or "
                        "adapter_model.safetensors)", "not an adapter folder",
                        "no such file or folder"]


def test_specs_and_paths_mix_and_duplicates_count_once(tmp_path: pathlib.Path) -> None:
    folder = write_adapter(tmp_path / "a")
    report = lg.check_adapters([lg.inspect_adapter(folder), folder, str(folder) + "/"])
    assert len(report.ids) == 1


def test_check_adapters_never_raises_and_does_not_report_through_the_mode(
    tmp_path: pathlib.Path,
) -> None:
    folder = write_adapter(tmp_path / "a", defects=("pickle-bin",))
    with lg.recording() as rec:
        report = lg.check_adapters(folder)
    assert not report.ok and rec.codes == []
    with pytest.raises(lg.AdapterError, match="LG108"):
        report.enforce()


def test_adapter_servable_is_a_predicate(tmp_path: pathlib.Path) -> None:
    good = write_adapter(tmp_path / "good", rank=8)
    assert lg.adapter_servable(lg.inspect_adapter(good), lg.ServingLimits(max_rank=8))
    assert not lg.adapter_servable(good, lg.ServingLimits(max_rank=4))
    assert not lg.adapter_servable(tmp_path / "missing")


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"max_rank": -1}, "max_rank"),
        ({"max_loras": 1.5}, "max_loras"),
        ({"allowed_ranks": "8,16"}, "allowed_ranks"),
        ({"allowed_ranks": ()}, "non-empty"),
        ({"target_modules": "q_proj"}, "collection of names"),
        ({"dtypes": ("float13",)}, "unknown dtype 'float13'"),
        ({"allow": ("dora", "magic")}, "unknown feature(s) ['magic']"),
        ({"base_config": "/no/such/config.json"}, "cannot read base config"),
        ({"base_config": {"vocab_size": 3}}, "no hidden_size"),
        ({"base_config": 3}, "config.json path or a dict"),
    ],
)
def test_limits_are_validated_when_made(options: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError) as info:
        lg.ServingLimits(**options)  # type: ignore[arg-type]
    assert words in str(info.value)


def test_base_config_can_be_a_folder_or_a_dict(zoo: dict[str, pathlib.Path]) -> None:
    from_folder = lg.ServingLimits(base_config=zoo["base-llama"].parent)
    from_dict = lg.ServingLimits(base_config=TINY_LLAMA)
    assert from_folder.base is not None and from_dict.base is not None
    assert from_folder.base.hidden_size == from_dict.base.hidden_size == 64


def test_report_json_schema(tmp_path: pathlib.Path) -> None:
    write_adapter(tmp_path / "ok")
    write_adapter(tmp_path / "dora", defects=("dora",))
    data = lg.check_adapters(tmp_path, lg.ServingLimits(max_rank=16)).to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["schema_version"] == 1 and data["ok"] is False
    assert data["limits"]["max_rank"] == 16
    first = data["adapters"][0]
    assert set(first) == {"id", "ok", "readable", "rank", "dtypes", "layout", "targets", "size",
                          "features", "modules", "tensors", "base_model", "violations"}
    assert first["violations"][0]["code"] == "LG105"
    assert set(first["violations"][0]) == {"code", "invariant", "message", "hint", "subject",
                                           "details", "location"}


def test_each_kind_of_unreadable_adapter_gets_the_fix_that_fits_it(tmp_path: pathlib.Path) -> None:
    typo = tmp_path / "typo"
    pickled = write_adapter(tmp_path / "old", defects=("pickle-bin",))
    escaping = write_adapter(tmp_path / "linked", defects=("symlink-escape",))
    report = lg.check_adapters([typo, pickled, escaping])
    assert [v.code for v in report.violations] == ["LG108"] * 3

    def hint(path: pathlib.Path) -> str:
        (violation,) = [v for v in report.violations if str(path) in v.message + v.subject]
        return violation.hint

    assert hint(typo).startswith("Check the path")
    assert hint(pickled).startswith("Convert a .bin adapter")
    assert hint(escaping).startswith("Keep the adapter's files")
