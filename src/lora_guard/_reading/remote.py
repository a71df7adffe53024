"""Remote adapters: the Hugging Face Hub, S3 and HTTP(S), from ranged reads of their headers.

An adapter named by URL is read as a local one is, from ``adapter_config.json`` and the
safetensors header only, but over the network and never the tensor data: the config (at most
its size cap), the first 8 bytes of ``adapter_model.safetensors``, then, once the announced
header length has passed the cap and the file size, exactly the header. The bytes are parsed
and checked by the same code as a local adapter's (`lora_guard._reading.adapters.parse_config`,
`lora_guard._reading.safetensors.parse_header`).

Where:

- ``hf://ORG/REPO[@REVISION][/SUBFOLDER]``, and a bare Hub id ``ORG/NAME`` where the engines
  take one: a string of exactly two names joined by one ``/`` (letters, digits, ``.``, ``_``,
  ``-``) whose first name is no local file or folder. huggingface_hub gives the token (``HF_TOKEN``
  or ``hf auth login``), headers, URLs and error mapping; ``HF_ENDPOINT`` the endpoint. The token
  goes to the endpoint's origin only: a redirect elsewhere (the CDN) is followed without it, a
  listing page on another host is refused.
- ``s3://BUCKET/PREFIX``: botocore's credential chain (environment, profiles, instance roles;
  ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` for another S3 API), signer and error parsing.
- ``http://`` / ``https://``: the URL of an adapter folder (its files are ``URL/adapter_config
  .json`` and ``URL/adapter_model.safetensors``); a redirect is followed only to the same origin.

Every request of every store is sent by `lora_guard._reading.fetch.Client`: a total deadline
per read, a byte cap on every body (error bodies included), ``Retry-After`` capped, and
credentials only to their origin. A listed path is checked before it becomes part of a URL
(`_unsafe`: no ``..``, absolute, encoded or backslash form), and a listing is at most
`_MAX_PAGES` pages of `_MAX_PAGE_BYTES` each, within one deadline.

A Hub repo or an S3 prefix is listed and each adapter folder in it found, as a local folder is
searched. Many adapters are read at once by a bounded pool of threads; every request has a
timeout and is retried with backoff on throttling and transient errors. A failed read is one
adapter's violation (LG140; LG108 for what was read but is not a valid adapter, or what a
store answered that is never followed), never a traceback, and the rest of the run goes on.

The libraries are the optional extra ``lora-guard[remote]``; they are imported only here, when
a remote adapter is read. Settings from the environment: ``LORA_GUARD_REMOTE_WORKERS``
(parallel reads, 16), ``LORA_GUARD_REMOTE_TIMEOUT`` (seconds per socket operation, 30),
``LORA_GUARD_REMOTE_DEADLINE`` (seconds per read in all, 120),
``LORA_GUARD_REMOTE_RETRIES`` (retries of a throttled or failed request, 4) and
``LORA_GUARD_REMOTE_BACKOFF`` (first wait between retries in seconds, doubling, 0.5).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextvars
import io
import json
import os
import pathlib
import posixpath
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from lora_guard._core.config import refuse
from lora_guard._reading.adapters import AdapterSpec, build_spec
from lora_guard._reading.config import added_tokens_of, checked_config, parse_config
from lora_guard._reading.fetch import Client, FetchError, Reply, origin_of
from lora_guard._reading.malformed import (
    ADDED_TOKENS_NAME,
    CONFIG_NAME,
    MAX_CONFIG_BYTES,
    PICKLE_NAMES,
    WEIGHTS_NAME,
    Malformed,
    malformed_violation,
)
from lora_guard._reading.safetensors import (
    HeaderError,
    TensorInfo,
    header_length,
    parse_header,
)

__all__ = [
    "EXTRA",
    "RemoteError",
    "RemoteSetupError",
    "Settings",
    "fetch_remote",
    "inspect_remote",
    "is_remote",
    "settings",
]

EXTRA = "lora-guard[remote]"
_SCHEMES = ("hf://", "s3://", "http://", "https://")
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_HUB_ID = re.compile(rf"{_NAME}/{_NAME}")
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


def is_remote(path: str) -> bool:
    """Whether ``path`` names a remote adapter rather than a local path.

    ``hf://``, ``s3://``, ``http://`` and ``https://`` URLs always do. A bare Hub id
    ``ORG/NAME`` does only when no local file or folder named ``ORG`` exists, so a relative
    path into a local folder is always local (and a typo in it is a missing path).

    Example:
        >>> from lora_guard._reading.remote import is_remote
        >>> is_remote("s3://bucket/loras/"), is_remote("hf://org/repo@v1/math")
        (True, True)
        >>> is_remote("my-org/no-such-local-folder"), is_remote("./my-org/math"), is_remote("a/b/c")
        (True, False, False)
    """
    if path.startswith(_SCHEMES):
        return True
    return (_HUB_ID.fullmatch(path) is not None and ".." not in path
            and not os.path.lexists(path.split("/")[0]))  # ORG is no local folder either


# --- settings ------------------------------------------------------------------------------


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


# --- locations -----------------------------------------------------------------------------


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


# Listed paths ----------------------------------------------------------------------------


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


# S3 --------------------------------------------------------------------------------------


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


# Hugging Face Hub ------------------------------------------------------------------------


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


# HTTP(S) ---------------------------------------------------------------------------------


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


# --- reading one adapter -------------------------------------------------------------------


_Reader = Callable[[str, int, int], "tuple[bytes, int | None]"]


def _read_config(read: _Reader, files: Mapping[str, int | None], listed: bool) -> bytes:
    """``adapter_config.json``'s bytes, at most its cap, refused when listed larger."""
    if listed and CONFIG_NAME not in files:
        raise Malformed(CONFIG_NAME, "missing; an adapter folder needs adapter_config.json")
    config_size = files.get(CONFIG_NAME)
    if config_size is not None and config_size > MAX_CONFIG_BYTES:
        raise Malformed(CONFIG_NAME, f"larger than {MAX_CONFIG_BYTES} bytes")
    raw, total = read(CONFIG_NAME, 0, MAX_CONFIG_BYTES + 1)
    config_size = config_size if config_size is not None else total
    if config_size is not None and len(raw) < min(config_size, MAX_CONFIG_BYTES + 1):
        raise RemoteError(CONFIG_NAME, f"read {len(raw)} of {config_size} bytes; the read was "
                          "cut short", kind="truncated")
    return raw


def _weights_size(read: _Reader, files: Mapping[str, int | None], listed: bool
                  ) -> tuple[bytes, int]:
    """The first 8 bytes of the weights and the file's size (as listed, or as replied)."""
    if listed and WEIGHTS_NAME not in files:
        for name in PICKLE_NAMES:
            if name in files:
                raise Malformed(name, "pickle weights refused (never unpickled); convert to "
                                "safetensors", kind="pickle")
        raise Malformed(WEIGHTS_NAME, "missing; no adapter weights in the folder")
    first, total = read(WEIGHTS_NAME, 0, 8)
    size = files.get(WEIGHTS_NAME)
    if size is not None and total is not None and total != size:
        raise RemoteError(WEIGHTS_NAME, f"is {total} bytes now but was listed with {size}; it "
                          "changed during the check", kind="truncated")
    size = size if size is not None else total
    if size is None:
        raise Malformed(WEIGHTS_NAME, "served without its size (no Content-Range or "
                        "Content-Length), so its header cannot be checked against it")
    if len(first) < min(8, size):
        raise RemoteError(WEIGHTS_NAME, f"read {len(first)} of 8 bytes; the read was cut "
                          "short", kind="truncated")
    return first, size


def _read_header(read: _Reader, first: bytes, size: int
                 ) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """The safetensors header's tensors and metadata, its length capped before it is read."""
    try:
        length = header_length(first, size)  # the cap, before the header is read
        header, _ = read(WEIGHTS_NAME, 8, 8 + length)
        if len(header) != length:
            raise RemoteError(WEIGHTS_NAME, f"header read {len(header)} of {length} bytes; the "
                              "read was cut short", kind="truncated")
        return parse_header(header, size - 8 - length)
    except HeaderError as exc:
        raise Malformed(WEIGHTS_NAME, exc.problem) from None


def _read_added_tokens(read: _Reader, files: Mapping[str, int | None], listed: bool
                       ) -> dict[str, int] | None:
    """``added_tokens.json`` when the listing shows one, as locally; a store that lists no
    files (plain HTTP) is not asked for it, which would cost a request per adapter."""
    if not listed or ADDED_TOKENS_NAME not in files:
        return None
    size = files[ADDED_TOKENS_NAME]
    if size is not None and size > MAX_CONFIG_BYTES:
        raise Malformed(ADDED_TOKENS_NAME, f"larger than {MAX_CONFIG_BYTES} bytes")
    raw, _ = read(ADDED_TOKENS_NAME, 0, MAX_CONFIG_BYTES + 1)
    return added_tokens_of(raw)


def _read_adapter(store: _Store, adapter_id: str, folder: str,
                  files: dict[str, int | None]) -> AdapterSpec:
    listed = any(size is not None for size in files.values())
    transferred = 0

    def read(name: str, start: int, end: int) -> tuple[bytes, int | None]:
        nonlocal transferred
        data, total = store.read(folder, name, start, end)
        transferred += len(data)
        return data, total

    raw = _read_config(read, files, listed)
    config = checked_config(parse_config(raw))
    first, size = _weights_size(read, files, listed)
    tensors, metadata = _read_header(read, first, size)
    added = _read_added_tokens(read, files, listed)
    return build_spec(pathlib.Path(adapter_id), config, tensors, metadata,
                      len(raw) + size, added_tokens=added, url=adapter_id,
                      transferred=transferred)


def _read_safely(store: _Store, adapter_id: str, folder: str,
                 files: dict[str, int | None]) -> AdapterSpec | Malformed:
    try:
        return _read_adapter(store, adapter_id, folder, files)
    except Malformed as exc:
        return exc
    except Exception as exc:  # never a crash for one bad adapter
        return Malformed(adapter_id, f"could not be checked ({_short(exc)})")


# --- many adapters at once -----------------------------------------------------------------

_STORES: dict[str, type[_Store]] = {"hf": _Hub, "s3": _S3, "http": _HTTP, "https": _HTTP}


def _scheme(url: str) -> str:
    return url.split("://", 1)[0] if "://" in url else "hf"


def fetch_remote(items: Sequence[object]
                 ) -> dict[int, list[tuple[str, cf.Future[AdapterSpec | Malformed]]]]:
    """Start reading every remote item of ``items`` (by index): its adapter ids, each with a
    future of its `AdapterSpec` or the `Malformed` / `RemoteError` that says why not.

    Listings run first, in parallel, then every adapter's reads, in a bounded pool that shuts
    down by itself once the last read is done. Raises `RemoteSetupError` when the extra is
    missing or a setting is bad, before any request.
    """
    remote = [(i, item) for i, item in enumerate(items)
              if isinstance(item, str) and is_remote(item)]
    if not remote:
        return {}
    cfg = settings()
    made: dict[type[_Store], _Store] = {}
    stores: dict[str, _Store] = {}
    for _, url in remote:
        kind = _STORES[_scheme(url)]
        stores[_scheme(url)] = made[kind] = made.get(kind) or kind(cfg)
    pool = cf.ThreadPoolExecutor(cfg.workers, thread_name_prefix="lora-guard-remote")
    try:
        listings = {i: pool.submit(stores[_scheme(url)].discover, url) for i, url in remote}
        out: dict[int, list[tuple[str, cf.Future[AdapterSpec | Malformed]]]] = {}
        for i, url in remote:
            store = stores[_scheme(url)]
            try:
                found = listings[i].result()
            except Malformed as exc:
                out[i] = [(_shown(url), _done(exc))]
                continue
            except Exception as exc:
                out[i] = [(_shown(url), _done(Malformed(
                    _shown(url), f"could not be listed ({_short(exc)})")))]
                continue
            if not found:
                out[i] = [(_shown(url), _done(_not_found(
                    _shown(url), "no adapter found (no folder holding adapter_config.json or "
                    "adapter_model.safetensors)")))]
                continue
            out[i] = [(adapter_id, pool.submit(_read_safely, store, adapter_id, folder, files))
                      for adapter_id, folder, files in found]
    finally:
        pool.shutdown(wait=False)  # the submitted reads still run; the threads then exit
    return out


def _shown(url: str) -> str:
    return _redact(url) if "://" in url and not url.startswith(("s3://", "hf://")) else url


def _done(value: AdapterSpec | Malformed) -> cf.Future[AdapterSpec | Malformed]:
    future: cf.Future[AdapterSpec | Malformed] = cf.Future()
    future.set_result(value)
    return future


_lock = threading.Lock()


def inspect_remote(url: str) -> AdapterSpec:
    """`lora_guard.inspect_adapter` of a URL: one adapter's spec, or an `AdapterError`."""
    with _lock:  # one inspection's pool at a time keeps a loop of calls bounded too
        found = fetch_remote([url]).get(0, [])
    subject = f"adapter {_shown(url)!r}"
    if len(found) > 1:
        refuse([malformed_violation(subject, Malformed(
            _shown(url), f"holds {len(found)} adapters ({found[0][0]}, ...), not one; inspect "
            "one of them, or check them all with lg.check_adapters", kind="not-found"))])
    result = found[0][1].result()
    if isinstance(result, Malformed):
        refuse([malformed_violation(subject, result)])
    return result
