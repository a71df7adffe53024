"""How fast is checking remote adapters? Prints time and bytes; no assertions.

    python bench/bench_remote.py [--adapters 1000] [--workers 16] [--stores s3,http,hub]

Writes N small PEFT-format adapters (r=8 on q/v of a 2-layer model) and one ~117 MB adapter,
serves them on the loopback (moto's S3 API, an HTTP server with ranges, a stand-in of the
Hub's tree/resolve endpoints: tests/remote_servers.py),
then times ``lg.check_adapters`` of the N adapters as one prefix (S3, Hub) or N URLs (HTTP),
and prints the bytes the server sent against the bytes the adapters hold. Only 127.0.0.1 is
contacted: dummy AWS credentials, HF_ENDPOINT set to the loopback.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import lora_guard as lg  # noqa: E402
from lora_guard._testing.adapter_writer import write_adapter  # noqa: E402
from remote_servers import S3_ENV, FileServer, S3Server  # noqa: E402


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def run(label: str, paths: list[str], log: object, held: int) -> None:
    start = time.perf_counter()
    report = lg.check_adapters(paths)
    took = time.perf_counter() - start
    moved = sum(s.transferred or 0 for s in report.adapters)
    sent = sum(r.sent for r in log.requests)  # type: ignore[attr-defined]
    count = len(report.ids)
    assert report.ok, report.violations[:3]
    print(f"  {label:<5} {count:5d} adapters  {took:6.2f} s  ({took / count * 1e3:5.2f} ms each)"
          f"  read {_size(moved)} ({_size(moved / count)} each; server sent {_size(sent)} "
          f"with listings) of {_size(held)} held")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapters", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--stores", default="s3,http,hub")
    args = parser.parse_args()
    os.environ.update(S3_ENV)
    os.environ["LORA_GUARD_REMOTE_WORKERS"] = str(args.workers)
    stores = args.stores.split(",")

    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        for i in range(args.adapters):
            write_adapter(root / "many" / f"a{i:04d}")
        write_adapter(root / "big" / "huge", rank=64, hidden_size=4096, layers=32,
                      intermediate_size=11008, targets=("q_proj", "k_proj", "v_proj", "o_proj"))
        held = sum(f.stat().st_size for f in (root / "many").rglob("*") if f.is_file())
        big = sum(f.stat().st_size for f in (root / "big").rglob("*") if f.is_file())
        print(f"lora_guard {lg.__version__}, python {sys.version.split()[0]}, "
              f"{args.workers} workers, loopback")
        if "s3" in stores:
            with S3Server() as s3:
                os.environ["AWS_ENDPOINT_URL_S3"] = s3.url
                s3.upload("bkt", "many", root / "many")
                s3.upload("bkt", "big", root / "big")
                s3.log.clear()
                run("s3", ["s3://bkt/many/"], s3.log, held)
                s3.log.clear()
                run("s3", ["s3://bkt/big/huge"], s3.log, big)
        if "http" in stores:
            with FileServer(root) as http:
                run("http", [f"{http.url}/many/a{i:04d}" for i in range(args.adapters)],
                    http.log, held)
                http.log.clear()
                run("http", [f"{http.url}/big/huge"], http.log, big)
        if "hub" in stores:
            import huggingface_hub.constants as constants

            repos = root / "hub"
            shutil.copytree(root / "many", repos / "org" / "many" / "main")
            shutil.copytree(root / "big" / "huge", repos / "org" / "huge" / "main")
            with FileServer(repos, hub=True) as hub:
                os.environ["HF_ENDPOINT"] = hub.url
                constants.ENDPOINT = hub.url
                constants.HUGGINGFACE_CO_URL_TEMPLATE = (
                    hub.url + "/{repo_id}/resolve/{revision}/{filename}")
                run("hub", ["hf://org/many"], hub.log, held)
                hub.log.clear()
                run("hub", ["hf://org/huge"], hub.log, big)


if __name__ == "__main__":
    main()
