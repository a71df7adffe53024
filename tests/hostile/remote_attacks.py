"""Remote stores that lie (issue 27, round 3): the Hub, S3 and HTTP servers an attacker runs.

Each `RemoteAttack` sets the behaviour of two loopback servers (`hostile_http.HostileServer`):
``main``, the store the user names (``HF_ENDPOINT``, ``AWS_ENDPOINT_URL_S3`` or the URL), and
``other``, another origin that must never see a credential. ``tests/test_hostile_remote.py``
runs ``lora-guard check --format json TARGET`` in a child process under an address-space
limit and a deadline, with ``HF_TOKEN`` and AWS keys set, and asserts what the user is told
(``says``), the time the check took (``seconds``), its peak memory growth (``max_mib``), and
what each server saw (``after``).

Classes (``kind``): ``credential`` (a token sent to another origin), ``path`` (a listed path
that leaves its folder), ``time`` (reads that outlast the documented timeouts), ``memory``
(reads whose memory would be unbounded).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape

from hostile.hostile_http import (
    Behaviour,
    HostileServer,
    Seen,
    bomb,
    compressed,
    endless,
    reply,
    serve_files,
    trickle,
    trickled_reply,
)

TOKEN = "hf_secret_token_x"
"""The user's Hub token in every attack (``HF_TOKEN``)."""
AWS_KEY = "AKIDSECRETKEYX"
"""The user's AWS access key id in every attack: it appears in each signed request."""
DEADLINE = 3
"""``LORA_GUARD_REMOTE_DEADLINE`` of the attacks (seconds per read in all)."""


@dataclass
class Ctx:
    """What an attack's ``build`` gets: the two servers and a valid adapter's bytes."""

    main: HostileServer
    other: HostileServer
    config: bytes
    weights: bytes


@dataclass(frozen=True)
class RemoteAttack:
    name: str
    kind: str
    finding: str
    build: Callable[[Ctx], str]
    """Sets the servers' behaviour; returns the target to check."""
    says: tuple[str, ...]
    seconds: float
    """The longest the check may take (the child's own clock, imports excluded)."""
    max_mib: float = 24.0
    """Peak resident memory the check may add (``VmHWM`` over ``VmRSS`` once the clients are
    made)."""
    env: Mapping[str, str] = field(default_factory=dict)
    after: Callable[[Ctx], None] | None = None
    """Assertions on what the servers saw, once the check is done."""


# --- well-behaved stores, for the attacks to break -----------------------------------------

ORG, REPO = "org", "repo"


def hub_tree(entries: list[dict[str, object]], headers: Mapping[str, str] | None = None
             ) -> Behaviour:
    return reply(200, json.dumps(entries).encode(),
                 {"Content-Type": "application/json", **(headers or {})})


def hub_entries(ctx: Ctx, folder: str = "a") -> list[dict[str, object]]:
    return [{"type": "file", "path": f"{folder}/adapter_config.json", "size": len(ctx.config)},
            {"type": "file", "path": f"{folder}/adapter_model.safetensors",
             "size": len(ctx.weights)}]


def hub_files(ctx: Ctx, folder: str = "a") -> dict[str, bytes]:
    base = f"/{ORG}/{REPO}/resolve/main/{folder}"
    return {f"{base}/adapter_config.json": ctx.config,
            f"{base}/adapter_model.safetensors": ctx.weights}


def is_tree(seen: Seen) -> bool:
    return seen.path.startswith(f"/api/models/{ORG}/{REPO}/tree/")


def hub(ctx: Ctx, tree: Behaviour, files: Behaviour | None = None) -> str:
    """The Hub stand-in on ``main``: ``tree`` answers the listing, ``files`` the reads."""
    served = files or serve_files(hub_files(ctx))
    ctx.main.route = lambda seen: tree if is_tree(seen) else served
    return f"hf://{ORG}/{REPO}"


def s3_listing(keys: Mapping[str, int], *, truncated: bool = False, token: str = "t",
               encoded: bool = False) -> bytes:
    contents = "".join(f"<Contents><Key>{escape(k)}</Key><Size>{v}</Size></Contents>"
                       for k, v in keys.items())
    more = (f"<IsTruncated>true</IsTruncated><NextContinuationToken>{token}"
            "</NextContinuationToken>") if truncated else "<IsTruncated>false</IsTruncated>"
    coding = "<EncodingType>url</EncodingType>" if encoded else ""
    return ("<?xml version='1.0' encoding='UTF-8'?><ListBucketResult xmlns='http://s3."
            f"amazonaws.com/doc/2006-03-01/'><Name>bkt</Name><Prefix>loras/</Prefix>{coding}"
            f"<KeyCount>{len(keys)}</KeyCount><MaxKeys>1000</MaxKeys>{more}{contents}"
            "</ListBucketResult>").encode()


def s3_keys(ctx: Ctx) -> dict[str, int]:
    return {"loras/a/adapter_config.json": len(ctx.config),
            "loras/a/adapter_model.safetensors": len(ctx.weights)}


def is_listing(seen: Seen) -> bool:
    return seen.path.rstrip("/") == "/bkt" and "list-type" in seen.query


def s3(ctx: Ctx, listing: Behaviour | None = None, files: Behaviour | None = None) -> str:
    """An S3 API on ``main`` (path-style): ``listing`` answers ListObjectsV2, ``files`` the
    GetObject reads."""
    keys = s3_keys(ctx)
    listed = listing or reply(200, s3_listing(keys), {"Content-Type": "application/xml"})
    served = files or serve_files({"/bkt/loras/a/adapter_config.json": ctx.config,
                                   "/bkt/loras/a/adapter_model.safetensors": ctx.weights})
    ctx.main.route = lambda seen: listed if is_listing(seen) else served
    return "s3://bkt/loras/"


def http(ctx: Ctx, files: Behaviour | None = None) -> str:
    served = files or serve_files({"/a/adapter_config.json": ctx.config,
                                   "/a/adapter_model.safetensors": ctx.weights})
    ctx.main.route = lambda seen: served
    return f"{ctx.main.url}/a"


def weights_path(seen: Seen) -> bool:
    return seen.path.endswith("adapter_model.safetensors")


def on_weights(bad: Behaviour, good: Behaviour) -> Behaviour:
    """``bad`` for the weights, ``good`` for the rest."""
    def behave(conn: object, seen: Seen) -> bool:
        return (bad if weights_path(seen) else good)(conn, seen)  # type: ignore[arg-type]
    return behave


# --- after: what the servers saw -------------------------------------------------------------


def other_unreached(ctx: Ctx) -> None:
    assert ctx.other.connections == 0, [s.target for s in ctx.other.seen]


def other_saw_no_credential(ctx: Ctx) -> None:
    assert ctx.other.seen, "the attack expects the other origin to be read (without a token)"
    for seen in ctx.other.seen:
        assert "authorization" not in seen.headers, seen.headers
        assert TOKEN not in json.dumps(seen.headers) and AWS_KEY not in json.dumps(seen.headers)


def only_the_listing_read(ctx: Ctx) -> None:
    reads = [s.path for s in ctx.main.seen if not (is_tree(s) or is_listing(s))]
    assert not reads, f"read after a listing that leaves its folder: {reads}"
    other_unreached(ctx)


def token_only_to_main(ctx: Ctx) -> None:
    assert all(s.headers.get("authorization") == f"Bearer {TOKEN}" for s in ctx.main.seen)
    other_unreached(ctx)


# --- credential: a token sent to another origin ------------------------------------------------


def _link_next_elsewhere(ctx: Ctx) -> str:
    ctx.other.route = lambda seen: hub_tree(hub_entries(ctx, "b"))
    link = f'<{ctx.other.url}/api/models/{ORG}/{REPO}/tree/main?cursor=2>; rel="next"'
    return hub(ctx, hub_tree(hub_entries(ctx), {"Link": link}))


def _link_next_userinfo(ctx: Ctx) -> str:
    ctx.other.route = lambda seen: hub_tree([])
    # the same host written with user info, and the port of another server
    link = f'<http://evil@127.0.0.1:{ctx.other.port}/api/models/x>; rel="next"'
    return hub(ctx, hub_tree(hub_entries(ctx), {"Link": link}))


def _tree_redirect_elsewhere(ctx: Ctx) -> str:
    ctx.other.route = lambda seen: hub_tree(hub_entries(ctx))
    return hub(ctx, reply(302, headers={
        "Location": f"{ctx.other.url}/api/models/{ORG}/{REPO}/tree/main"}))


def _resolve_redirect_to_cdn(ctx: Ctx) -> str:
    files = {"/cdn/a/adapter_config.json": ctx.config,
             "/cdn/a/adapter_model.safetensors": ctx.weights}
    ctx.other.route = lambda seen: serve_files(files)

    def redirect(conn: object, seen: Seen) -> bool:
        name = seen.path.rsplit("/", 1)[-1]
        return reply(302, headers={"Location": f"{ctx.other.url}/cdn/a/{name}"})(
            conn, seen)  # type: ignore[arg-type]
    return hub(ctx, hub_tree(hub_entries(ctx)), redirect)


def _http_redirect_elsewhere(ctx: Ctx) -> str:
    ctx.other.route = lambda seen: serve_files({})
    http(ctx, reply(302, headers={"Location": f"{ctx.other.url}/a/adapter_config.json"}))
    return f"http://user:pw@127.0.0.1:{ctx.main.port}/a"


def _s3_redirect_elsewhere(ctx: Ctx) -> str:
    ctx.other.route = lambda seen: serve_files({})
    moved = reply(307, b"<Error><Code>TemporaryRedirect</Code><Endpoint>127.0.0.1:"
                  + str(ctx.other.port).encode() + b"</Endpoint></Error>",
                  {"Location": f"{ctx.other.url}/bkt/loras/a/adapter_config.json",
                   "Content-Type": "application/xml"})
    return s3(ctx, files=moved)


# --- path: listed paths that leave their folder ------------------------------------------------


def _hub_listed(path: str) -> Callable[[Ctx], str]:
    def build(ctx: Ctx) -> str:
        entries = [{"type": "file", "path": f"{path}/adapter_config.json", "size": 10},
                   {"type": "file", "path": f"{path}/adapter_model.safetensors", "size": 10},
                   *hub_entries(ctx)]
        return hub(ctx, hub_tree(entries))
    return build


def _s3_listed(key: str, encoded: bool = False) -> Callable[[Ctx], str]:
    def build(ctx: Ctx) -> str:
        keys = {key: len(ctx.config), **s3_keys(ctx)}
        return s3(ctx, reply(200, s3_listing(keys, encoded=encoded),
                             {"Content-Type": "application/xml"}))
    return build


# --- time: reads that outlast the documented timeouts --------------------------------------------


def _hub_endless_pages(ctx: Ctx) -> str:
    def page(conn: object, seen: Seen) -> bool:
        n = int(seen.query.get("cursor", ["0"])[0]) + 1
        link = f'<{ctx.main.url}/api/models/{ORG}/{REPO}/tree/main?cursor={n}>; rel="next"'
        return hub_tree([], {"Link": link})(conn, seen)  # type: ignore[arg-type]
    return hub(ctx, page)


def _hub_page_links_itself(ctx: Ctx) -> str:
    link = f'<{ctx.main.url}/api/models/{ORG}/{REPO}/tree/main>; rel="next"'
    return hub(ctx, hub_tree(hub_entries(ctx), {"Link": link}))


def _hub_slow_pages(ctx: Ctx) -> str:
    def page(conn: object, seen: Seen) -> bool:
        import time

        time.sleep(0.5)
        n = int(seen.query.get("cursor", ["0"])[0]) + 1
        link = f'<{ctx.main.url}/api/models/{ORG}/{REPO}/tree/main?cursor={n}>; rel="next"'
        return hub_tree([], {"Link": link})(conn, seen)  # type: ignore[arg-type]
    return hub(ctx, page)


def _s3_endless_pages(ctx: Ctx) -> str:
    return s3(ctx, reply(200, s3_listing({}, truncated=True), {"Content-Type": "application/xml"}))


def _retry_after(value: str, status: int = 429) -> Callable[[Ctx], str]:
    def build(ctx: Ctx) -> str:
        return http(ctx, reply(status, b"slow down", {"Retry-After": value}))
    return build


_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Padding: "
         + b"x" * 4000 + b"\r\nContent-Length: 2\r\n\r\n{}")


# --- the attacks ---------------------------------------------------------------------------------

REMOTE_ATTACKS: tuple[RemoteAttack, ...] = (
    # credential ---------------------------------------------------------------------------------
    RemoteAttack(
        "hub-link-next-other-origin", "credential",
        "A Hub tree page's `Link: <...>; rel=\"next\"` to another origin made `HF_TOKEN=x "
        "lora-guard check hf://org/repo` send `Authorization: Bearer x` there.",
        _link_next_elsewhere, ("LG108", "next page is on another host", "not followed"),
        seconds=DEADLINE, after=token_only_to_main),
    RemoteAttack(
        "hub-link-next-userinfo", "credential",
        "The same, with user info in the link (`http://evil@127.0.0.1:OTHER/`).",
        _link_next_userinfo, ("LG108", "another host"), seconds=DEADLINE,
        after=token_only_to_main),
    RemoteAttack(
        "hub-tree-redirect-other-origin", "credential",
        "The tree endpoint answers 302 to another origin.",
        _tree_redirect_elsewhere, ("LG140", "redirected to another host", "not followed"),
        seconds=DEADLINE, after=token_only_to_main),
    RemoteAttack(
        "hub-resolve-redirect-cdn", "credential",
        "A file read redirects to another origin (the Hub's CDN does): followed, without the "
        "token.", _resolve_redirect_to_cdn, ('"ok": true',), seconds=DEADLINE,
        after=other_saw_no_credential),
    RemoteAttack(
        "http-redirect-other-origin-with-userinfo", "credential",
        "An HTTP adapter URL with user:password@ redirects to another origin.",
        _http_redirect_elsewhere, ("LG140", "redirected to another host"), seconds=DEADLINE,
        after=other_unreached),
    RemoteAttack(
        "s3-redirect-other-origin", "credential",
        "An S3 endpoint answers 307 TemporaryRedirect to another origin.",
        _s3_redirect_elsewhere, ("LG140", "keeps redirecting"), seconds=DEADLINE,
        after=other_unreached),
    # path ---------------------------------------------------------------------------------------
    *(RemoteAttack(
        f"hub-listed-{name}", "path",
        f"A Hub tree entry whose path {what} is normalised into the URL: another repository's "
        "adapter_config.json read with the user's token and reported as this adapter's.",
        _hub_listed(path), ("LG108", "not read", says), seconds=DEADLINE,
        after=only_the_listing_read)
      for name, what, path, says in (
          ("dotdot", "holds `..` segments", "a/../../../other/secret/resolve/main", "'..'"),
          ("absolute", "is absolute", "/other/secret/resolve/main", "absolute"),
          ("encoded-dotdot", "holds `%2e%2e`", "a/%2e%2e/%2e%2e/other", "encoded '..'"),
          ("double-encoded", "holds `%252e%252e`", "a/%252e%252e/x", "encoded '..'"),
          ("encoded-slash", "holds `%2f`", "a%2f..%2f..%2fother", "encoded"),
          ("backslash", "holds backslashes", "a\\..\\..\\other", "backslash"),
          ("dot", "holds `.` and empty segments", "a/./b//c", "segment"),
          ("control", "holds a newline", "a/\n/b", "control character"))),
    RemoteAttack(
        "s3-listed-dotdot", "path",
        "An S3 listing names a key with `..` segments under the prefix.",
        _s3_listed("loras/../secret/adapter_config.json"), ("LG108", "'..'", "not read"),
        seconds=DEADLINE, after=only_the_listing_read),
    RemoteAttack(
        "s3-listed-url-encoded-dotdot", "path",
        "An S3 listing with EncodingType=url names `loras/%2E%2E/secret/...` (botocore decodes "
        "it to `..`).", _s3_listed("loras/%2E%2E/secret/adapter_config.json", encoded=True),
        ("LG108", "'..'", "not read"), seconds=DEADLINE, after=only_the_listing_read),
    # time ---------------------------------------------------------------------------------------
    RemoteAttack(
        "http-headers-byte-at-a-time", "time",
        "A server that sends its reply's headers one byte every 50 ms: no read ever times out "
        "(the per-read timeout is 2 s).", lambda ctx: http(ctx, trickle(_HEAD)),
        ("LG140", "deadline"), seconds=DEADLINE + 1.5),
    RemoteAttack(
        "http-body-byte-at-a-time", "time",
        "A 200 whose body comes one byte every 50 ms.",
        lambda ctx: http(ctx, trickled_reply(200)), ("LG140", "deadline"),
        seconds=DEADLINE + 1.5),
    RemoteAttack(
        "hub-error-body-byte-at-a-time", "time",
        "A 404 whose body never ends, one byte every 50 ms.",
        lambda ctx: hub(ctx, trickled_reply(404, headers={"X-Error-Code": "RepoNotFound"})),
        ("LG140", "deadline"), seconds=DEADLINE + 1.5),
    RemoteAttack(
        "s3-headers-byte-at-a-time", "time",
        "An S3 endpoint that sends GetObject's reply one byte every 50 ms.",
        lambda ctx: s3(ctx, files=trickle(_HEAD)), ("LG140", "deadline"),
        seconds=DEADLINE + 1.5),
    RemoteAttack(
        "https-silent-handshake", "time",
        "An https:// server that accepts the connection and never answers the TLS handshake "
        "(the per-read timeout is 30 s here).",
        lambda ctx: (http(ctx, trickle(b"")), f"https://127.0.0.1:{ctx.main.port}/a")[1],
        ("LG140", "deadline"), seconds=DEADLINE + 1.5, env={"LORA_GUARD_REMOTE_TIMEOUT": "30"}),
    RemoteAttack(
        "retry-after-a-billion-seconds", "time",
        "`Retry-After: 1000000000` on every reply.", _retry_after("1000000000"),
        ("LG140", "Retry-After", "deadline"), seconds=1.5),
    RemoteAttack(
        "retry-after-year-9999", "time",
        "`Retry-After` as an HTTP date in the year 9999.",
        _retry_after("Fri, 31 Dec 9999 23:59:59 GMT", status=503),
        ("LG140", "Retry-After", "deadline"), seconds=1.5),
    RemoteAttack(
        "retry-after-nan-and-negative", "time",
        "`Retry-After: nan` (then the client's own backoff), as `-1e308` or `inf` would be.",
        _retry_after("nan"), ("LG140", "HTTP 429 after retries"), seconds=DEADLINE),
    RemoteAttack(
        "hub-tree-pages-forever", "time",
        "A tree whose every page is empty and links to the next one, forever.",
        _hub_endless_pages, ("LG108", "more than 1,000 pages"), seconds=30,
        env={"LORA_GUARD_REMOTE_DEADLINE": "60"}),
    RemoteAttack(
        "hub-tree-page-links-itself", "time",
        "A tree page whose next link is itself.", _hub_page_links_itself,
        ("LG108", "more than 1,000 pages"), seconds=30,
        env={"LORA_GUARD_REMOTE_DEADLINE": "60"}),
    RemoteAttack(
        "hub-tree-slow-pages-forever", "time",
        "Pages forever, each taking 0.5 s: the listing's one deadline ends it.",
        _hub_slow_pages, ("LG140", "deadline"), seconds=DEADLINE + 1.5),
    RemoteAttack(
        "s3-listing-pages-forever", "time",
        "An S3 listing that is always truncated, with the same continuation token.",
        _s3_endless_pages, ("more than 1,000 pages",), seconds=30,
        env={"LORA_GUARD_REMOTE_DEADLINE": "60"}),
    # memory -------------------------------------------------------------------------------------
    RemoteAttack(
        "http-error-body-endless", "memory",
        "A 404 whose body never ends (fast): read whole, it fills memory.",
        lambda ctx: http(ctx, endless(404)), ("LG140", "not found (HTTP 404)"),
        seconds=DEADLINE),
    RemoteAttack(
        "http-503-body-endless-retried", "memory",
        "A 503 with an endless body, retried: each try reads 64 KiB at most.",
        lambda ctx: http(ctx, endless(503)), ("LG140", "HTTP 503 after retries"),
        seconds=DEADLINE),
    RemoteAttack(
        "hub-error-body-gzip-bomb", "memory",
        "A 404 whose gzip body decodes to 256 MiB.",
        lambda ctx: hub(ctx, compressed(404, bomb(), "gzip",
                                        {"X-Error-Code": "RepoNotFound"})),
        ("LG140", "repo not found"), seconds=DEADLINE),
    RemoteAttack(
        "hub-tree-page-deflate-bomb", "memory",
        "A tree page whose deflate body decodes to 256 MiB (past the 16 MiB page cap).",
        lambda ctx: hub(ctx, compressed(200, bomb(coding="deflate"), "deflate")),
        ("LG108", "larger than 16,777,216 bytes"), seconds=DEADLINE,
        max_mib=48),
    RemoteAttack(
        "hub-tree-page-endless", "memory",
        "A tree page that never ends: `[` then entries, forever.",
        lambda ctx: hub(ctx, endless(200, chunk=b'{"type":"file","path":"x","size":1},' * 1000,
                                     prefix=b"[")),
        ("LG108", "larger than 16,777,216 bytes"), seconds=DEADLINE,
        max_mib=48),
    RemoteAttack(
        "http-config-gzip-bomb", "memory",
        "adapter_config.json served gzip-encoded (not asked for), decoding to 256 MiB.",
        lambda ctx: http(ctx, on_weights(serve_files({}), compressed(
            200, bomb(), "gzip"))),
        ("LG108", "adapter_config.json", "10000000"), seconds=DEADLINE,
        max_mib=40),
    RemoteAttack(
        "http-ignores-range-endless", "memory",
        "An HTTP server that ignores Range and answers 200 with an endless body.",
        lambda ctx: http(ctx, on_weights(endless(200, chunk=b"\0" * 65536),
                                         serve_files({"/a/adapter_config.json": ctx.config}))),
        ("LG108", "adapter_model.safetensors"), seconds=DEADLINE),
    RemoteAttack(
        "s3-ignores-range-huge-object", "memory",
        "An S3 endpoint that ignores Range: GetObject answers 200 with the whole object, "
        "endless.", lambda ctx: s3(ctx, files=on_weights(
            endless(200, chunk=b"\0" * 65536),
            serve_files({"/bkt/loras/a/adapter_config.json": ctx.config}))),
        ("LG108", "adapter_model.safetensors"), seconds=DEADLINE),
    RemoteAttack(
        "s3-error-body-endless", "memory",
        "An S3 endpoint whose 500 error body never ends (botocore parses error bodies whole).",
        lambda ctx: s3(ctx, files=endless(500, {"Content-Type": "application/xml"},
                                          prefix=b"<Error><Code>")),
        ("LG140", "after retries"), seconds=DEADLINE),
    RemoteAttack(
        "s3-listing-page-endless", "memory",
        "An S3 listing page that never ends (parsed whole before any limit applied).",
        lambda ctx: s3(ctx, endless(200, {"Content-Type": "application/xml"},
                                    chunk=b"<Contents><Key>loras/x</Key><Size>1</Size>"
                                    b"</Contents>" * 500, prefix=b"<ListBucketResult>")),
        ("LG108", "listing page larger than 16,777,216 bytes"), seconds=DEADLINE,
        max_mib=64),
    RemoteAttack(
        "s3-listing-gzip-bomb", "memory",
        "An S3 listing page gzip-encoded, decoding to 256 MiB.",
        lambda ctx: s3(ctx, compressed(200, bomb(), "gzip")),
        ("LG108", "listing page larger than"), seconds=DEADLINE,
        max_mib=64),
)


def build_adapter(root: Path) -> tuple[bytes, bytes]:
    """A valid adapter's ``(adapter_config.json, adapter_model.safetensors)`` bytes."""
    from hostile.corpus import adapter

    folder = adapter(root)
    return ((folder / "adapter_config.json").read_bytes(),
            (folder / "adapter_model.safetensors").read_bytes())
