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
import os
import pathlib
import re
import threading
from collections.abc import Mapping, Sequence

from lora_guard._core.config import refuse
from lora_guard._reading.adapters import AdapterSpec, build_spec
from lora_guard._reading.config import added_tokens_of, checked_config, parse_config
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
from lora_guard._reading.stores import (
    _HTTP,
    _S3,
    EXTRA,
    RemoteError,
    RemoteSetupError,
    Settings,
    _Hub,
    _not_found,
    _Reader,
    _redact,
    _short,
    _Store,
    settings,
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




_SCHEMES = ("hf://", "s3://", "http://", "https://")


_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"


_HUB_ID = re.compile(rf"{_NAME}/{_NAME}")




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
