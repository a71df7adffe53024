"""The checker's own machinery: duplicate keys whatever the strings hold, ServingLimits takes
what users pass (and their mypy accepts it), the JSON report is the text json.dumps writes,
found folders are the paths pathlib spells. (A bug in a check, LG900, is in
tests/test_lg900_internal_error.py.)"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

import lora_guard as lg
from lora_guard._checking import discovery
from lora_guard._checking.report import _indented
from lora_guard._testing.adapter_writer import write_adapter


def test_duplicate_keys_are_found_whatever_the_colons_in_strings(tmp_path: pathlib.Path) -> None:
    """Duplicates are found by counting keys against colons; a colon inside a string must
    neither hide a duplicate nor invent one."""
    folder = write_adapter(tmp_path / "a")
    config = (folder / "adapter_config.json").read_text()
    with_colon = config.replace('"tiny-llama"', '"hf://org/tiny:llama"')
    (folder / "adapter_config.json").write_text(with_colon)
    assert lg.check_adapters(folder).ok
    doubled = with_colon.replace('"r": 8', '"r": 8, "r": 8', 1)
    assert doubled != with_colon
    (folder / "adapter_config.json").write_text(doubled)
    with pytest.raises(lg.AdapterError, match="duplicate key 'r'"):
        lg.inspect_adapter(folder)


def test_serving_limits_take_tuples_lists_and_sets_and_keep_frozensets() -> None:
    limits = lg.ServingLimits(target_modules=("q_proj", "v_proj"), allowed_ranks=[8, 16],
                              dtypes=["bf16"], allow={"dora"})
    assert limits.target_modules == frozenset({"q_proj", "v_proj"})
    assert limits.allowed_ranks == frozenset({8, 16})
    assert limits.dtypes == frozenset({"bfloat16"}) and limits.allow == frozenset({"dora"})
    assert isinstance(limits.allowed_ranks, frozenset)


def test_users_mypy_passes_on_tuples_and_lists(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("mypy")
    source = tmp_path / "user.py"
    source.write_text(textwrap.dedent("""
        import lora_guard as lg

        limits = lg.ServingLimits(target_modules=("q_proj", "v_proj"), allowed_ranks=[8, 16],
                                  dtypes=["bfloat16"], allow=("dora",), served_heads=["score"])
        ranks: list[int] = sorted(limits.allowed_ranks or ())
    """))
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         "--cache-dir", os.devnull, str(source)],
        capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(pathlib.Path(lg.__file__).parents[1])},
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_json_report_is_built_per_adapter_and_is_the_same_text(
    tmp_path: pathlib.Path,
) -> None:
    import json

    write_adapter(tmp_path / "set" / "big", rank=64)
    write_adapter(tmp_path / "set" / "old", defects=("pickle-bin",))
    write_adapter(tmp_path / "set" / "ok")
    report = lg.check_adapters(tmp_path / "set", lg.ServingLimits(max_rank=16, max_loras=2))
    assert report.to_json() == json.dumps(report.to_dict(), indent=2)
    assert json.loads(report.to_json())["summary"] == {
        "adapters": 3, "failed": 2, "violations": 3,
        "by_code": {"LG101": 1, "LG108": 1, "LG110": 1}}
    empty = lg.check_adapters([])
    assert empty.to_json() == json.dumps(empty.to_dict(), indent=2)


def test_the_json_report_spells_odd_values_as_json_dumps_does(tmp_path: pathlib.Path) -> None:
    """The report's JSON is written by its own encoder: names with quotes, backslashes,
    newlines and non-ASCII, empty lists and nested details come out as `json.dumps` writes
    them."""
    import json

    odd = tmp_path / 'set "q"\\x\ny é 中'
    write_adapter(odd / "big\tone", rank=64, targets=("q_proj", "embed_tokens"))
    for defect in ("orphan-a", "empty-tensor", "mixed-dtype"):
        write_adapter(odd / defect, defects=(defect,))
    write_adapter(odd / "broken", defects=("invalid-header-json",))
    report = lg.check_adapters([odd, tmp_path / "missing"], lg.ServingLimits(
        max_rank=16, dtypes=("bfloat16",), max_loras=1, target_modules=("v_proj",)))
    assert {"LG101", "LG103", "LG104", "LG106", "LG107", "LG108", "LG110"} <= set(
        report.codes())
    assert report.to_json() == json.dumps(report.to_dict(), indent=2)
    assert "\\u4e2d" in report.to_json()  # ensure_ascii, as json.dumps
    assert _indented({"f": [1.5, float("nan"), -float("inf"), True, None, {}, []],
                              3: (), "k": {"x": "\u00e9\n"}}, "\n") == json.dumps(
        {"f": [1.5, float("nan"), -float("inf"), True, None, {}, []], 3: (),
         "k": {"x": "\u00e9\n"}}, indent=2)


def test_found_folders_are_the_paths_pathlib_spells(tmp_path: pathlib.Path) -> None:
    """A found folder's path is built on its parent's: the same path as ``pathlib`` spells."""
    found = [str(tmp_path / "a"), str(tmp_path / "a b"), "rel/x", "x", str(tmp_path)]
    assert [discovery.folder_path(f) for f in found] == [pathlib.Path(f) for f in found]
    assert all(str(discovery.folder_path(f)) == str(pathlib.Path(f)) for f in found)
