"""Bounded HTTP GETs for remote adapters: a total deadline, a byte cap on every body, and
credentials sent to their own origin only.

Every remote read of lora_guard (the Hub, S3, plain HTTP(S)) goes through `Client.get`, which
holds these bounds whatever the server does:

- **A total deadline** per read (``LORA_GUARD_REMOTE_DEADLINE``, 120 s), retries, redirects and
  waits included, on top of the per-operation timeout (``LORA_GUARD_REMOTE_TIMEOUT``): every
  socket operation is given at most the time left (a server that sends one byte at a time ends
  at the deadline), and a TLS handshake is cut at it.
- **A byte cap on every body**: the caller's ``limit`` for a success, `ERROR_BODY_CAP` for an
  error or a redirect (an endless or huge error body is read no further). A body the server
  compressed although ``identity`` was asked is decoded within the same cap (a gzip or deflate
  bomb stops at it); any other coding is refused.
- **``Retry-After`` capped** at `MAX_RETRY_AFTER` seconds and never waited past the deadline.
- **Credentials** (``credentials``: an ``Authorization`` header) go only to ``origin``; a
  redirect is followed to the same origin only, or, with ``cross_origin=True`` (the Hub's CDN
  redirects), without them.

The transport is httpcore2 (huggingface_hub's own HTTP stack) with a network backend that
clamps each socket operation to the deadline. ``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``NO_PROXY``
are honoured; a certificate bundle is taken from ``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE`` or
``SSL_CERT_FILE`` (else certifi's, else the system's).
"""

from __future__ import annotations

import contextlib
import contextvars
import email.utils
import os
import socket
import ssl
import threading
import time
import urllib.request
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

__all__ = ["ERROR_BODY_CAP", "MAX_RETRY_AFTER", "Client", "FetchError", "Reply", "origin_of"]

ERROR_BODY_CAP = 65_536
"""Bytes read of an error or redirect reply's body (its decoded bytes when compressed)."""
MAX_RETRY_AFTER = 60.0
"""The longest wait a ``Retry-After`` header gets, in seconds (and never past the deadline)."""
MAX_REDIRECTS = 5
_RETRY_STATUSES = frozenset((408, 429, 500, 502, 503, 504))
_REDIRECTS = frozenset((301, 302, 303, 307, 308))
_MAX_BACKOFF = 8.0
_STEP = 1 << 20  # bytes decoded at a time

_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "lora_guard_fetch_deadline", default=None)


class FetchError(Exception):
    """A read that failed: ``problem`` says why, ``kind`` is the LG140 variant
    (``unreachable``, ``redirect``) or ``untrusted`` (LG108: the server answered with
    something that is not followed or not read)."""

    def __init__(self, problem: str, kind: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.kind = kind


@dataclass(frozen=True)
class Reply:
    """A reply: its status, headers (lower-case names), at most ``limit`` bytes of body,
    whether more was sent past that cap, and the URL that answered (after redirects)."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    over_cap: bool
    url: str
    links: Mapping[str, str]
    """``Link`` header targets by ``rel`` (``next``), resolved against ``url``."""


def origin_of(url: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of a URL, the scheme's default port when none is written."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), port or {"http": 80, "https": 443}.get(
        scheme, 0)


# --- the deadline, in every socket operation -----------------------------------------------


def _left(timeout: float | None) -> float | None:
    """``timeout`` cut to the time left before the deadline; a timeout error past it."""
    end = _deadline.get()
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        import httpcore2

        raise httpcore2.ReadTimeout("the read's total deadline passed")
    return left if timeout is None else min(timeout, left)


class _Stream:
    """A network stream whose every operation ends by the deadline."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data: bytes = self.inner.read(max_bytes, _left(timeout))
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.inner.write(buffer, _left(timeout))

    def close(self) -> None:
        self.inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> _Stream:
        # One handshake is many socket waits: a timer shuts the socket at the deadline.
        left = _left(timeout)
        sock = self.inner.get_extra_info("socket")
        timer = None
        if left is not None and isinstance(sock, socket.socket):
            timer = threading.Timer(left, _shut, (sock,))
            timer.daemon = True
            timer.start()
        try:
            return _Stream(self.inner.start_tls(ssl_context, server_hostname, left))
        finally:
            if timer is not None:
                timer.cancel()

    def get_extra_info(self, info: str) -> Any:
        return self.inner.get_extra_info(info)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _backend() -> Any:
    import httpcore2

    class Backend(httpcore2.NetworkBackend):
        def __init__(self) -> None:
            self.inner = httpcore2.SyncBackend()

        def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                        local_address: str | None = None,
                        socket_options: Iterable[Any] | None = None) -> Any:
            return _Stream(self.inner.connect_tcp(host, port, _left(timeout), local_address,
                                                  socket_options))

        def connect_unix_socket(self, path: str, timeout: float | None = None,
                                socket_options: Iterable[Any] | None = None) -> Any:
            return _Stream(self.inner.connect_unix_socket(path, _left(timeout),
                                                          socket_options))

        def sleep(self, seconds: float) -> None:
            time.sleep(seconds)

    return Backend()


def _ssl_context() -> ssl.SSLContext:
    bundle = next((os.environ[k] for k in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
                                           "SSL_CERT_FILE") if os.environ.get(k)), None)
    if bundle is None:
        try:
            import certifi

            bundle = certifi.where()
        except ImportError:
            bundle = None
    if bundle is not None and os.path.isdir(bundle):
        return ssl.create_default_context(capath=bundle)
    return ssl.create_default_context(cafile=bundle)


# --- bodies --------------------------------------------------------------------------------


def _decoder(coding: str) -> Any:
    """A zlib decompressor for a ``Content-Encoding``, None for identity; `FetchError` for
    any other (stacked codings included)."""
    coding = coding.strip().lower()
    if coding in ("", "identity"):
        return None
    if coding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if coding == "deflate":
        return zlib.decompressobj(zlib.MAX_WBITS)
    raise FetchError(f"the reply is encoded as {coding!r} although 'identity' was asked; "
                     "it is not decoded", "untrusted")


def _read_body(chunks: Iterable[bytes], coding: str, cap: int) -> tuple[bytes, bool]:
    """At most ``cap`` bytes of a body (decoded within the cap, 1 MiB at a time), and whether
    it went on past the cap."""
    decoder = _decoder(coding)
    out = bytearray()
    for chunk in chunks:
        pending = chunk
        while pending:
            if decoder is None:
                piece, pending = pending, b""
            else:
                try:
                    piece = decoder.decompress(pending, min(cap + 1 - len(out), _STEP))
                except zlib.error as exc:
                    raise FetchError(f"the reply's {coding} body is corrupt ({exc})",
                                     "untrusted") from None
                pending = decoder.unconsumed_tail
            out += piece
            if len(out) > cap:
                del out[cap:]
                return bytes(out), True
    return bytes(out), False


def _links(value: str, base: str) -> dict[str, str]:
    """``Link: <url>; rel="next", ...`` as ``{rel: absolute url}``."""
    found: dict[str, str] = {}
    for part in value.split(","):
        target, _, params = part.strip().partition(";")
        target = target.strip()
        if not (target.startswith("<") and target.endswith(">")):
            continue
        for param in params.split(";"):
            key, _, rel = param.strip().partition("=")
            if key.strip().lower() == "rel":
                for name in rel.strip().strip('"').split():
                    found.setdefault(name.lower(), urljoin(base, target[1:-1]))
    return found


def _retry_after(value: str | None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (a number or an HTTP date), None if none."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        seconds = when.timestamp() - time.time()
    return seconds if seconds == seconds else None  # NaN: none


# --- the client ----------------------------------------------------------------------------


def _ssl_error(exc: BaseException) -> ssl.SSLError | None:
    """The `ssl.SSLError` an error was raised from (the HTTP library wraps it), or None."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLError):
            return cause
        cause = cause.__cause__ or cause.__context__
    return None


def _short(exc: BaseException) -> str:
    """A transport error in one line: a timeout said as one, a certificate error as SSLError."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    cause = _ssl_error(exc)
    if cause is not None or "CERTIFICATE_VERIFY_FAILED" in text:
        return f"SSLError: {text or cause}"[:200]
    if "deadline" in text:
        return f"{type(exc).__name__}: {text}"
    if isinstance(exc, TimeoutError) or "timed out" in text.lower() or "Timeout" in type(
            exc).__name__:
        return (f"{type(exc).__name__}: timed out; LORA_GUARD_REMOTE_TIMEOUT sets the seconds "
                "per request")
    return f"{type(exc).__name__}: {text}"[:200] if text else type(exc).__name__


def _userinfo(url: str, credentials: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """``user:password@`` of a URL taken out of it, as Basic auth for its origin only."""
    parts = urlsplit(url)
    if parts.username is None:
        return url, dict(credentials)
    import base64

    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
    basic = {"Authorization": "Basic " + base64.b64encode(pair).decode()}
    bare = urlunsplit((parts.scheme, parts.netloc.rsplit("@", 1)[-1], parts.path, parts.query,
                       ""))
    return bare, {**basic, **credentials}


class Client:
    """GETs with a total deadline, capped bodies, retries and origin-bound credentials.

    One client serves every thread of a run (its connection pool is thread-safe).
    """

    def __init__(self, *, timeout: float, deadline: float, retries: int, backoff: float,
                 connections: int) -> None:
        import httpcore2

        self.httpcore = httpcore2
        self.timeout, self.deadline = timeout, deadline
        self.retries, self.backoff = retries, backoff
        self.connections = connections
        self._ssl = _ssl_context()
        self._pools: dict[str | None, Any] = {}
        self._lock = threading.Lock()

    def _pool(self, url: str) -> Any:
        parts = urlsplit(url)
        proxies = urllib.request.getproxies_environment()
        proxy = proxies.get(parts.scheme)
        if proxy and urllib.request.proxy_bypass_environment(  # type: ignore[attr-defined]
                parts.hostname or ""):
            proxy = None
        with self._lock:
            pool = self._pools.get(proxy)
            if pool is None:
                common: dict[str, Any] = {
                    "ssl_context": self._ssl, "max_connections": self.connections,
                    "network_backend": _backend()}
                if proxy is None:
                    pool = self.httpcore.ConnectionPool(**common)
                else:
                    p = urlsplit(proxy)
                    auth = (p.username or "", p.password or "") if p.username else None
                    pool = self.httpcore.HTTPProxy(
                        proxy_url=urlunsplit((p.scheme, p.netloc.rsplit("@", 1)[-1], p.path,
                                              "", "")), proxy_auth=auth, **common)
                self._pools[proxy] = pool
            return pool

    def get(self, url: str, *, limit: int, headers: Mapping[str, str] | None = None,
            credentials: Mapping[str, str] | None = None,
            origin: tuple[str, str, int] | None = None, cross_origin: bool = False,
            follow: bool = True, method: str = "GET", until: float | None = None) -> Reply:
        """GET ``url``: at most ``limit`` body bytes of a 2xx reply, retried on throttling,
        server errors and transport errors, all within the total deadline.

        ``credentials`` are added to requests to ``origin`` only (the URL's own by default).
        A redirect to another origin raises `FetchError` (``redirect``) unless
        ``cross_origin``, where it is followed without them; ``follow=False`` returns it.
        The last reply of a status retried in vain is returned, as any other status is.
        ``until`` (a `time.monotonic` time) ends the read earlier than its own deadline.
        """
        end = time.monotonic() + self.deadline
        if until is not None:
            end = min(end, until)
        url, credentials = _userinfo(url, credentials or {})
        token = _deadline.set(end)
        try:
            wait, attempt = self.backoff, 0
            while True:
                try:
                    reply = self._follow(method, url, limit, dict(headers or {}),
                                         credentials, origin or origin_of(url),
                                         cross_origin, follow)
                except self.httpcore.UnsupportedProtocol as exc:
                    raise FetchError(f"not an HTTP URL ({_short(exc)})", "untrusted") from None
                except (self.httpcore.TimeoutException, self.httpcore.NetworkError,
                        self.httpcore.ProtocolError, self.httpcore.ProxyError, OSError) as exc:
                    if time.monotonic() >= end:
                        raise FetchError(
                            f"no complete reply within the {self.deadline:g} s deadline "
                            f"({_short(exc)}); LORA_GUARD_REMOTE_DEADLINE sets the seconds "
                            "a read may take in all", "unreachable") from None
                    if attempt >= self.retries or _ssl_error(exc) is not None or (
                            "CERTIFICATE_VERIFY_FAILED" in str(exc)):
                        raise FetchError(f"read failed after retries ({_short(exc)})",
                                         "unreachable") from None
                    delay = wait
                else:
                    if reply.status not in _RETRY_STATUSES or attempt >= self.retries:
                        return reply
                    asked = _retry_after(reply.headers.get("retry-after"))
                    delay = wait if asked is None else max(0.0, min(asked, MAX_RETRY_AFTER))
                    if time.monotonic() + delay >= end:
                        said = "" if asked is None else f" (Retry-After: {asked:.0f} s)"
                        raise FetchError(
                            f"HTTP {reply.status}{said}: a retry would pass the read's "
                            f"{self.deadline:g} s deadline (LORA_GUARD_REMOTE_DEADLINE)",
                            "unreachable")
                attempt += 1
                wait = min(max(wait * 2, self.backoff), _MAX_BACKOFF)
                time.sleep(min(delay, max(0.0, end - time.monotonic())))
        finally:
            _deadline.reset(token)

    def _follow(self, method: str, url: str, limit: int, headers: dict[str, str],
                credentials: Mapping[str, str], origin: tuple[str, str, int],
                cross_origin: bool, follow: bool) -> Reply:
        start = url
        for _ in range(MAX_REDIRECTS + 1):
            if origin_of(url)[0] not in ("http", "https"):
                raise FetchError(f"led to {_shown(url)}, not an HTTP URL; not followed",
                                 "untrusted")
            sent = {**headers, **(credentials if origin_of(url) == origin else {})}
            reply = self._once(method, url, sent, limit)
            target = reply.headers.get("location")
            if reply.status not in _REDIRECTS or not target or not follow:
                return reply
            target = urljoin(url, target)
            if origin_of(target) != origin_of(start) and not cross_origin:
                raise FetchError(f"redirected to another host ({_shown(target)}); not "
                                 "followed", "redirect")
            url = target
        raise FetchError(f"more than {MAX_REDIRECTS} redirects", "redirect")

    def _until_cut(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        """A body's chunks up to where the server hung up: the caller sees a short body and
        says so (a timeout still raises)."""
        try:
            yield from chunks
        except (self.httpcore.RemoteProtocolError, self.httpcore.ReadError):
            return

    def _once(self, method: str, url: str, headers: Mapping[str, str], limit: int) -> Reply:
        if urlsplit(url).username is not None:  # a redirect's user info is never sent
            parts = urlsplit(url)
            url = urlunsplit((parts.scheme, parts.netloc.rsplit("@", 1)[-1], parts.path,
                              parts.query, ""))
        sent = {"Accept-Encoding": "identity", **headers}
        timeouts = {"connect": self.timeout, "read": self.timeout, "write": self.timeout,
                    "pool": self.timeout}
        with self._pool(url).stream(method, url, headers=list(sent.items()),
                                    extensions={"timeout": timeouts}) as response:
            found: dict[str, str] = {}
            for raw_name, raw_value in response.headers:
                name = raw_name.decode("latin-1").lower()
                value = raw_value.decode("latin-1")
                found[name] = f"{found[name]}, {value}" if name in found and name == "link" \
                    else value
            status = int(response.status)
            cap = limit if 200 <= status < 300 else ERROR_BODY_CAP
            coding = found.get("content-encoding", "")
            try:
                body, over = _read_body(self._until_cut(response.iter_stream()), coding, cap)
            except FetchError:
                if 200 <= status < 300:
                    raise
                body, over = b"", True  # an error reply's body in an odd coding: unread
        return Reply(status, found, body, over, url, _links(found.get("link", ""), url))


def _shown(url: str) -> str:
    """A URL safe to show: no user:password, no query."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, "..." if parts.query else "", ""))
