"""`--engine vllm==0.31.0`: every supported release of each engine, its own rules.

The adapters are made by PEFT itself, as a training job saves them; the verdicts per release
are the ones the real releases give (tests/engines/ runs them: docs/engines/compatibility.md).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap
from typing import Any

import pytest

import lora_guard as lg
from lora_guard._checking.engines import ENGINES, SPECS, EngineOptionError, profile
from lora_guard._frontends.cli import main

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

ROOT = pathlib.Path(__file__).resolve().parents[1]
TARGETS = ["q_proj", "k_proj", "v_proj"]
ALL_RELEASES = [r.label for releases in ENGINES.values() for r in releases]


def _save(root: pathlib.Path, name: str, *, seq_cls: bool = False, **lora: Any) -> pathlib.Path:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=128, num_labels=2)
    model_class = (transformers.LlamaForSequenceClassification if seq_cls
                   else transformers.LlamaForCausalLM)
    lora.setdefault("target_modules", TARGETS)
    lora.setdefault("r", 8)
    model = peft.get_peft_model(model_class(config), peft.LoraConfig(**lora))
    path = root / name
    model.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("release-adapters")
    return {
        "plain": _save(root, "plain"),
        "alpha-pattern": _save(root, "alpha-pattern", lora_alpha=16,
                               alpha_pattern={"v_proj": 32}),
        "rslora": _save(root, "rslora", use_rslora=True, lora_alpha=16),
        "lora-bias": _save(root, "lora-bias", lora_bias=True),
        "rank-pattern-32": _save(root, "rank-pattern-32", rank_pattern={"v_proj": 32}),
        "seq-cls": _save(root, "seq-cls", seq_cls=True, task_type="SEQ_CLS"),
        "plain-peft-0.14": _in_peft_0_14_form(_save(root, "plain-peft-0.14")),
    }


def _in_peft_0_14_form(path: pathlib.Path) -> pathlib.Path:
    """The config as PEFT 0.14 saves it (lmdeploy reads configs with its pinned peft 0.14,
    which refuses a newer PEFT's keys: LG202)."""
    from lora_guard._checking.engines.lmdeploy import PEFT_0_14_LORA_KEYS

    config = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps(
        {k: v for k, v in config.items() if k in PEFT_0_14_LORA_KEYS}))
    return path


def codes(path: pathlib.Path, engine: str, *flags: str) -> list[str]:
    return lg.check_adapters(path, lg.ServingLimits.for_engine(engine, *flags)).codes()


@pytest.mark.parametrize("label", ALL_RELEASES)
def test_every_supported_release_can_be_pinned_and_the_report_names_it(
        made: dict[str, pathlib.Path], label: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    plain = str(made["plain-peft-0.14" if label.startswith("lmdeploy") else "plain"])
    assert main(["check", plain, "--engine", label]) == 0
    assert f"checked for {label}" in capsys.readouterr().out
    assert main(["check", plain, "--engine", label, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["limits"]["engine"] == label


def test_sarif_and_github_reports_name_the_release(
        made: dict[str, pathlib.Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(made["lora-bias"]), "--engine", "vllm==0.31.0",
                 "--format", "sarif"]) == 1
    assert json.loads(capsys.readouterr().out)["runs"][0]["properties"] == {
        "engine": "vllm==0.31.0"}
    assert main(["check", str(made["lora-bias"]), "--engine", "vllm==0.33.0",
                 "--format", "github"]) == 1
    assert capsys.readouterr().out.startswith(
        "::notice title=lora-guard::checked for vllm==0.33.0\n")


def test_a_release_outside_the_range_is_refused_listing_the_range(
        made: dict[str, pathlib.Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(made["plain"]), "--engine", "vllm==0.28.0"]) == 2
    err = capsys.readouterr().err
    assert "vllm 0.28.0 is not a supported release; supported: 0.29.0 to 0.34.0" in err
    assert main(["check", str(made["plain"]), "--engine", "sglang==0.5.24"]) == 2
    assert "supported: 0.5.16 to 0.5.23" in capsys.readouterr().err
    # a prefix of a supported release is that release
    assert profile("vllm==0.31").label == "vllm==0.31.0"


INSTALLED = """
    import sys, warnings
    sys.path.insert(0, {site!r})
    from lora_guard._frontends.cli import main
    sys.exit(main(["check", {adapter!r}, "--engine", "vllm", "--format", "json"]))
"""


def _installed_vllm(tmp_path: pathlib.Path, version: str) -> pathlib.Path:
    """A site folder where vLLM ``version`` is installed (its package and dist-info), as
    pip leaves it: what `--engine vllm` reads without importing vLLM."""
    site = tmp_path / f"site-{version}"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    info = site / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return site


@pytest.mark.parametrize(("installed", "used", "warned"), [
    ("0.31.0", "vllm==0.31.0", False),
    ("0.35.1", "vllm==0.34.0", True),
    ("0.27.0", "vllm==0.29.0", True),
])
def test_plain_engine_is_the_installed_release_or_the_nearest_with_a_warning(
        made: dict[str, pathlib.Path], tmp_path: pathlib.Path, installed: str, used: str,
        warned: bool) -> None:
    code = textwrap.dedent(INSTALLED.format(site=str(_installed_vllm(tmp_path, installed)),
                                            adapter=str(made["plain"])))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["limits"]["engine"] == used
    assert (f"vllm {installed} is installed, outside the releases lora_guard supports "
            f"(0.29.0 to 0.34.0): checking with {used}" in done.stderr) is warned


def test_alpha_pattern_serves_at_its_strength_from_vllm_0_32_only(
        made: dict[str, pathlib.Path]) -> None:
    for release in ("vllm==0.29.0", "vllm==0.30.0", "vllm==0.31.0"):
        assert codes(made["alpha-pattern"], release) == ["LG112"], release
    for release in ("vllm==0.32.0", "vllm==0.33.0", "vllm==0.34.0"):
        assert codes(made["alpha-pattern"], release) == [], release
    assert codes(made["alpha-pattern"], "sglang==0.5.20", "--max-lora-rank", "16") == ["LG112"]


def test_the_lg112_fix_sends_the_user_to_a_vllm_release_that_honours_the_patterns(
        made: dict[str, pathlib.Path]) -> None:
    # The fix a user on vLLM 0.31 reads must not send them to their own release: before 0.32
    # vLLM scales every module by lora_alpha / r, as the verdicts above say.
    found = lg.check_adapters(made["alpha-pattern"],
                              lg.ServingLimits.for_engine("vllm==0.31.0")).violations
    assert [v.code for v in found] == ["LG112"]
    assert "vLLM 0.32 or newer, or PEFT, which honour them" in found[0].hint
    assert "vLLM before 0.32 scales every module by lora_alpha / r" in found[0].hint
    assert "serve it with vLLM or PEFT" not in lg.INVARIANTS["LG112"].explain()
    assert codes(made["alpha-pattern"], "vllm==0.32.0") == []   # the release the fix names


def test_rslora_is_honoured_by_every_vllm_release_but_not_by_sglang(
        made: dict[str, pathlib.Path]) -> None:
    for release in SPECS["vllm"].releases:
        assert codes(made["rslora"], f"vllm=={release}") == [], release
    assert codes(made["rslora"], "sglang==0.5.16", "--max-lora-rank", "16") == ["LG112"]


def test_rank_pattern_above_the_max_rank_is_refused_on_every_vllm_release(
        made: dict[str, pathlib.Path]) -> None:
    # 0.32+ at validate_legal; before, when set_lora copies the weights: refused either way
    for release in SPECS["vllm"].releases:
        # and before 0.32, the one scaling lora_alpha / r is not v_proj's lora_alpha / 32
        expected = ["LG101"] if release >= "0.32.0" else ["LG101", "LG112"]
        assert codes(made["rank-pattern-32"], f"vllm=={release}") == expected, release
        rule = next(r for r in profile("vllm", release).rules if r.code == "LG101")
        assert ("set_lora" in rule.source) is (release < "0.32.0"), release


def test_lora_bias_is_refused_everywhere_and_vllm_says_so_itself_from_0_32(
        made: dict[str, pathlib.Path]) -> None:
    for release in SPECS["vllm"].releases:
        assert codes(made["lora-bias"], f"vllm=={release}") == ["LG105"], release
        rule = next(r for r in profile("vllm", release).rules
                    if r.code == "LG105" and "lora_bias" in r.text)
        assert rule.engine_refuses is (release >= "0.32.0"), release


def test_a_classification_head_serves_on_a_pooling_model_from_vllm_0_31(
        made: dict[str, pathlib.Path]) -> None:
    pooling = ("--runner", "pooling")
    for release in ("vllm==0.29.0", "vllm==0.30.0"):
        assert codes(made["seq-cls"], release, *pooling) == ["LG105"], release
    for release in ("vllm==0.31.0", "vllm==0.32.0", "vllm==0.33.0", "vllm==0.34.0"):
        assert codes(made["seq-cls"], release, *pooling) == [], release
        assert codes(made["seq-cls"], release, "--convert", "classify") == [], release
    # --convert embed makes an embedding model: no classification head to load into
    base = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "vocab_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "intermediate_size": 128}
    limits = lg.ServingLimits.for_engine("vllm==0.33.0", "--convert", "embed",
                                         base_config=base)
    assert lg.check_adapters(made["seq-cls"], limits).codes() == ["LG105"]


def test_every_rule_and_flag_is_bounded_by_supported_releases() -> None:
    for spec in SPECS.values():
        known = set(spec.releases)
        bounds = [(r.since, r.until) for r in spec.rules] + [(f.since, f.until)
                                                             for f in spec.flags]
        for since, until in bounds:
            assert since is None or since in known, (spec.name, since)
            assert until is None or until in known, (spec.name, until)
        for version in spec.releases:
            assert spec.at(version).rules, (spec.name, version)


def test_an_engine_name_or_release_that_is_not_one_says_what_is() -> None:
    with pytest.raises(EngineOptionError, match="engine 'vllm==0.31.0' and version='0.33.0'"):
        profile("vllm==0.31.0", "0.33.0")


def test_the_engine_pages_show_the_profiles() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "engine_tables.py"), "--check"],
                          capture_output=True, text=True, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
