"""Hostile remote stores (issue 27): each attack answered in a child process, in bounded time
and memory, and no credential ever reaching another origin.

Each `hostile.remote_attacks.RemoteAttack` sets two loopback servers misbehaving; the child
runs ``lora-guard check --format json TARGET`` with ``HF_TOKEN`` and AWS keys set, under an
address-space limit (``RLIMIT_AS``) and a deadline, and reports what the user was told, how
long the check took and how much its peak resident memory grew (Linux's ``VmHWM``, reset
through ``/proc/self/clear_refs`` once the clients are made). Every connection and every
header the servers saw is recorded, so the attack can assert the token never left its origin.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from hostile.hostile_http import HostileServer, reply
from hostile.remote_attacks import (
    AWS_KEY,
    DEADLINE,
    REMOTE_ATTACKS,
    TOKEN,
    Ctx,
    RemoteAttack,
    build_adapter,
)

pytest.importorskip("botocore")
pytest.importorskip("huggingface_hub")
pytest.importorskip("resource")
if not pathlib.Path("/proc/self/clear_refs").exists():
    pytest.skip("the peak memory of a check is read from Linux's /proc", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]

CHILD_MEMORY_MIB = 1536
"""RLIMIT_AS of the child (address space: the interpreter, the clients, 16 threads' stacks)."""
STARTUP_SECONDS = 60
"""What the child may take beyond the attack's own bound: the interpreter and the imports."""

_CHILD = textwrap.dedent("""
    import contextlib, io, json, resource, sys, time
    limit = int(sys.argv[1]) * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    outside = []
    def loopback_only(event, args):
        if event == "socket.connect" and isinstance(args[1], tuple) and args[1][0] not in (
                "127.0.0.1", "::1", "localhost"):
            outside.append(str(args[1]))
            raise ConnectionRefusedError("the hostile suite stays on the loopback")
    sys.addaudithook(loopback_only)
    from lora_guard._frontends.cli import main
    from lora_guard._reading import remote
    target = sys.argv[2]
    remote._STORES[remote._scheme(target)](remote.settings())  # the clients, made once
    def kib(field):  # kB, from Linux's /proc (the peak reset just before the check)
        with open("/proc/self/status") as f:
            return int(next(l.split()[1] for l in f if l.startswith(field + ":")))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM, the peak resident set, to the current one
    before = kib("VmRSS")
    out = io.StringIO()
    start = time.monotonic()
    with contextlib.redirect_stdout(out):
        status = main(["check", "--format", "json", "--no-progress", target])
    took = time.monotonic() - start
    grew = (kib("VmHWM") - before) / 1024
    print(json.dumps({"status": status, "output": out.getvalue(), "seconds": took,
                      "grew_mib": grew, "outside": outside}))
""")


def _env(tmp: Path, attack: RemoteAttack, main: HostileServer) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.upper().endswith("_PROXY")
            and not k.startswith(("AWS_", "HF_", "LORA_GUARD_"))}
    return {
        **keep,
        "HF_TOKEN": TOKEN, "HF_ENDPOINT": main.url, "HF_HUB_OFFLINE": "0",
        "HF_TOKEN_PATH": str(tmp / "no-token"), "HF_HOME": str(tmp / "hf-home"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "AWS_ACCESS_KEY_ID": AWS_KEY, "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": main.url,
        "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true", "NO_PROXY": "127.0.0.1,localhost",
        "LORA_GUARD_REMOTE_DEADLINE": str(DEADLINE), "LORA_GUARD_REMOTE_TIMEOUT": "2",
        "LORA_GUARD_REMOTE_RETRIES": "2", "LORA_GUARD_REMOTE_BACKOFF": "0.01",
        "MALLOC_ARENA_MAX": "2", "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        **attack.env,
    }


def run_attack(attack: RemoteAttack, tmp: Path) -> tuple[dict[str, Any], Ctx]:
    config, weights = build_adapter(tmp / "adapter")
    with HostileServer(route=lambda seen: reply(404)) as main, \
            HostileServer(route=lambda seen: reply(404)) as other:
        ctx = Ctx(main, other, config, weights)
        target = attack.build(ctx)
        try:
            done = subprocess.run(
                [sys.executable, "-c", _CHILD, str(CHILD_MEMORY_MIB), target],
                capture_output=True, text=True, cwd=tmp, env=_env(tmp, attack, main),
                timeout=attack.seconds + STARTUP_SECONDS, errors="backslashreplace")
        except subprocess.TimeoutExpired:
            pytest.fail(f"{attack.name}: no answer within {attack.seconds} s (+ start-up)")
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3_000:]
        result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result, ctx


@pytest.mark.parametrize("attack", REMOTE_ATTACKS, ids=lambda a: a.name)
def test_a_hostile_store_is_answered_in_bounded_time_and_memory(
        attack: RemoteAttack, tmp_path: Path) -> None:
    result, ctx = run_attack(attack, tmp_path)
    said = result["output"]
    report = json.loads(said)
    assert result["status"] == (0 if report["ok"] else 1), result
    missing = [s for s in attack.says if s not in said]
    assert not missing, f"{attack.name}: {said[:2_000]} lacks {missing}"
    assert result["seconds"] <= attack.seconds, f"took {result['seconds']:.2f} s"
    assert result["grew_mib"] <= attack.max_mib, f"peak memory grew {result['grew_mib']:.1f} MiB"
    assert not result["outside"], result["outside"]
    assert TOKEN not in said and AWS_KEY not in said  # no credential in what is printed
    for violation in report.get("violations", []):
        assert violation.get("hint"), violation  # and what to do about it
    if attack.after is not None:
        attack.after(ctx)


def test_the_remote_attacks_cover_every_class_of_the_issue() -> None:
    kinds: dict[str, int] = {}
    for attack in REMOTE_ATTACKS:
        kinds[attack.kind] = kinds.get(attack.kind, 0) + 1
    assert set(kinds) == {"credential", "path", "time", "memory"}
    assert min(kinds.values()) >= 5, kinds
    names = {a.name for a in REMOTE_ATTACKS}
    assert len(names) == len(REMOTE_ATTACKS)
    for wanted in ("hub-link-next-other-origin", "hub-listed-dotdot", "hub-listed-absolute",
                   "hub-listed-encoded-dotdot", "hub-listed-backslash",
                   "http-headers-byte-at-a-time", "hub-error-body-byte-at-a-time",
                   "retry-after-a-billion-seconds", "hub-tree-pages-forever",
                   "s3-listing-pages-forever", "http-error-body-endless",
                   "hub-error-body-gzip-bomb", "s3-ignores-range-huge-object",
                   "s3-listing-page-endless"):
        assert wanted in names, wanted


def test_the_reliability_page_lists_every_remote_attack() -> None:
    page = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
    missing = [a.name for a in REMOTE_ATTACKS if f"`{a.name}`" not in page]
    assert not missing, f"docs/reliability.md does not list {missing}"
    assert f"{len(REMOTE_ATTACKS)} hostile stores" in page
