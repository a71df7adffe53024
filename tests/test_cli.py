"""The lora-guard command: what an operator sees, and its exit status."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import lora_guard as lg
from lora_guard._frontends.cli import _Progress, main
from lora_guard._testing.adapter_writer import write_adapter

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples" / "adapters"
BASE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}


@pytest.fixture
def adapters(tmp_path: pathlib.Path) -> pathlib.Path:
    write_adapter(tmp_path / "set" / "math", rank=8)
    write_adapter(tmp_path / "set" / "code", rank=16, dtype="bfloat16",
                  targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    (tmp_path / "base.json").write_text(json.dumps(BASE))
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_passing_set_exits_0_with_a_table(
    adapters: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "check", str(adapters / "set"),
                         "--base-config", str(adapters / "base.json"), "--max-rank", "16")
    assert code == 0 and err == ""
    header, *rows = out.splitlines()[:3]
    assert header.split() == ["ADAPTER", "RANK", "DTYPE", "LAYOUT", "TARGETS", "SIZE", "RESULT"]
    assert rows[0].split()[1:4] == ["16", "bfloat16", "dense"]
    assert rows[0].split()[-1] == "ok" and rows[0].split()[0].endswith("code")
    assert "2 adapters checked: all pass." in out


def test_violations_exit_1_grouped_by_adapter_with_hints(
    adapters: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_adapter(adapters / "set" / "dora", defects=("dora",))
    code, out, _ = run(capsys, "check", str(adapters / "set"), "--max-rank", "8",
                       "--max-loras", "2")
    assert code == 1
    assert "3 adapters checked: 2 failed, 3 violations." in out
    section = out.split(str(adapters / "set" / "code") + "\n", 1)[1]
    assert section.startswith("  LG101 rank-exceeds-limit: rank 16 of ")
    assert "    fix: Start the server with a max rank" in section
    assert "adapter set\n  LG110 too-many-adapters: 3 adapters, but the server has 2 slots." in out
    assert "lora-guard explain LG101" in out


def test_options_reach_the_limits(adapters: pathlib.Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    write_adapter(adapters / "set" / "dora", defects=("dora",))
    code, out, _ = run(capsys, "check", str(adapters / "set"), "--allow", "dora",
                       "--dtypes", "float16", "--target-modules", "q_proj,v_proj",
                       "--allowed-ranks", "8")
    assert code == 1
    codes = [line.split()[0] for line in out.splitlines() if line.startswith("  LG")]
    assert codes == ["LG104", "LG104", "LG101", "LG106"]  # all about 'code'; dora allowed


def test_json_output_is_the_documented_schema(
    adapters: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_adapter(adapters / "set" / "old", defects=("pickle-bin",))
    code, out, err = run(capsys, "check", str(adapters / "set"), "--format", "json")
    assert code == 1 and err == ""
    data = json.loads(out)
    assert data["schema_version"] == 1
    assert data["summary"] == {"adapters": 3, "failed": 1, "violations": 1,
                               "by_code": {"LG108": 1}}
    old = next(a for a in data["adapters"] if a["id"].endswith("old"))
    assert old["readable"] is False and old["rank"] is None
    assert old["violations"][0]["details"]["file"] == "adapter_model.bin"


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["check"], "no adapters to check: give PATHs"),
        (["check", ".", "--max-rank", "x"], "'x' is not a whole number"),
        (["check", ".", "--max-rank", "0"], "must be at least 1"),
        (["check", ".", "--format", "yaml"], "invalid choice"),
        (["check", ".", "--allow", "magic"], "unknown feature(s) ['magic']"),
        (["check", ".", "--dtypes", "float13"], "unknown dtype 'float13'"),
        (["check", ".", "--base-config", "/no/such.json"], "--base-config: cannot read base"),
        (["frobnicate"], "invalid choice"),
        ([], "required"),
    ],
)
def test_usage_errors_exit_2_with_a_message(
    capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert words in err
    assert "Traceback" not in err


def test_an_invalid_base_config_is_a_usage_error(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.json").write_text("{not json")
    code, _, err = run(capsys, "check", str(tmp_path), "--base-config",
                       str(tmp_path / "config.json"))
    assert code == 2 and "is not valid JSON" in err
    assert err.startswith("lora-guard: error: --base-config: base config ")


@pytest.mark.parametrize("name", [
    "evil\x1b]0;pwned\x07\x1b[2J",  # an OSC title and a clear-screen sequence
    "re\u202egnp.safe",  # a right-to-left override: the name reads as another
    "two\nlines",  # a newline: a forged line in the report
])
def test_names_with_terminal_control_characters_are_printed_escaped(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    # an adapter folder named by whoever uploaded it (a folder, an S3 key, a Hub path)
    write_adapter(tmp_path / name, rank=64)
    for argv in ([], ["--quiet"], ["--statistics"], ["--format", "github"]):
        code, out, err = run(capsys, "check", str(tmp_path / name), "--max-rank", "16", *argv)
        assert code == 1, err
        for raw in ("\x1b", "\x07", "\u202e"):
            assert raw not in out, (argv, out)
        assert "two\nlines" not in out, argv
    code, out, _ = run(capsys, "check", str(tmp_path / name), "--max-rank", "16")
    heading = next(line for line in out.splitlines() if line.startswith(str(tmp_path)) and
                   "RANK" not in line and "  " not in line)  # the heading of its violations
    assert heading == str(tmp_path) + "/" + name.encode("unicode_escape").decode()
    code, _, err = run(capsys, "check", str(tmp_path / (name + "-gone")))
    assert code == 2 and "\x1b" not in err and "\u202e" not in err


def test_a_missing_path_is_a_usage_error_exit_2(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "check", str(tmp_path / "nope"))
    assert code == 2 and out == ""
    assert f"no such file or folder: {tmp_path / 'nope'}" in err and "Traceback" not in err


def test_explain_prints_the_catalogue_entry(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "explain", "lg101", "--markdown")
    assert code == 0 and out == lg.INVARIANTS["LG101"].explain()
    code, out, _ = run(capsys, "explain", "orphan-weight")
    assert code == 0 and out.startswith("LG103 orphan-weight")


def test_explain_an_unknown_code_lists_the_codes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "explain", "LG999")
    assert code == 2 and out == ""
    assert "unknown code 'LG999'" in err and "LG001" in err and "LG110" in err


def test_codes_lists_every_code(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "codes")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["CODE", "SLUG", "TITLE"]
    assert [line.split()[0] for line in lines[1:]] == list(lg.INVARIANTS)
    assert "LG107  empty-tensor" in out


def test_progress_bar_only_on_a_terminal(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(3):
        write_adapter(tmp_path / f"a{i}")
    code, _, err = run(capsys, "check", str(tmp_path))
    assert code == 0 and err == ""  # captured stderr is not a TTY

    class Terminal:
        def __init__(self) -> None:
            self.text = ""

        def write(self, text: str) -> None:
            self.text += text

        def flush(self) -> None:
            pass

    terminal = Terminal()
    bar = _Progress(terminal)  # type: ignore[arg-type]
    for done in range(1, 101):
        bar(done, 100)
    bar.close()
    assert "100/100" in terminal.text and terminal.text.endswith("\r\033[K")
    quiet = Terminal()
    small = _Progress(quiet)  # type: ignore[arg-type]
    small(1, 3)
    small.close()
    assert quiet.text == ""


def test_examples_good_set_passes_and_bad_set_shows_each_problem(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = str(EXAMPLES / "base" / "config.json")
    code, out, _ = run(capsys, "check", str(EXAMPLES / "good"), "--base-config", base)
    assert code == 0, out
    code, out, _ = run(capsys, "check", str(EXAMPLES / "bad"), "--base-config", base,
                       "--max-rank", "16")
    assert code == 1
    for expected in ("LG101", "LG102", "LG103", "LG104", "LG105", "LG106", "LG107", "LG108",
                     "LG109"):
        assert f"  {expected} " in out, expected


def test_installed_command_never_shows_a_traceback(tmp_path: pathlib.Path) -> None:
    exe = shutil.which("lora-guard") or ""
    argv = [exe] if exe else [sys.executable, "-m", "lora_guard._frontends.cli"]
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "adapter_config.json").write_bytes(os.urandom(64))
    (garbage / "adapter_model.safetensors").write_bytes(os.urandom(64))
    done = subprocess.run([*argv, "check", str(garbage)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    assert "LG108" in done.stdout
