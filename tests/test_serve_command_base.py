"""A pasted serve command whose MODEL is a Hub model id (``vllm serve meta-llama/...``).

The base-model check reads that model's config.json through huggingface_hub, the local cache
first; with ``HF_HUB_OFFLINE`` only the cache. Where it cannot be had, every format of the
report says the base-model check was skipped and why: never a silent "all pass". The Hub here
is a cache folder built as ``hf download`` leaves it (``HF_HUB_CACHE``), and an endpoint on the
loopback that refuses connections: no test reaches the network, none downloads weights.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import socket
import sys
from typing import Any

import pytest

from lora_guard._frontends.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "adapters"
MODEL = "meta-llama/Llama-3.1-8B"


def _cache_model(cache: pathlib.Path, model: str, config: dict[str, Any]) -> pathlib.Path:
    """``model``'s config.json in a Hugging Face cache, laid out as huggingface_hub writes it."""
    repo = cache / f"models--{model.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    return snapshot / "config.json"


def _base() -> dict[str, Any]:
    config: dict[str, Any] = json.loads((EXAMPLES / "base" / "config.json").read_text())
    return config


@pytest.fixture
def hub(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """An empty Hugging Face cache, offline: what a laptop without the model sees."""
    pytest.importorskip("huggingface_hub")
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def serve(*extra: str, model: str = MODEL) -> list[str]:
    adapter = EXAMPLES / "good" / "math"
    return ["check", "--isolated", "--no-progress", *extra, "--", "vllm", "serve", model,
            "--enable-lora", "--lora-modules", f"math={adapter}"]


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_a_cached_hub_config_is_the_base_the_adapters_are_checked_against(
        hub: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    cached = _cache_model(hub, MODEL, _base())
    code, out, _ = run(capsys, serve("--format", "json"))
    report = json.loads(out)
    assert code == 0 and report["limits"]["base_config"] == str(cached)
    assert "skipped" not in report
    # the same adapter, pasted against a Hub model of another width: the base check runs
    _cache_model(hub, "org/wide-model", {**_base(), "hidden_size": 128, "head_dim": 32})
    code, out, _ = run(capsys, serve(model="org/wide-model"))
    assert code == 1 and "LG109 base-model-mismatch" in out, out


def test_offline_and_not_cached_every_format_says_the_base_check_was_skipped(
        hub: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, serve())
    assert code == 0
    assert "1 adapter checked: all pass.\nskipped: the base-model check was skipped: " \
           f"config.json of Hub model {MODEL!r} is not in the local cache ({hub}) and " \
           "HF_HUB_OFFLINE is set; pass --base-config" in out
    code, out, _ = run(capsys, serve("--quiet"))
    assert "skipped: the base-model check was skipped" in out
    code, out, _ = run(capsys, serve("--format", "json"))
    (note,) = json.loads(out)["skipped"]
    assert note.startswith("the base-model check was skipped:") and "HF_HUB_OFFLINE" in note
    code, out, _ = run(capsys, serve("--format", "github"))
    assert any(line.startswith("::warning title=lora-guard skipped a check::the base-model "
                               "check") for line in out.splitlines()), out
    code, out, _ = run(capsys, serve("--format", "sarif"))
    (invocation,) = json.loads(out)["runs"][0]["invocations"]
    assert invocation["toolExecutionNotifications"][0]["message"]["text"] == note
    code, out, err = run(capsys, serve("--format", "json", "--statistics"))
    assert json.loads(out) == [] and "the base-model check was skipped" in err
    assert list(hub.iterdir()) == []  # nothing fetched


def test_online_but_the_hub_unreachable_says_why_and_fetches_no_weights(
        hub: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as probe:  # a loopback port with nothing listening on it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "2")
    code, out, _ = run(capsys, serve("--format", "json"))
    (note,) = json.loads(out)["skipped"]
    assert code == 0 and f"config.json of Hub model {MODEL!r} could not be read" in note
    assert not list(hub.rglob("*.safetensors"))


def test_without_huggingface_hub_the_note_names_the_extra(
        hub: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # `pip install .` alone
    code, out, _ = run(capsys, serve())
    assert code == 0 and "needs huggingface_hub (pip install 'lora-guard[remote]')" in out


def test_a_model_folder_without_a_config_says_so(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "model").mkdir()
    code, out, _ = run(capsys, serve("--format", "json", model=str(tmp_path / "model")))
    (note,) = json.loads(out)["skipped"]
    assert code == 0 and "has no config.json" in note


def test_the_base_check_is_not_skipped_when_base_config_is_given(
        hub: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = hub.parent / "base.json"
    shutil.copy(EXAMPLES / "base" / "config.json", base)
    code, out, _ = run(capsys, serve("--format", "json", "--base-config", str(base)))
    assert code == 0 and "skipped" not in json.loads(out)
