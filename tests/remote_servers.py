"""Loopback servers for remote adapters: a real S3 API (moto), HTTP with ranges, a Hub stand-in.

Every server binds 127.0.0.1 on a free port, runs in a daemon thread, records each request
(method, path, Range header, body bytes sent) and stops when its ``with`` block ends. Nothing
here talks to the real Hub or AWS.

- `S3Server`: moto's S3 backend served over HTTP (moto in server mode), wrapped in a WSGI layer
  that records what botocore asked for and what was sent back.
- `FileServer`: serves a folder over HTTP with ``Range`` support written here; faults on
  demand (statuses per path, a redirect, a server that ignores ranges, a cut-off body).
- `FileServer(tls=...)`: the same over HTTPS, with a self-signed certificate for 127.0.0.1
  made by `self_signed` (clients trust it through ``REQUESTS_CA_BUNDLE``). It also records the
  most requests it had in flight at once and can stall a path's reply (a hung server).
- `FileServer(hub=True)`: the two endpoints of the Hugging Face Hub that huggingface_hub's
  client calls to list and read a repo: ``GET /api/models/{repo}/tree/{rev}[/{path}]``
  (``recursive``, JSON entries ``{type, path, size, oid}``) and ``GET /{repo}/resolve/{rev}/
  {path}`` (ranged file reads), with the ``X-Error-Code`` headers its error mapping reads.
  A repo is the folder ``ROOT/ORG/NAME/REVISION/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    sent: int = 0  # body bytes sent back


@dataclass
class Log:
    requests: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, request: Request) -> Request:
        with self.lock:
            self.requests.append(request)
        return request

    def clear(self) -> None:
        with self.lock:
            self.requests.clear()

    def sent_for(self, fragment: str) -> int:
        """Body bytes sent for requests whose path holds ``fragment``."""
        with self.lock:
            return sum(r.sent for r in self.requests if fragment in r.path)

    def for_path(self, fragment: str) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if fragment in r.path]


def _parse_range(header: str | None, size: int) -> tuple[int, int] | str | None:
    """(start, end inclusive), None for no range, "bad" for an unsatisfiable one."""
    if not header or not header.startswith("bytes="):
        return None
    first, _, last = header[len("bytes="):].partition("-")
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if start >= size or end < start:
        return "bad"
    return start, end


class _Handler(BaseHTTPRequestHandler):
    server: FileServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
               record: Request | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)
            if record is not None:
                record.sent += len(body)

    def do_GET(self) -> None:
        srv = self.server
        with srv.lock:
            srv.in_flight += 1
            srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
        try:
            self._get()
        finally:
            with srv.lock:
                srv.in_flight -= 1

    def _get(self) -> None:
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        record = self.server.log.add(Request("GET", path, self.headers.get("Range")))
        srv = self.server
        if path in srv.stall:
            time.sleep(srv.stall[path])  # a server that hangs before it replies
        with srv.lock:
            queued = srv.faults.get(path)
            status = queued.pop(0) if queued else None
        if status is not None:
            headers = {"Retry-After": srv.retry_after} if status in (429, 503) else {}
            self._reply(status, b"fault", headers, record)
            return
        if path in srv.redirects:
            self._reply(302, headers={"Location": srv.redirects[path]})
            return
        if srv.hub:
            self._hub(path, parse_qs(parts.query), record)
        else:
            self._file(srv.root / path.lstrip("/"), record)

    def _file(self, file: pathlib.Path, record: Request,
              missing: Callable[[], None] | None = None) -> None:
        srv = self.server
        if not file.is_file():
            if missing is not None:
                missing()
            else:
                self._reply(404, b"not found", record=record)
            return
        size = file.stat().st_size
        wanted = None if str(file) in srv.ignore_range else _parse_range(
            self.headers.get("Range"), size)
        if wanted == "bad":
            self._reply(416, headers={"Content-Range": f"bytes */{size}"}, record=record)
            return
        start: int
        end: int
        start, end = (0, size - 1) if wanted is None else wanted  # type: ignore[str-unpack, assignment]
        count = end - start + 1
        self.send_response(200 if wanted is None else 206)
        if wanted is not None:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(count))
        self.send_header("ETag", '"0"')
        self.end_headers()
        cut = srv.cut_after.get(str(file))
        with open(file, "rb") as f, contextlib.suppress(BrokenPipeError, ConnectionError):
            f.seek(start)
            left = count if cut is None else min(count, cut)
            while left > 0:
                chunk = f.read(min(left, 65536))
                if not chunk:
                    break
                self.wfile.write(chunk)
                record.sent += len(chunk)
                left -= len(chunk)
            if cut is not None:
                self.close_connection = True

    def _hub_error(self, code: str, record: Request, status: int = 404) -> None:
        self._reply(status, json.dumps({"error": code}).encode(),
                    {"X-Error-Code": code, "Content-Type": "application/json"}, record)

    def _repo(self, org: str, name: str, rev: str, record: Request) -> pathlib.Path | None:
        srv = self.server
        repo = srv.root / org / name
        if f"{org}/{name}" in srv.private and self.headers.get(
                "authorization") != f"Bearer {srv.token}":
            self._hub_error("RepoNotFound", record, status=401)
            return None
        if not repo.is_dir():
            self._hub_error("RepoNotFound", record)
            return None
        if not (repo / rev).is_dir():
            self._hub_error("RevisionNotFound", record)
            return None
        return repo / rev

    def _hub(self, path: str, query: dict[str, list[str]], record: Request) -> None:
        segments = path.strip("/").split("/")
        if segments[:2] == ["api", "models"] and len(segments) >= 5 and segments[4] == "tree":
            org, name, rev = segments[2], segments[3], segments[5]
            base = self._repo(org, name, rev, record)
            if base is None:
                return
            sub = "/".join(segments[6:])
            top = base / sub
            if not top.exists():
                self._hub_error("EntryNotFound", record)
                return
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            entries: list[dict[str, Any]] = []
            for root, dirs, files in os.walk(top):
                dirs.sort()
                here = pathlib.Path(root)
                for d in dirs:
                    entries.append({"type": "directory", "oid": "0" * 40,
                                    "path": str((here / d).relative_to(base))})
                for f in sorted(files):
                    entries.append({"type": "file", "oid": "0" * 40,
                                    "size": (here / f).stat().st_size,
                                    "path": str((here / f).relative_to(base))})
                if not recursive:
                    break
            self._reply(200, json.dumps(entries).encode(),
                        {"Content-Type": "application/json"}, record)
            return
        if len(segments) >= 5 and segments[2] == "resolve":
            org, name, rev = segments[0], segments[1], segments[3]
            base = self._repo(org, name, rev, record)
            if base is None:
                return
            self._file(base / "/".join(segments[4:]), record,
                       missing=lambda: self._hub_error("EntryNotFound", record))
            return
        self._reply(404, b"unknown endpoint", record=record)


class FileServer(ThreadingHTTPServer):
    """A folder over HTTP on the loopback, with ranges and faults (see the module doc)."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, root: pathlib.Path, *, hub: bool = False,
                 tls: tuple[pathlib.Path, pathlib.Path] | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.scheme = "http"
        if tls is not None:  # (certificate, key) files
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.socket = context.wrap_socket(self.socket, server_side=True)
            self.scheme = "https"
        self.root = pathlib.Path(root)
        self.in_flight = 0
        self.max_in_flight = 0
        self.stall: dict[str, float] = {}
        self.hub = hub
        self.log = Log()
        self.lock = threading.Lock()
        self.faults: dict[str, list[int]] = {}
        self.redirects: dict[str, str] = {}
        self.ignore_range: set[str] = set()
        self.cut_after: dict[str, int] = {}
        self.private: set[str] = set()
        self.token = "hf_test_token"
        self.retry_after = "0"  # what a 429 or 503 fault asks the client to wait

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> FileServer:
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()


def self_signed(folder: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A certificate for 127.0.0.1 signed by its own key (cryptography comes with moto): the
    ``(certificate, key)`` files, written into ``folder``."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


class _Recording:
    """WSGI layer over moto's app: records each request and the body bytes it sent back."""

    def __init__(self, app: Any, log: Log, faults: dict[str, list[tuple[int, str]]]) -> None:
        self.app, self.log, self.faults = app, log, faults

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        path = unquote(environ["PATH_INFO"])
        record = self.log.add(Request(environ["REQUEST_METHOD"], path,
                                      environ.get("HTTP_RANGE")))
        queued = self.faults.get(path)
        if queued:  # an S3 error reply, as AWS sends it (AccessDenied, SlowDown, ...)
            status, code = queued.pop(0)
            body = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
                    f"<Message>{code}</Message></Error>").encode()
            start_response(f"{status} {code}", [("Content-Type", "application/xml"),
                                                 ("Content-Length", str(len(body)))])
            record.sent += len(body)
            yield body
            return
        for chunk in self.app(environ, start_response):
            record.sent += len(chunk)
            yield chunk


class S3Server:
    """moto's S3 API on the loopback (the server mode botocore talks to as to AWS)."""

    def __init__(self) -> None:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):
            def log(self, *args: Any) -> None:
                pass

        self.log = Log()
        self.faults: dict[str, list[tuple[int, str]]] = {}
        app = _Recording(DomainDispatcherApplication(create_backend_app), self.log, self.faults)
        self.server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=Quiet)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def __enter__(self) -> S3Server:
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def upload(self, bucket: str, prefix: str, folder: pathlib.Path) -> None:
        """Upload every file of ``folder`` under ``s3://bucket/prefix/``."""
        client = self.client()
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=bucket)
        for file in sorted(folder.rglob("*")):
            if file.is_file():
                key = f"{prefix.strip('/')}/{file.relative_to(folder)}".lstrip("/")
                client.upload_file(str(file), bucket, key)


S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}
"""Dummy credentials for moto, and no profile or instance metadata lookups."""
