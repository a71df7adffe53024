"""Remote adapters: checked where they live (S3, HTTP, the Hub) from a few kB of ranged reads.

Every store is a real server on the loopback that the real client talks to: moto's S3 API for
botocore's signed requests, an HTTP server with ranges, and a stand-in of the Hub's tree and
resolve endpoints for huggingface_hub's headers and error mapping (every request sent by
lora_guard's bounded client, `lora_guard._reading.fetch`). Any connection to another host
fails the test.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import socket
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import lora_guard as lg
from conftest_adapters import peft_adapter
from lora_guard._frontends.cli import main
from lora_guard._testing.adapter_writer import write_adapter
from remote_servers import S3_ENV, FileServer, S3Server, self_signed

pytest.importorskip("botocore")
pytest.importorskip("moto")
pytest.importorskip("huggingface_hub")

BIG: dict[str, Any] = {"rank": 64, "hidden_size": 4096, "intermediate_size": 11008, "layers": 32,
       "targets": ("q_proj", "k_proj", "v_proj", "o_proj")}  # 117 MB, sparse on disk


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any connection that leaves 127.0.0.1: no test reaches the real Hub or AWS."""
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def check(address: Any) -> None:
        if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            raise AssertionError(f"a test tried to connect to {address}")

    def connect(self: socket.socket, address: Any) -> None:
        check(address)
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        check(address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setenv("LORA_GUARD_REMOTE_BACKOFF", "0.01")
    monkeypatch.setenv("LORA_GUARD_REMOTE_TIMEOUT", "10")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")  # never AWS by accident
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """loras/{chat (real PEFT), math (r=8), code (r=64)}, new/math (r=8), big/huge (117 MB)."""
    root = tmp_path_factory.mktemp("remote")
    peft_adapter(root / "loras" / "chat", r=8, target_modules=["q_proj", "v_proj"])
    write_adapter(root / "loras" / "math", rank=8)
    write_adapter(root / "loras" / "code", rank=64)
    write_adapter(root / "new" / "math", rank=8)  # a redirect's target, outside the listings
    write_adapter(root / "big" / "huge", **BIG)
    return root


@pytest.fixture(scope="module")
def s3_server(adapters: pathlib.Path) -> Iterator[S3Server]:
    with pytest.MonkeyPatch.context() as mp:
        for key, value in S3_ENV.items():
            mp.setenv(key, value)
        with S3Server() as server:
            server.upload("bkt", "loras", adapters / "loras")
            server.upload("bkt", "big", adapters / "big")
            yield server


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.url)
    s3_server.log.clear()
    s3_server.faults.clear()
    return s3_server


@pytest.fixture
def http(adapters: pathlib.Path) -> Iterator[FileServer]:
    with FileServer(adapters) as server:
        yield server


@pytest.fixture
def hub(adapters: pathlib.Path, tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[FileServer]:
    """Repos org/loras (main, v1) with adapters in subfolders, org/huge, private org/secret."""
    import huggingface_hub.constants as constants

    for rev in ("main", "v1"):
        shutil.copytree(adapters / "loras", tmp_path / "org" / "loras" / rev / "adapters")
    shutil.copytree(adapters / "big" / "huge", tmp_path / "org" / "huge" / "main")
    shutil.copytree(adapters / "loras" / "math", tmp_path / "org" / "secret" / "main")
    with FileServer(tmp_path, hub=True) as server:
        server.private.add("org/secret")
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setattr(constants, "ENDPOINT", server.url)  # the library's own calls too
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            server.url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "no-token"))
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
        yield server


def _lg140(report: lg.Report, adapter_id: str) -> str:
    (violation,) = report.by_adapter[adapter_id]
    assert violation.code == "LG140", violation
    return violation.message


# --- S3 ------------------------------------------------------------------------------------


def test_an_s3_prefix_is_listed_and_each_adapter_checked_from_its_header(s3: S3Server) -> None:
    report = lg.check_adapters(["s3://bkt/loras/"], lg.ServingLimits(max_rank=16))
    assert list(report.ids) == ["s3://bkt/loras/chat", "s3://bkt/loras/code",
                                "s3://bkt/loras/math"]
    assert report.codes() == ["LG101"] and "s3://bkt/loras/code" in report.by_adapter
    chat = report.spec("s3://bkt/loras/chat")
    assert chat is not None and chat.name == "chat" and chat.rank == 8
    assert chat.target_modules == ("q_proj", "v_proj") and chat.url == "s3://bkt/loras/chat"
    reads = [r for r in s3.log.requests if r.path.endswith(".safetensors")]
    assert len(reads) == 6 and all(r.range for r in reads)  # 8 bytes, then the header
    assert sorted(r.range for r in reads  # type: ignore[type-var]
                  if r.range.endswith("-7")) == ["bytes=0-7"] * 3  # type: ignore[union-attr]


def test_a_100_mb_adapter_on_s3_costs_a_few_kb(s3: S3Server, adapters: pathlib.Path) -> None:
    spec = lg.inspect_adapter("s3://bkt/big/huge")
    local = lg.inspect_adapter(adapters / "big" / "huge")
    assert spec.size == local.size > 100_000_000
    assert dict(spec.modules) == dict(local.modules)
    sent = s3.log.sent_for("/bkt/big/huge/")
    assert spec.transferred == sent < 40_000  # the config and the header, no tensor data
    weights = s3.log.for_path("huge/adapter_model.safetensors")
    assert weights[0].range == "bytes=0-7" and len(weights) == 2
    assert weights[1].range == f"bytes=8-{7 + weights[1].sent}"  # exactly the header


def test_s3_denied_missing_and_throttled_objects_are_per_adapter_violations(
        s3: S3Server) -> None:
    s3.faults["/bkt/loras/math/adapter_config.json"] = [(403, "AccessDenied")]
    s3.faults["/bkt/loras/chat/adapter_model.safetensors"] = [(503, "SlowDown")] * 2
    report = lg.check_adapters(["s3://bkt/loras/", "s3://bkt/missing/", "s3://nobucket/x"])
    assert "access denied" in _lg140(report, "s3://bkt/loras/math")
    assert "no adapter found" in _lg140(report, "s3://bkt/missing/")
    assert "not found" in _lg140(report, "s3://nobucket/x")
    assert report.spec("s3://bkt/loras/chat") is not None  # SlowDown twice, then retried
    assert report.spec("s3://bkt/loras/code") is not None  # the rest of the run went on
    hint = report.by_adapter["s3://bkt/loras/math"][0].hint
    assert "AWS_PROFILE" in hint and "HF_TOKEN" in hint


def test_s3_throttling_that_outlasts_the_retries_is_reported_not_raised(
        s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LORA_GUARD_REMOTE_RETRIES", "1")
    s3.faults["/bkt/loras/math/adapter_model.safetensors"] = [(503, "SlowDown")] * 5
    report = lg.check_adapters("s3://bkt/loras/math")
    assert "after retries" in _lg140(report, "s3://bkt/loras/math")


def test_an_oversized_header_on_s3_is_refused_before_it_is_read(
        s3: S3Server, tmp_path: pathlib.Path) -> None:
    bomb = write_adapter(tmp_path / "bomb")
    weights = bomb / "adapter_model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[:8] = (200_000_000).to_bytes(8, "little")  # announces a 200 MB header
    weights.write_bytes(bytes(raw))
    s3.upload("bkt", "hostile/bomb", bomb)
    s3.log.clear()
    report = lg.check_adapters("s3://bkt/hostile/bomb")
    (violation,) = report.violations
    assert violation.code == "LG108" and "cap" in violation.message
    assert [r.range for r in s3.log.for_path("bomb/adapter_model.safetensors")] == ["bytes=0-7"]


def test_an_oversized_config_on_s3_is_refused_by_its_listed_size_unread(
        s3: S3Server, tmp_path: pathlib.Path) -> None:
    padded = write_adapter(tmp_path / "padded")
    config = json.loads((padded / "adapter_config.json").read_text())
    config["notes"] = "x" * 10_000_001  # a config past the 10 MB cap
    (padded / "adapter_config.json").write_text(json.dumps(config))
    s3.upload("bkt", "hostile/padded", padded)
    s3.log.clear()
    report = lg.check_adapters("s3://bkt/hostile/padded")
    (violation,) = report.violations
    assert violation.code == "LG108" and "larger than 10000000 bytes" in violation.message
    assert not s3.log.for_path("padded/adapter_config.json")  # listed, never read


def test_added_tokens_json_on_s3_is_read_as_locally(s3: S3Server, tmp_path: pathlib.Path,
                                                  ) -> None:
    adapter = write_adapter(tmp_path / "sql")
    (adapter / "added_tokens.json").write_text('{"<sql>": 128, "</sql>": 129}')
    s3.upload("bkt", "tokens/sql", adapter)
    spec = lg.inspect_adapter("s3://bkt/tokens/sql")
    assert spec.features["added_tokens"] == {"<sql>": 128, "</sql>": 129}
    base = {"model_type": "llama", "vocab_size": 128, "hidden_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "intermediate_size": 128}
    report = lg.check_adapters("s3://bkt/tokens/sql", lg.ServingLimits.for_engine(
        "sglang", base_config=base))
    assert report.codes() == ["LG105"]
    assert "added_tokens.json adds 2" in report.violations[0].message
    assert lg.check_adapters("s3://bkt/tokens/sql", lg.ServingLimits.for_engine(
        "peft", base_config=base)).ok


def test_s3_from_the_cli_prints_the_bytes_transferred_per_adapter(
        s3: S3Server, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "s3://bkt/loras/", "s3://bkt/big/huge", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    moved = {a["id"]: a["transferred"] for a in out["adapters"]}
    assert set(moved) == {"s3://bkt/loras/chat", "s3://bkt/loras/code", "s3://bkt/loras/math",
                          "s3://bkt/big/huge"}
    assert all(0 < n < 40_000 for n in moved.values())
    assert main(["check", "s3://bkt/loras/", "s3://bkt/nothing-here"]) == 1
    assert "LG140" in capsys.readouterr().out
    assert main(["check", "s3://bkt/big/huge", "s3://bkt/loras/math", "--statistics"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["TRANSFERRED", "SIZE", "REMOTE", "ADAPTER"]
    assert lines[1].endswith("s3://bkt/big/huge") and " kB  117.5 MB " in lines[1]
    assert lines[-1].startswith("2 remote adapters: ") and "transferred for 117.5 MB held" in (
        lines[-1])


# --- HTTP(S) -------------------------------------------------------------------------------


def test_an_http_adapter_is_read_with_two_ranges_of_its_weights(http: FileServer) -> None:
    spec = lg.inspect_adapter(f"{http.url}/big/huge/")
    assert spec.size > 100_000_000 and spec.transferred is not None
    assert spec.transferred == http.log.sent_for("/big/huge/") < 40_000
    ranges = [r.range for r in http.log.for_path("adapter_model.safetensors")]
    assert ranges[0] == "bytes=0-7" and len(ranges) == 2


def test_http_errors_are_one_adapters_violation_each(http: FileServer) -> None:
    http.faults["/loras/math/adapter_config.json"] = [403]
    http.faults["/loras/code/adapter_config.json"] = [503, 429]  # retried, then served
    http.redirects["/loras/away/adapter_config.json"] = "http://example.invalid/x"
    # Same host: followed. Its own target, so the checker's concurrent reads of loras/math
    # and loras/moved cannot race for math's one 403.
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        http.redirects[f"/loras/moved/{name}"] = f"{http.url}/new/math/{name}"
    http.cut_after[str(http.root / "loras" / "chat" / "adapter_model.safetensors")] = 100
    u = http.url
    report = lg.check_adapters([f"{u}/loras/math", f"{u}/loras/code", f"{u}/loras/away",
                                f"{u}/nowhere", f"{u}/loras/chat", f"{u}/loras/moved"])
    assert "access denied (HTTP 403)" in _lg140(report, f"{u}/loras/math")
    assert report.spec(f"{u}/loras/code") is not None
    assert "another host" in _lg140(report, f"{u}/loras/away")
    moved = report.spec(f"{u}/loras/moved")
    assert moved is not None and moved.rank == 8
    assert "not found (HTTP 404)" in _lg140(report, f"{u}/nowhere")
    assert "cut short" in _lg140(report, f"{u}/loras/chat")
    assert report.by_adapter[f"{u}/loras/chat"][0].hint.startswith("Run the check again")


def test_a_server_that_ignores_ranges_is_read_no_further_than_asked(http: FileServer) -> None:
    http.ignore_range.add(str(http.root / "big" / "huge" / "adapter_model.safetensors"))
    spec = lg.inspect_adapter(f"{http.url}/big/huge")
    assert spec.transferred is not None and spec.transferred < 40_000
    assert spec.size > 100_000_000


@pytest.fixture
def https(adapters: pathlib.Path, tmp_path: pathlib.Path,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[FileServer]:
    """The adapters over HTTPS, with a certificate the client trusts as a company CA is
    trusted: through ``REQUESTS_CA_BUNDLE``."""
    cert, key = self_signed(tmp_path)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))
    with FileServer(adapters, tls=(cert, key)) as server:
        yield server


def test_an_https_adapter_is_read_from_its_header_over_tls(https: FileServer,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    assert https.url.startswith("https://127.0.0.1:")
    spec = lg.inspect_adapter(f"{https.url}/big/huge")
    assert spec.size > 100_000_000 and spec.transferred is not None
    assert spec.transferred == https.log.sent_for("/big/huge/") < 40_000
    report = lg.check_adapters(f"{https.url}/loras/", lg.ServingLimits(max_rank=16))
    # No listing over HTTP: the URL of a folder of adapters names no adapter itself.
    assert "not found (HTTP 404)" in _lg140(report, f"{https.url}/loras/")
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")  # a certificate nobody vouches for
    monkeypatch.setenv("LORA_GUARD_REMOTE_RETRIES", "0")
    report = lg.check_adapters(f"{https.url}/loras/math")
    assert "SSLError" in _lg140(report, f"{https.url}/loras/math")


def test_remote_reads_are_bounded_by_the_worker_setting(
        http: FileServer, monkeypatch: pytest.MonkeyPatch) -> None:
    folders = ["loras/chat", "loras/code", "loras/math", "new/math", "big/huge"]
    for folder in folders:  # each reply waits, so the reads of the set overlap
        http.stall[f"/{folder}/adapter_config.json"] = 0.3
    urls = [f"{http.url}/{folder}" for folder in folders]
    monkeypatch.setenv("LORA_GUARD_REMOTE_WORKERS", "2")
    report = lg.check_adapters(urls)
    assert all(report.spec(url) is not None for url in urls)
    assert http.max_in_flight == 2
    http.max_in_flight = 0
    monkeypatch.setenv("LORA_GUARD_REMOTE_WORKERS", "16")
    assert lg.check_adapters(urls).ok
    assert http.max_in_flight > 2  # the same set, read wider when allowed


def test_progress_counts_remote_adapters_as_they_complete(http: FileServer) -> None:
    urls = [f"{http.url}/{folder}" for folder in ("loras/chat", "loras/code", "nowhere")]
    seen: list[tuple[int, int]] = []
    report = lg.check_adapters(urls, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 3), (2, 3), (3, 3)]  # a failed read counts as done too
    assert report.codes() == ["LG140"]


def test_a_hung_server_is_one_adapters_timeout_not_a_hung_check(
        http: FileServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LORA_GUARD_REMOTE_TIMEOUT", "0.3")
    monkeypatch.setenv("LORA_GUARD_REMOTE_RETRIES", "1")
    http.stall["/loras/math/adapter_config.json"] = 5  # never answers within the timeout
    report = lg.check_adapters([f"{http.url}/loras/math", f"{http.url}/loras/code"])
    message = _lg140(report, f"{http.url}/loras/math")
    assert "after retries" in message and "timed out; LORA_GUARD_REMOTE_TIMEOUT" in message
    assert report.spec(f"{http.url}/loras/code") is not None
    assert len(http.log.for_path("/loras/math/adapter_config.json")) == 2  # tried, retried


def test_a_retry_after_past_its_cap_is_waited_for_the_cap_only(
        http: FileServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server asking for a billion seconds gets the cap (60 s; 0.2 s here), then the read is
    retried and served; where the cap itself passes the deadline, the read ends at once."""
    from lora_guard._reading import fetch

    monkeypatch.setattr(fetch, "MAX_RETRY_AFTER", 0.2)
    http.faults["/loras/math/adapter_config.json"] = [429]  # with Retry-After: 1000000000
    http.retry_after = "1000000000"
    assert lg.check_adapters(f"{http.url}/loras/math").ok
    assert len(http.log.for_path("/loras/math/adapter_config.json")) == 2
    monkeypatch.setenv("LORA_GUARD_REMOTE_DEADLINE", "0.1")
    http.faults["/loras/math/adapter_config.json"] = [429]
    message = _lg140(lg.check_adapters(f"{http.url}/loras/math"), f"{http.url}/loras/math")
    assert "Retry-After: 1000000000 s" in message and "deadline" in message


# --- the Hub -------------------------------------------------------------------------------


def test_a_hub_repo_is_listed_and_its_adapters_read_through_huggingface_hub(
        hub: FileServer) -> None:
    report = lg.check_adapters(["hf://org/loras@v1/adapters"], lg.ServingLimits(max_rank=16))
    assert list(report.ids) == ["hf://org/loras@v1/adapters/chat",
                                "hf://org/loras@v1/adapters/code",
                                "hf://org/loras@v1/adapters/math"]
    assert report.codes() == ["LG101"]
    paths = [r.path for r in hub.log.requests if "/api/agent" not in r.path]
    assert "/api/models/org/loras/tree/v1/adapters" in paths
    assert "/org/loras/resolve/v1/adapters/chat/adapter_model.safetensors" in paths


def test_a_bare_hub_id_is_read_from_the_hub_only_when_no_local_path_has_its_name(
        hub: FileServer, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = lg.inspect_adapter("org/huge")
    assert spec.url == "org/huge" and spec.size > 100_000_000
    assert spec.transferred is not None and spec.transferred < 40_000
    monkeypatch.chdir(tmp_path)
    write_adapter(tmp_path / "org" / "huge", rank=4)  # now a local folder of that name
    hub.log.clear()
    assert lg.inspect_adapter("org/huge").rank == 4 and not hub.log.requests
    report = lg.check_adapters("org/typo")  # a path into the local folder org: a local miss
    assert report.codes() == ["LG108"] and not hub.log.requests


def test_the_hub_client_retries_a_throttled_or_failing_read(hub: FileServer) -> None:
    hub.faults["/org/loras/resolve/main/adapters/math/adapter_model.safetensors"] = [429, 503]
    hub.faults["/api/models/org/huge/tree/main"] = [502]
    report = lg.check_adapters(["hf://org/loras/adapters/math", "hf://org/huge"])
    assert report.ok and report.spec("hf://org/huge") is not None
    assert len(hub.log.for_path("adapters/math/adapter_model.safetensors")) == 4  # 2 faults


@pytest.mark.lora_guard(expect=["LG140"])  # inspect_adapter refuses a missing repo on purpose
def test_hub_errors_say_what_is_missing_or_denied(hub: FileServer,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    report = lg.check_adapters(["hf://org/loras@v9", "hf://org/nothing", "elsewhere/nothing",
                                "hf://org/loras/adapters/none", "hf://org/secret"])
    assert "revision not found" in _lg140(report, "hf://org/loras@v9")
    assert "repo not found" in _lg140(report, "hf://org/nothing")
    assert "nor is it a local path" in _lg140(report, "elsewhere/nothing")
    assert "not found" in _lg140(report, "hf://org/loras/adapters/none")
    assert "token" in _lg140(report, "hf://org/secret")
    monkeypatch.setenv("HF_TOKEN", hub.token)  # the library's usual source
    spec = lg.inspect_adapter("hf://org/secret")
    assert spec.rank == 8
    with pytest.raises(lg.AdapterError, match="LG140") as raised:
        lg.inspect_adapter("hf://org/nothing")
    assert hub.token not in str(raised.value)


def test_hub_offline_mode_is_reported_not_raised(hub: FileServer,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    report = lg.check_adapters("hf://org/loras")
    assert "HF_HUB_OFFLINE" in _lg140(report, "hf://org/loras")


# --- set-up errors -------------------------------------------------------------------------


def test_without_the_extra_a_remote_path_names_the_extra(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "botocore.session", None)  # as if not installed
    with pytest.raises(RuntimeError, match=r"lora-guard\[remote\]"):
        lg.check_adapters("s3://bkt/loras/")
    assert main(["check", "s3://bkt/loras/"]) == 2
    assert "pip install 'lora-guard[remote]'" in capsys.readouterr().err


def test_a_bad_remote_setting_is_a_usage_error(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("LORA_GUARD_REMOTE_WORKERS", "0")
    assert main(["check", "s3://bkt/loras/"]) == 2
    assert "LORA_GUARD_REMOTE_WORKERS='0': set it to an integer from 1 to 1024" in (
        capsys.readouterr().err)


def test_a_bad_deadline_is_a_usage_error(monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("LORA_GUARD_REMOTE_DEADLINE", "-1")
    assert main(["check", "s3://bkt/loras/"]) == 2
    assert "LORA_GUARD_REMOTE_DEADLINE='-1': set it to a number of seconds > 0" in (
        capsys.readouterr().err)


def test_local_paths_stay_local(tmp_path: pathlib.Path) -> None:
    write_adapter(tmp_path / "a")
    assert lg.check_adapters(tmp_path).ok
    assert lg.check_adapters([str(tmp_path / "a")]).spec(str(tmp_path / "a")) is not None
