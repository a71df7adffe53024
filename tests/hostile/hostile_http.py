"""Servers that misbehave on purpose, on the loopback, recording every connection.

`HostileServer` is a raw socket server (no http.server: it must be able to send one byte at a
time, never end a body, lie in its headers). It binds 127.0.0.1 on a free port, answers each
request with a behaviour (a function that writes to the socket), and records every connection
and every request with all its headers, so a test can say which origin saw which credential.

The behaviours used by `hostile.remote_attacks`:

- `serve_files`: a well-behaved store of byte strings (ranges honoured), for the Hub, S3 and
  HTTP paths alike, which the attacks then break one way each.
- `reply`: one fixed reply (a status, headers, a body).
- `trickle`: a reply sent one byte per interval, forever.
- `endless`: a chunked body that never ends (fast), after any status.
- `compressed`: a body gzip- or deflate-encoded (with `bomb`: 256 kB that decode to 256 MiB).
"""

from __future__ import annotations

import contextlib
import functools
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass
class Seen:
    """One request as the server saw it."""

    method: str
    target: str
    headers: dict[str, str]

    @property
    def path(self) -> str:
        return unquote(urlsplit(self.target).path)

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(urlsplit(self.target).query)


Behaviour = Callable[["Conn", Seen], bool]
"""Answers one request on a connection; returns whether the connection may serve another."""


class Conn:
    """A client connection: the socket, and a stop flag for behaviours that never end."""

    def __init__(self, sock: socket.socket, stop: threading.Event) -> None:
        self.sock = sock
        self.stop = stop

    def send(self, data: bytes) -> bool:
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False


def _head(status: int, headers: Mapping[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def reply(status: int, body: bytes = b"", headers: Mapping[str, str] | None = None
          ) -> Behaviour:
    def behave(conn: Conn, seen: Seen) -> bool:
        head = {"Content-Length": str(len(body)), **(headers or {})}
        return conn.send(_head(status, head) + body)
    return behave


def trickle(data: bytes, interval: float = 0.05) -> Behaviour:
    """Send ``data`` (headers and all) one byte per ``interval``, then nothing, forever."""
    def behave(conn: Conn, seen: Seen) -> bool:
        for i in range(len(data)):
            if conn.stop.is_set() or not conn.send(data[i:i + 1]):
                return False
            time.sleep(interval)
        while not conn.stop.wait(interval):
            pass
        return False
    return behave


def trickled_reply(status: int, length: int = 1 << 30, headers: Mapping[str, str] | None = None,
                   interval: float = 0.05) -> Behaviour:
    """Headers at once, then a body of ``length`` bytes, one byte per interval."""
    def behave(conn: Conn, seen: Seen) -> bool:
        if not conn.send(_head(status, {"Content-Length": str(length), **(headers or {})})):
            return False
        while not conn.stop.is_set() and conn.send(b"{"):
            time.sleep(interval)
        return False
    return behave


def endless(status: int, headers: Mapping[str, str] | None = None, chunk: bytes = b"x" * 65536,
            prefix: bytes = b"") -> Behaviour:
    """A chunked body that never ends (sent as fast as the client reads)."""
    def behave(conn: Conn, seen: Seen) -> bool:
        head = {"Transfer-Encoding": "chunked", **(headers or {})}
        if not conn.send(_head(status, head)):
            return False
        if prefix and not conn.send(b"%x\r\n%s\r\n" % (len(prefix), prefix)):
            return False
        piece = b"%x\r\n%s\r\n" % (len(chunk), chunk)
        while not conn.stop.is_set() and conn.send(piece):
            pass
        return False
    return behave


@functools.cache
def _raw_deflate(mib: int) -> tuple[bytes, int, int]:
    """``mib`` MiB of zeros as a raw deflate stream (a thousandth of the size), with the
    CRC-32 and Adler-32 of the zeros."""
    packer = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    block = bytes(1 << 20)
    parts, crc, adler = [], 0, 1
    for _ in range(mib):
        parts.append(packer.compress(block))
        crc, adler = zlib.crc32(block, crc), zlib.adler32(block, adler)
    return b"".join(parts) + packer.flush(), crc, adler


def bomb(mib: int = 256, coding: str = "gzip") -> bytes:
    """``mib`` MiB of zeros, gzip- or deflate-encoded (one raw stream, wrapped either way)."""
    raw, crc, adler = _raw_deflate(mib)
    if coding == "gzip":
        return (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + raw
                + struct.pack("<II", crc, (mib << 20) & 0xFFFFFFFF))
    return b"\x78\x9c" + raw + struct.pack(">I", adler)


def compressed(status: int, body: bytes, coding: str,
               headers: Mapping[str, str] | None = None) -> Behaviour:
    return reply(status, body, {"Content-Encoding": coding, **(headers or {})})


def _ranged(data: bytes, seen: Seen) -> tuple[int, bytes, dict[str, str]]:
    wanted = seen.headers.get("range", "")
    if not wanted.startswith("bytes="):
        return 200, data, {}
    first, _, last = wanted[len("bytes="):].partition("-")
    start = int(first)
    end = min(int(last), len(data) - 1) if last else len(data) - 1
    if start >= len(data):
        return 416, b"", {"Content-Range": f"bytes */{len(data)}"}
    return 206, data[start:end + 1], {"Content-Range": f"bytes {start}-{end}/{len(data)}"}


def serve_files(files: Mapping[str, bytes]) -> Behaviour:
    """A well-behaved store: each path's bytes, ranges honoured; 404 otherwise."""
    def behave(conn: Conn, seen: Seen) -> bool:
        data = files.get(seen.path)
        if data is None:
            return reply(404, b"not found")(conn, seen)
        status, body, extra = _ranged(data, seen)
        return reply(status, body, extra)(conn, seen)
    return behave


@dataclass
class HostileServer:
    """A raw HTTP/1.1 server on 127.0.0.1; ``route(seen)`` picks each request's behaviour."""

    route: Callable[[Seen], Behaviour]
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.open: list[socket.socket] = []

    def __enter__(self) -> HostileServer:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.sock.close()
        with self.lock:
            for sock in self.open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                sock, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
                self.open.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _requests(self, sock: socket.socket) -> Iterator[Seen]:
        buffer = b""
        while not self.stop.is_set():
            while b"\r\n\r\n" not in buffer:
                try:
                    data = sock.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                buffer += data
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = [*lines[0].split(" "), "", ""][:3]
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            yield Seen(method, target, headers)

    def _serve(self, sock: socket.socket) -> None:
        conn = Conn(sock, self.stop)
        with contextlib.suppress(OSError):
            for seen in self._requests(sock):
                with self.lock:
                    self.seen.append(seen)
                if not self.route(seen)(conn, seen):
                    break
        with contextlib.suppress(OSError):
            sock.close()

    def with_header(self, name: str) -> list[Seen]:
        """The requests that carried header ``name`` (lower case)."""
        with self.lock:
            return [s for s in self.seen if name in s.headers]
