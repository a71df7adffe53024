"""The remote stores behind `lora_guard._reading.remote`: the Hugging Face Hub, S3 and plain
HTTPS, each listing a prefix and reading byte ranges through one bounded client (`fetch`), with
the settings they read from the environment and the errors they raise (LG140)."""

from __future__ import annotations

import contextvars
import io
import json
import os
import posixpath
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from lora_guard._reading.fetch import Client, FetchError, Reply, origin_of
from lora_guard._reading.malformed import (
    CONFIG_NAME,
    PICKLE_NAMES,
    WEIGHTS_NAME,
    Malformed,
)

__all__ = ["EXTRA", "RemoteError", "RemoteSetupError", "Settings", "settings"]

EXTRA = "lora-guard[remote]"
_ADAPTER_FILES = frozenset((CONFIG_NAME, WEIGHTS_NAME, *PICKLE_NAMES))
_MAX_LISTED = 1_000_000  # keys listed under one prefix before the listing is refused
_MAX_PAGES = 1_000  # pages of one listing before it is refused (the Hub's hold 1,000 entries)
_MAX_PAGE_BYTES = 16 * 2**20  # bytes of one listing page before it is refused unparsed
_MAX_S3_SENDS = 4  # requests botocore may send for one S3 call (a region redirect, a retry)


class RemoteError(Malformed):
    """A remote read that failed: LG140, with the variant (``not-found``, ``denied``,
    ``truncated``, ``redirect``, ``unreachable``) that picks the fix."""

    code = "LG140"


class RemoteSetupError(RuntimeError):
    """Remote adapters cannot be read at all: the extra is not installed or a setting is bad.

    A usage error (``lora-guard check`` exits 2), not a violation of one adapter.
    """


@dataclass(frozen=True)
class Settings:
    """How remote reads run: parallel reads, seconds per socket operation, seconds per read
    in all (retries and waits included), retries, first backoff."""

    workers: int = 16
    timeout: float = 30.0
    retries: int = 4
    backoff: float = 0.5
    deadline: float = 120.0


def settings(environ: Mapping[str, str] | None = None) -> Settings:
    """`Settings` from ``LORA_GUARD_REMOTE_*``; raises `RemoteSetupError` for a bad value."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for name, kind, low in (("workers", int, 1), ("timeout", float, 0.001),
                            ("retries", int, 0), ("backoff", float, 0.0),
                            ("deadline", float, 0.001)):
        key = f"LORA_GUARD_REMOTE_{name.upper()}"
        raw = env.get(key)
        if raw is None or raw == "":
            continue
        try:
            value = kind(raw)
        except ValueError:
            value = None
        if value is None or value < low or (name == "workers" and value > 1024):
            want = "an integer from 1 to 1024" if name == "workers" else (
                "an integer >= 0" if kind is int else "a number of seconds > 0"
                if name in ("timeout", "deadline") else "a number of seconds >= 0")
            raise RemoteSetupError(f"{key}={raw!r}: set it to {want}")
        values[name] = value
    return Settings(**values)


def _require(module: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise RemoteSetupError(
            f"reading remote adapters needs {module.split('.')[0]} ({exc}); install the extra: "
            f"pip install '{EXTRA}'") from None


def _redact(url: str) -> str:
    """A URL safe to show: no user:password, no query (it may hold a signature)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    if "@" in parts.netloc:
        netloc = "***@" + netloc
    return urlunsplit((parts.scheme, netloc, parts.path, "..." if parts.query else "", ""))


def _folder_of(path: str) -> str:
    """A URL path naming an adapter file names its folder."""
    stripped = path.rstrip("/")
    if posixpath.basename(stripped) in _ADAPTER_FILES:
        return posixpath.dirname(stripped)
    return stripped


class _Store:
    """One kind of store: lists a location's adapter folders, reads byte ranges of files."""

    scheme = ""

    def __init__(self, cfg: Settings) -> None:
        self.cfg = cfg

    def discover(self, url: str) -> list[tuple[str, str, dict[str, int | None]]]:
        """``(adapter id, folder, {file name: size or None})`` of each adapter at ``url``."""
        raise NotImplementedError

    def read(self, folder: str, name: str, start: int, end: int) -> tuple[bytes, int | None]:
        """Bytes ``start`` to ``end`` (exclusive, or fewer at the end of the file) of
        ``folder/name``, and the file's size when the reply tells it."""
        raise NotImplementedError


def _group(listed: Mapping[str, int | None]) -> list[tuple[str, dict[str, int | None]]]:
    """Adapter folders among listed keys (folder -> files), outermost first, as locally: a
    folder holding an adapter file is an adapter and is not searched below."""
    folders: dict[str, dict[str, int | None]] = {}
    for key, size in listed.items():
        folder, name = posixpath.split(key)
        folders.setdefault(folder, {})[name] = size
    found: list[tuple[str, dict[str, int | None]]] = []
    for folder in sorted(folders):
        files = folders[folder]
        if _ADAPTER_FILES.isdisjoint(files):
            continue
        if any(outer == "" or folder.startswith(outer + "/") for outer, _ in found):
            continue
        found.append((folder, files))
    return found


def _not_found(url: str, what: str) -> RemoteError:
    return RemoteError(url, what, kind="not-found")


def _unsafe(path: str) -> str | None:
    """Why a listed path may not become part of a URL (None when it may): a path is a
    relative path of plain names, each the same once percent-decoded, so no server can resolve
    it outside the folder it was listed in."""
    if not path:
        return "is empty"
    if path.startswith("/"):
        return "is absolute"
    if "\\" in path:
        return "holds a backslash"
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        return "holds a control character"
    for segment in path.split("/"):
        decoded, previous = segment, None
        while decoded != previous:  # %252e%252e is %2e%2e is ..
            previous, decoded = decoded, unquote(decoded)
        if segment == "":
            return "holds an empty segment"
        if segment in (".", ".."):
            return f"holds a {segment!r} segment"
        if decoded in (".", "..") or "/" in decoded or "\\" in decoded:
            return f"holds {segment!r}, an encoded {decoded!r}"
    return None


def _check_listed(paths: Iterable[str], under: str = "") -> None:
    """`Malformed` (LG108, untrusted) for a listing naming any path that is not safe, or
    one outside the folder ``under`` that was listed."""
    for path in paths:
        why = _unsafe(path)
        if why is None and under and not path.startswith(under + "/"):
            why = f"is outside the listed folder {under[:200]!r}"
        if why is not None:
            raise Malformed("listing", f"it names the path {path[:200]!r}, which {why}; a "
                            "store that lists a path out of its folder is not read",
                            kind="untrusted")


def _fetch_error(shown: str, exc: FetchError) -> Malformed:
    """The violation of a failed read: LG108 for what is never followed, LG140 otherwise."""
    if exc.kind == "untrusted":
        return Malformed(shown, exc.problem, kind="untrusted")
    return RemoteError(shown, exc.problem, kind=exc.kind)


def _client(cfg: Settings) -> Client:
    _require("httpcore2")
    return Client(timeout=cfg.timeout, deadline=cfg.deadline, retries=cfg.retries,
                  backoff=cfg.backoff, connections=max(10, cfg.workers))


@dataclass
class _Call:
    """What one botocore call's request may read, and the reply it got (botocore parses a
    copy of the capped body; the reader uses the reply itself)."""

    limit: int
    listing: bool
    replies: list[Reply] = field(default_factory=list)


_s3_call: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "lora_guard_s3_call", default=None)


class _Raw:
    """The body botocore reads (``stream`` for an error or a listing, ``read`` for an
    object), from bytes already read within their cap."""

    def __init__(self, data: bytes) -> None:
        self.buffer = io.BytesIO(data)

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.buffer.read()

    def read(self, amt: int | None = None) -> bytes:
        return self.buffer.read(amt)

    def close(self) -> None:
        pass


class _S3(_Store):
    """S3 through botocore's credential chain, signer and error parsing; every request sent
    by the bounded client (botocore's ``before-send`` event), with botocore's own retries off
    (the client retries within the deadline)."""

    scheme = "s3"

    def __init__(self, cfg: Settings) -> None:
        super().__init__(cfg)
        session = _require("botocore.session")
        config = _require("botocore.config")
        self.awsrequest = _require("botocore.awsrequest")
        self.exceptions = _require("botocore.exceptions")
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        self.http = _client(cfg)
        self.s3 = session.get_session().create_client(
            "s3", endpoint_url=endpoint or None,
            config=config.Config(retries={"max_attempts": 1, "mode": "standard"},
                                 connect_timeout=cfg.timeout, read_timeout=cfg.timeout,
                                 max_pool_connections=max(10, cfg.workers)))
        self.s3.meta.events.register("before-send.s3", self._send)

    def _send(self, request: Any, **_: Any) -> Any:
        call = _s3_call.get()
        if call is None or request.method not in ("GET", "HEAD"):
            raise FetchError(f"unexpected S3 request {request.method}", "unreachable")
        if len(call.replies) >= _MAX_S3_SENDS:  # botocore's region redirects, in a loop
            raise FetchError(f"more than {_MAX_S3_SENDS} requests for one read (the endpoint "
                             "keeps redirecting)", "redirect")
        headers = {k: v.decode("latin-1") if isinstance(v, bytes) else str(v)
                   for k, v in request.headers.items()}
        reply = self.http.get(request.url, method=request.method, limit=call.limit,
                              headers=headers, follow=False)  # signed for this URL only
        if call.listing and reply.over_cap and 200 <= reply.status < 300:
            raise FetchError(f"a listing page larger than {call.limit:,} bytes; not parsed",
                             "untrusted")
        call.replies.append(reply)
        head = dict(reply.headers)
        head.pop("content-encoding", None)
        head["content-length"] = str(len(reply.body))  # the bytes botocore is given
        return self.awsrequest.AWSResponse(reply.url, reply.status, head, _Raw(reply.body))

    def _call(self, shown: str, name: str, limit: int, listing: bool, op: str,
              **kwargs: Any) -> tuple[Any, Reply]:
        call = _Call(limit, listing)
        token = _s3_call.set(call)
        try:
            result = getattr(self.s3, op)(**kwargs)
            return result, call.replies[-1]
        except FetchError as exc:
            raise _fetch_error(shown, exc) from None
        except self.exceptions.ClientError as exc:
            raise self._error(shown, name, exc) from None
        except self.exceptions.NoCredentialsError:
            raise RemoteError(shown, "no AWS credentials found", kind="denied") from None
        except Exception as exc:
            raise RemoteError(shown, f"S3 read failed ({_short(exc)})", kind="unreachable"
                              ) from None
        finally:
            _s3_call.reset(token)

    @staticmethod
    def _error(shown: str, name: str, exc: Any) -> RemoteError:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("NoSuchKey", "NoSuchBucket", "404") or status == 404:
            return _not_found(shown, f"{name or 'prefix'} not found (no such bucket or key)")
        if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                    "ExpiredToken") or status in (401, 403):
            return RemoteError(shown, f"access denied ({code or status})", kind="denied")
        if code == "InvalidRange" or status == 416:
            return RemoteError(shown, f"{name}: range not satisfiable (the file is shorter "
                               "than its header says)", kind="truncated")
        return RemoteError(shown, f"S3 read failed after retries (HTTP {status} {code})"
                           .rstrip(), kind="unreachable")

    def discover(self, url: str) -> list[tuple[str, str, dict[str, int | None]]]:
        root = _folder_of(url[len("s3://"):]).strip("/")
        bucket, _, prefix = root.partition("/")
        if not bucket:
            raise _not_found(url, "no bucket in the URL (expected s3://BUCKET/PREFIX)")
        listed: dict[str, int | None] = {}
        token: str | None = None
        until = time.monotonic() + self.cfg.deadline
        for _ in range(_MAX_PAGES):
            kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": f"{prefix}/" if prefix else ""}
            if token:
                kwargs["ContinuationToken"] = token
            page, _reply = self._call(url, "", _MAX_PAGE_BYTES, True, "list_objects_v2",
                                      **kwargs)
            keys = {str(o.get("Key", "")): int(o.get("Size") or 0)
                    for o in page.get("Contents") or () if not str(o.get("Key", "")).endswith("/")}
            _check_listed(keys, prefix)
            listed.update((f"{bucket}/{k}", v) for k, v in keys.items())
            if len(listed) > _MAX_LISTED:
                raise RemoteError(url, f"more than {_MAX_LISTED:,} keys under the prefix; name "
                                  "a narrower prefix", kind="not-found")
            token = page.get("NextContinuationToken") if page.get("IsTruncated") else None
            if not token:
                break
            if time.monotonic() > until:
                raise RemoteError(url, f"the listing took longer than its {self.cfg.deadline:g} "
                                  "s deadline (LORA_GUARD_REMOTE_DEADLINE); name a narrower "
                                  "prefix", kind="unreachable")
        else:
            raise Malformed("listing", f"more than {_MAX_PAGES:,} pages; a listing that never "
                            "ends is not followed", kind="untrusted")
        return [(url if folder == root else f"s3://{folder}", folder, files)
                for folder, files in _group(listed)]

    def read(self, folder: str, name: str, start: int, end: int) -> tuple[bytes, int | None]:
        bucket, _, key = f"{folder}/{name}".partition("/")
        shown = f"s3://{folder}/{name}"
        result, reply = self._call(shown, name, end, False, "get_object", Bucket=bucket,
                                   Key=key, Range=f"bytes={start}-{end - 1}")
        result["Body"].close()
        return _ranged(reply, start, end)


def _ranged(reply: Reply, start: int, end: int) -> tuple[bytes, int | None]:
    """Bytes ``start`` to ``end`` of a 200 or 206 reply, and the file's size when it says it:
    a server that ignored the range was read no further than ``end``."""
    if reply.status == 206:
        return reply.body[:end - start], _total(reply.headers)
    length = reply.headers.get("content-length", "")
    return reply.body[start:end], int(length) if length.isdigit() else None


class _Hub(_Store):
    """The Hub's tree and resolve endpoints, with huggingface_hub's token, headers, URLs and
    error mapping; the token goes to the endpoint's origin only (a CDN redirect is followed
    without it, a listing page on another host is refused)."""

    scheme = "hf"

    def __init__(self, cfg: Settings) -> None:
        super().__init__(cfg)
        self.hub = _require("huggingface_hub")
        self.utils = _require("huggingface_hub.utils")
        self.errors = _require("huggingface_hub.errors")
        self.constants = _require("huggingface_hub.constants")
        self.endpoint = (os.environ.get("HF_ENDPOINT") or self.constants.ENDPOINT).rstrip("/")
        self.origin = origin_of(self.endpoint)
        self.http = _client(cfg)

    @staticmethod
    def parse(url: str) -> tuple[str, str | None, str]:
        """``(repo id, revision, subfolder)`` of ``hf://ORG/REPO[@REV][/SUB]`` or ``ORG/NAME``."""
        rest = url[len("hf://"):] if url.startswith("hf://") else url
        parts = rest.strip("/").split("/")
        if len(parts) < 2 or not parts[0] or not parts[1]:
            raise _not_found(url, "not a Hub repo (expected hf://ORG/REPO[@REVISION][/SUBFOLDER])")
        repo, _, revision = parts[1].partition("@")
        sub = _folder_of("/".join(parts[2:]))
        return f"{parts[0]}/{repo}", unquote(revision) if revision else None, sub

    def _get(self, url: str, shown: str, what: str, *, limit: int, cross_origin: bool,
             headers: dict[str, str] | None = None, until: float | None = None) -> Reply:
        """GET from the Hub: its headers, the token to the endpoint only; an error status
        raised as the library maps it."""
        if self.constants.is_offline_mode():
            raise RemoteError(shown, "HF_HUB_OFFLINE is set; unset it to read from the Hub",
                              kind="unreachable")
        built = {k.lower(): v for k, v in self.utils.build_hf_headers().items()}
        token = {"authorization": built.pop("authorization")} if "authorization" in built else {}
        try:
            reply = self.http.get(url, limit=limit, headers={**built, **(headers or {})},
                                  credentials=token, origin=self.origin,
                                  cross_origin=cross_origin, until=until)
        except FetchError as exc:
            raise _fetch_error(shown, exc) from None
        if reply.status >= 400:
            raise self._status_error(reply, shown, what)
        return reply

    def _status_error(self, reply: Reply, shown: str, what: str) -> RemoteError:
        import httpx2

        headers = {k: v for k, v in reply.headers.items()
                   if k not in ("content-encoding", "content-length", "transfer-encoding")}
        response = httpx2.Response(reply.status, headers=headers, content=reply.body,
                                   request=httpx2.Request("GET", reply.url))
        try:
            self.utils.hf_raise_for_status(response)
        except Exception as exc:
            return self._error(shown, what, exc)
        return RemoteError(shown, f"Hub read failed after retries (HTTP {reply.status})",
                           kind="unreachable")

    def _error(self, shown: str, what: str, exc: Exception) -> RemoteError:
        e = self.errors
        if isinstance(exc, e.GatedRepoError):
            return RemoteError(shown, "gated repo: accept its conditions on the Hub and use a "
                               "token that may read it", kind="denied")
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if isinstance(exc, e.RepositoryNotFoundError) and status == 401:
            return RemoteError(shown, "repo not found or private (HTTP 401): a token that may "
                               "read it is needed", kind="denied")
        if isinstance(exc, e.RepositoryNotFoundError):
            return _not_found(shown, "repo not found (or private: a token that may read it "
                              "is needed)")
        if isinstance(exc, e.RevisionNotFoundError):
            return _not_found(shown, "revision not found")
        if isinstance(exc, (e.EntryNotFoundError, e.RemoteEntryNotFoundError)):
            return _not_found(shown, f"{what} not found in the repo")
        if status in (401, 403):
            return RemoteError(shown, f"access denied (HTTP {status})", kind="denied")
        if status == 404:
            return _not_found(shown, f"{what} not found")
        if status == 416:
            return RemoteError(shown, f"{what}: range not satisfiable (the file is shorter "
                               "than its header says)", kind="truncated")
        detail = f"HTTP {status}" if status else _short(exc)
        return RemoteError(shown, f"Hub read failed after retries ({detail})",
                           kind="unreachable")

    def _tree(self, repo: str, revision: str | None, sub: str, shown: str
              ) -> dict[str, int | None]:
        """Every file under ``sub`` (the Hub's tree endpoint, as `HfApi.list_repo_tree` calls
        it), page by page: at most `_MAX_PAGES` pages of `_MAX_PAGE_BYTES`, each page's next
        link on the endpoint's own origin, all within one deadline."""
        rev = quote(revision or "main", safe="")
        path = "/" + quote(sub, safe="") if sub else ""
        url = f"{self.endpoint}/api/models/{repo}/tree/{rev}{path}?recursive=true&expand=false"
        until = time.monotonic() + self.cfg.deadline
        listed: dict[str, int | None] = {}
        for _ in range(_MAX_PAGES):
            reply = self._get(url, shown, sub or "repo", limit=_MAX_PAGE_BYTES,
                              cross_origin=False, until=until)
            if reply.over_cap:
                raise Malformed("listing", f"a page larger than {_MAX_PAGE_BYTES:,} bytes; "
                                "not parsed", kind="untrusted")
            try:
                page = json.loads(reply.body)
            except (ValueError, RecursionError):
                raise RemoteError(shown, "the Hub's listing is not JSON", kind="unreachable"
                                  ) from None
            if not isinstance(page, list):
                raise RemoteError(shown, "the Hub's listing is not a list", kind="unreachable")
            files = {e["path"]: e.get("size") for e in page if isinstance(e, dict)
                     and e.get("type") == "file" and isinstance(e.get("path"), str)}
            _check_listed(files, sub)
            listed.update((p, s if type(s) is int and s >= 0 else None)
                          for p, s in files.items())
            if len(listed) > _MAX_LISTED:
                raise RemoteError(shown, f"more than {_MAX_LISTED:,} files listed; name a "
                                  "subfolder", kind="not-found")
            following = reply.links.get("next")
            if following is None:
                return listed
            if origin_of(following) != self.origin:
                raise Malformed("listing", f"its next page is on another host "
                                f"({_redact(following)}); not followed, with the token or "
                                "without", kind="untrusted")
            url = following
        raise Malformed("listing", f"more than {_MAX_PAGES:,} pages; a listing that never ends "
                        "is not followed", kind="untrusted")

    def discover(self, url: str) -> list[tuple[str, str, dict[str, int | None]]]:
        repo, revision, sub = self.parse(url)
        try:
            listed = self._tree(repo, revision, sub, url)
            if sub and not listed:
                raise _not_found(url, f"subfolder {sub!r} not found in the repo")
        except RemoteError as exc:
            if exc.kind == "not-found" and not url.startswith("hf://"):
                exc.problem += ("; nor is it a local path (a bare ORG/NAME that is not a local "
                                "path is read from the Hub)")
            raise
        at = f"@{quote(revision, safe='')}" if revision else ""
        found = []
        for folder, files in _group(listed):
            shown = url if folder == sub else f"hf://{repo}{at}/{folder}"
            found.append((shown, f"{repo}\0{revision or ''}\0{folder}", files))
        return found

    def read(self, folder: str, name: str, start: int, end: int) -> tuple[bytes, int | None]:
        repo, revision, sub = folder.split("\0")
        url = self.hub.hf_hub_url(repo, name, subfolder=sub or None,
                                  revision=revision or None, endpoint=self.endpoint)
        shown = f"hf://{repo}{'@' + revision if revision else ''}/{posixpath.join(sub, name)}"
        reply = self._get(url, shown, name, limit=end, cross_origin=True,
                          headers={"Range": f"bytes={start}-{end - 1}"})
        return _ranged(reply, start, end)


class _HTTP(_Store):
    scheme = "http"

    def __init__(self, cfg: Settings) -> None:
        super().__init__(cfg)
        self.http = _client(cfg)

    def discover(self, url: str) -> list[tuple[str, str, dict[str, int | None]]]:
        parts = urlsplit(url)
        if not parts.hostname:
            raise _not_found(_redact(url), "no host in the URL")
        folder = urlunsplit((parts.scheme, parts.netloc, _folder_of(parts.path), "", ""))
        # No listing over HTTP: the URL names one adapter folder; sizes come with the reads.
        return [(_redact(url), folder, {CONFIG_NAME: None, WEIGHTS_NAME: None})]

    def read(self, folder: str, name: str, start: int, end: int) -> tuple[bytes, int | None]:
        url = f"{folder}/{name}"
        shown = _redact(url)
        try:  # a redirect is followed on the same origin only
            reply = self.http.get(url, limit=end, headers={"Range": f"bytes={start}-{end - 1}"})
        except FetchError as exc:
            raise _fetch_error(shown, exc) from None
        error = _http_status_error(reply.status, shown)
        if error is not None:
            raise error
        return _ranged(reply, start, end)


def _http_status_error(status: int, shown: str) -> RemoteError | None:
    """The violation an HTTP status means for a ranged read (None for 200 and 206)."""
    if status in (200, 206):
        return None
    if status in (404, 410):
        return _not_found(shown, f"not found (HTTP {status})")
    if status in (401, 403):
        return RemoteError(shown, f"access denied (HTTP {status})", kind="denied")
    if status == 416:
        return RemoteError(shown, "range not satisfiable (the file is shorter than its header "
                           "says)", kind="truncated")
    return RemoteError(shown, f"HTTP {status} after retries", kind="unreachable")


def _total(headers: Mapping[str, str]) -> int | None:
    """The file size a ``Content-Range: bytes a-b/size`` reply tells."""
    value = headers.get("content-range", "")
    total = value.rpartition("/")[2]
    return int(total) if total.isdigit() else None


def _short(exc: BaseException) -> str:
    """A library's error in one short line, no credentials; a timeout said as one (the
    libraries bury it deep in a wrapped message)."""
    if isinstance(exc, TimeoutError) or "timed out" in str(exc).lower():
        return (f"{type(exc).__name__}: timed out; LORA_GUARD_REMOTE_TIMEOUT sets the seconds "
                "per request")
    text = str(exc).splitlines()[0] if str(exc) else ""
    text = re.sub(r"https?://\S+", lambda m: _redact(m.group(0)), text)
    return f"{type(exc).__name__}: {text}"[:200] if text else type(exc).__name__


_Reader = Callable[[str, int, int], "tuple[bytes, int | None]"]
