"""A strict safetensors header reader (and the tiny writer the test helpers use).

The reader reads the 8-byte length and the JSON header, never the tensor data, and never
trusts either: the header length is capped (and never read past the end of the file), the JSON
must be a flat object without duplicate keys or deep nesting, every dtype must be known, every
shape a list of non-negative integers whose size matches its byte range, and the byte ranges
must be contiguous, non-overlapping and cover the data section exactly. Any problem raises
`HeaderError` with a one-line ``problem`` that callers turn into an LG108 violation.

Entry point for the fuzzers: ``read_safetensors_header(path) -> (tensors, metadata)``.
"""

from __future__ import annotations

import json
import marshal
import math
import os
import stat
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from lora_guard._core.frozen import builder
from lora_guard._reading.bounded import Bounded

__all__ = [
    "DTYPE_BITS",
    "DTYPE_NAMES",
    "MAX_HEADER_BYTES",
    "DuplicateKey",
    "HeaderError",
    "NonFinite",
    "Entries",
    "TensorInfo",
    "encode_header",
    "header_bytes_from_fd",
    "header_entries",
    "header_length",
    "key_count",
    "parse_header",
    "read_header_and_size",
    "read_header_from_fd",
    "read_safetensors_header",
    "safetensors_code",
    "strict_json",
    "write_safetensors",
]

MAX_HEADER_BYTES = 100_000_000
"""The header length cap of the reference reader (100 MB)."""

MAX_NESTING = 3
"""Deepest JSON nesting of a valid header: ``{name: {"shape": [..]}}`` is 3 levels."""

MAX_NDIM = 64
"""More dims than any real tensor has; a longer shape is refused."""

MAX_HEADER_VALUES = 2_000_000
"""Most JSON values a header may hold (counted before parsing, as commas, colons and brackets
outside nothing: an upper bound). A real adapter has about 8 per tensor, so this is 250,000
tensors; it bounds the parse's memory to about 200 MB whatever the header holds (a 100 MB
header of ``[[],[],...]`` would otherwise take 2.5 GB)."""

_WHITESPACE = b" \t\n\r"

DTYPE_BITS: Mapping[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64,
    "F64": 64, "I64": 64, "U64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
"""Bits per element of every safetensors dtype code."""

DTYPE_NAMES: Mapping[str, str] = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu", "I16": "int16",
    "U16": "uint16", "F16": "float16", "BF16": "bfloat16", "I32": "int32", "U32": "uint32",
    "F32": "float32", "C64": "complex64", "F64": "float64", "I64": "int64", "U64": "uint64",
    "F4": "float4_e2m1fn_x2", "F6_E2M3": "float6_e2m3fn", "F6_E3M2": "float6_e3m2fn",
}
"""torch-style dtype name of every safetensors dtype code."""

_CODES = {name: code for code, name in DTYPE_NAMES.items()}
_STR = {str}
_MAX_INT = 2**64 - 1


class HeaderError(Exception):
    """A safetensors file that cannot be read safely; ``problem`` says why, in one line."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(problem)


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor as its safetensors header describes it; the data is never read.

    Example:
        >>> import lora_guard as lg
        >>> info = lg.TensorInfo(shape=(8, 64), dtype="float16", nbytes=1024)
        >>> info.numel, info.shape
        (512, (8, 64))
    """

    shape: tuple[int, ...]
    """The tensor's shape."""
    dtype: str
    """torch-style dtype name, e.g. ``"bfloat16"``."""
    nbytes: int
    """Bytes of data in the file."""
    offsets: tuple[int, int] = (0, 0)
    """``data_offsets`` (begin, end) in the data section."""

    @property
    def numel(self) -> int:
        """Number of elements (the product of the shape)."""
        return math.prod(self.shape)


def safetensors_code(dtype: str) -> str:
    """The safetensors code (``"BF16"``) of a torch-style name (``"bfloat16"``) or a code."""
    text = str(dtype).removeprefix("torch.")
    if text in DTYPE_BITS:
        return text
    if text in _CODES:
        return _CODES[text]
    aliases = {"half": "F16", "float": "F32", "double": "F64", "long": "I64", "int": "I32"}
    if text in aliases:
        return aliases[text]
    raise ValueError(
        f"unknown dtype {dtype!r}; use one of {', '.join(sorted(_CODES))}"
    )


# --- reading -------------------------------------------------------------------------------


class DuplicateKey(ValueError):
    """A JSON object names ``key`` twice (a loader silently keeps the last value)."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"duplicate key {key[:200]!r}")


class NonFinite(ValueError):
    """A JSON text holds ``NaN``, ``Infinity`` or ``-Infinity`` (``name``), which is not JSON."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"non-standard JSON constant {name}")


def _refuse_constant(name: str) -> Any:
    raise NonFinite(name)


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return result


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


class NegativeZero(ValueError):
    """A header writes a number as ``-0``: JSON allows it, the safetensors library (whose
    shapes and offsets are unsigned integers) refuses the file."""


def _refuse_negative_zero(text: str) -> int:
    if text == "-0":
        raise NegativeZero(text)
    return int(text)


_UNSIGNED_DECODER = json.JSONDecoder(parse_constant=_refuse_constant,
                                     parse_int=_refuse_negative_zero)
_EXACT_DECODER = json.JSONDecoder(parse_constant=_refuse_constant,
                                  object_pairs_hook=_refuse_duplicates)


_JSON_SPACE = " \t\n\r"
def _decoded(text: str) -> Any:
    """``_DECODER.decode(text)``: the same value, and the same error for a text that is not
    JSON. A text that starts with its value (every config and header but a padded one) is
    read by ``raw_decode`` alone, without ``decode``'s two whitespace matches; any other text
    (leading whitespace, no value, more than JSON whitespace after the value) goes through
    ``decode`` itself, which says why it is not JSON."""
    try:
        value, end = _DECODER.raw_decode(text)
    except json.JSONDecodeError:
        return _DECODER.decode(text)
    if end != len(text) and text[end:].strip(_JSON_SPACE):
        return _DECODER.decode(text)  # (more than whitespace after the value: "Extra data")
    return value


def key_count(value: object) -> int:
    """How many keys the objects in a parsed JSON value hold, all levels counted."""
    count = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is dict:
            count += len(item)
            item = item.values()
        elif type(item) is not list:
            continue
        stack += [v for v in item if type(v) is dict or type(v) is list]
    return count


def strict_json(text: str, colons: int, keys: int | None = None) -> Any:
    """``json.loads(text)`` that refuses NaN/Infinity (`NonFinite`) and duplicate keys
    (`DuplicateKey`), at the C parser's speed.

    ``colons`` is ``text.count(":")``. Every key of the text is followed by one colon outside a
    string, so when the parsed objects hold as many keys as the text has colons (``keys``, or
    `key_count` of the result) no key was lost to a duplicate; only otherwise (a duplicate, or
    colons inside strings) is the text parsed again with a hook that names the duplicate.
    Raises ``ValueError`` (``json.JSONDecodeError``) for invalid JSON, ``RecursionError`` for
    nesting too deep for the parser.
    """
    value = _decoded(text)
    if keys is None:
        # colons >= keys in the text >= keys kept >= the top object's: a top object holding
        # as many keys as there are colons holds them all (a config whose nested objects
        # are empty, the usual one), without walking the value
        top = len(value) if type(value) is dict else -1
        keys = colons if top == colons else key_count(value)
    if colons != keys:
        _EXACT_DECODER.decode(text)  # raises DuplicateKey naming the first duplicate
    return value


def _depth(value: object, limit: int) -> int:
    """Nesting depth of a parsed JSON value, counted no deeper than ``limit``."""
    if limit <= 0 or not isinstance(value, (dict, list)):
        return 0
    items = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(v, limit - 1) for v in items), default=0)


def json_value_bound(raw: bytes, colons: int | None = None) -> int:
    """An upper bound on the number of JSON values in ``raw``, in a few C-speed passes.

    Every value but the first of a container follows a comma, every object value a colon, and
    every container opens with a bracket; counting them everywhere (strings included) can only
    over-count, so refusing above a bound never lets a bigger parse through. ``colons`` is
    ``raw.count(b":")`` when the caller has it already.
    """
    if colons is None:
        colons = raw.count(b":")
    return raw.count(b",") + raw.count(b"[") + raw.count(b"{") + colons + 1


def parse_header(raw: bytes, data_size: int) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Validate a header's bytes against a data section of ``data_size`` bytes.

    Returns ``(tensors, metadata)``; raises `HeaderError` naming the first problem.
    """
    entries, metadata = header_entries(raw, data_size)
    return dict(entries.tensors), metadata


class Entries(NamedTuple):
    """A header's tensor entries, validated (`tensor_info` of each), shared by the headers
    whose entries are the same value (`_ENTRIES`): read-only."""

    tensors: Mapping[str, TensorInfo]
    """Each entry's `TensorInfo`, in the header's order."""
    end: int
    """Where the data ends when the entries lie back to back from 0 in the header's order,
    else -1 (`_check_offsets` sorts them out)."""
    key: bytes
    """The entries' exact value (``marshal`` bytes of the parsed JSON, ``__metadata__``
    left out): equal keys, equal entries, whatever else the headers hold."""


def header_entries(raw: bytes, data_size: int) -> tuple[Entries, dict[str, str]]:
    """`parse_header`, with the entries as the reader shares them (`Entries`)."""
    if not raw.lstrip(_WHITESPACE).startswith(b"{"):  # JSON whitespace, as safetensors reads
        raise HeaderError("header does not start with a JSON object '{'")
    colons = raw.count(b":")
    values = json_value_bound(raw, colons) if len(raw) >= MAX_HEADER_VALUES else 0
    if values > MAX_HEADER_VALUES:  # (a shorter text holds fewer values than bytes)
        raise HeaderError(
            f"header holds up to {values:,} JSON values, more than the {MAX_HEADER_VALUES:,} "
            "a reader allows (memory bound)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeaderError(f"header is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        parsed = _decoded(text)
    except NonFinite as exc:
        raise HeaderError(f"non-standard JSON constant {exc.name} in the header") from None
    except RecursionError:
        raise HeaderError(f"header JSON nests deeper than {MAX_NESTING} levels") from None
    except ValueError as exc:
        raise HeaderError(f"header is not valid JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise HeaderError("header is not a JSON object")
    _no_negative_zero(raw, text)
    _no_duplicate_keys(parsed, text, colons)
    metadata: dict[str, str] = {}
    if "__metadata__" in parsed:
        metadata = _metadata(parsed.pop("__metadata__"))
    entries = _entries(parsed)
    if entries.end != data_size:  # not back to back from 0 to the end: sorted and checked
        _check_offsets(entries.tensors, data_size)
    return entries, metadata


def _no_negative_zero(raw: bytes, text: str) -> None:
    """Refuse a header that writes a number as ``-0`` (every number of a header is a shape or
    an offset, which the safetensors library reads as unsigned: it refuses ``-0``). Rare: only
    a header whose bytes hold ``-0`` somewhere (in a string too) is parsed again."""
    if b"-0" not in raw:
        return
    try:
        _UNSIGNED_DECODER.decode(text)
    except NegativeZero:
        raise HeaderError(
            "header writes a shape or data_offsets number as -0, which the safetensors "
            "library refuses (they are unsigned integers)") from None


def _no_duplicate_keys(parsed: dict[str, Any], text: str, colons: int) -> None:
    """Refuse a header that names a key twice (see `strict_json`: keys counted, not hooked)."""
    try:  # every entry an object (else it is refused below): counted in C
        keys = len(parsed) + sum(map(len, parsed.values()))
    except TypeError:  # "__metadata__": null, or an entry that is not an object
        keys = len(parsed) + sum(len(e) for e in parsed.values() if type(e) is dict)
    if keys != colons:
        try:
            _EXACT_DECODER.decode(text)
        except DuplicateKey as exc:
            raise HeaderError(f"duplicate key {exc.key[:200]!r} in the header") from None


def _metadata(entry: object) -> dict[str, str]:
    """The ``__metadata__`` strings (a spec keeps them read-only, equal ones shared)."""
    if entry is None:  # the safetensors library reads null as no metadata
        return {}
    if type(entry) is not dict or not {*map(type, entry.values())} <= _STR:  # JSON: exact types
        raise HeaderError("__metadata__ is not an object of strings")
    return entry


_built_info = builder(TensorInfo)
"""``TensorInfo(shape, dtype, nbytes, offsets)`` of checked values, at a third of the cost."""


def _entries(parsed: dict[str, Any]) -> Entries:
    """The `Entries` of a parsed header's entries (``__metadata__`` taken out): validated
    once per value (`_ENTRIES`, by their ``marshal`` bytes, which
    tell ``1``, ``1.0`` and ``true`` apart: a value that is not a valid entry never shares
    the verdict of one that is; equal values may marshal differently, which only misses)."""
    key = marshal.dumps(parsed)
    entries = _ENTRIES.get(key)
    if entries is None:
        entries = _tensor_infos(parsed, key)
        if len(key) <= _REMEMBERED_BYTES:
            _ENTRIES.put(key, entries)
    return entries


def _tensor_infos(parsed: dict[str, Any], key: bytes) -> Entries:
    """Every entry's `TensorInfo` (`tensor_info`), in the header's order, and where the data
    ends when the entries lie back to back from 0 in that order (-1 otherwise)."""
    tensors: dict[str, TensorInfo] = {}
    position = 0
    for name, entry in parsed.items():
        info = tensors[name] = tensor_info(name, entry)
        begin, end = info.offsets
        position = end if begin == position else -1
    return Entries(tensors, position, key)


_REMEMBERED_BYTES = 1 << 20
"""The largest entries `_ENTRIES` keeps, in ``marshal`` bytes (1 MiB: about 8,000 tensors),
so that its keys hold at most 64 MiB whatever the headers hold (larger entries are validated
each time they are read, in time linear in their size)."""

_ENTRIES: Bounded[bytes, Entries] = Bounded(
    64, "validated tensor entries by their exact value (at most 1 MiB each): the "
    "adapters of one base model, rank and targets repeat them whatever their metadata")


def tensor_info(name: str, entry: object) -> TensorInfo:
    """The `TensorInfo` of one header entry, or `HeaderError` naming the first rule it
    breaks: an object with ``dtype``, ``shape`` and ``data_offsets`` (nested no deeper than a
    header nests), a known dtype code, a shape of at most `MAX_NDIM` non-negative integers,
    two offsets in order, and the shape's bytes equal to the offsets' span. (A parsed JSON
    value has exact types: ``type(x) is int`` is an integer that is not a bool.)"""
    if type(entry) is not dict:
        raise HeaderError(f"tensor {name[:200]!r} is not an object with dtype, shape, "
                          "data_offsets")
    try:
        code, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    except KeyError:
        missing = [k for k in ("dtype", "shape", "data_offsets") if k not in entry]
        raise HeaderError(f"tensor {name[:200]!r} has no {', '.join(missing)}") from None
    if len(entry) > 3 and _depth(entry, MAX_NESTING) > MAX_NESTING - 1:
        raise HeaderError(f"tensor {name[:200]!r} nests JSON deeper than {MAX_NESTING} levels")
    bits = DTYPE_BITS.get(code) if type(code) is str else None
    if bits is None:
        raise HeaderError(f"tensor {name[:200]!r} has unknown dtype {str(code)[:40]!r}")
    if not _uints(shape):
        raise HeaderError(f"tensor {name[:200]!r} has shape {str(shape)[:80]}, not a list of "
                          "non-negative integers")
    if len(shape) > MAX_NDIM:
        raise HeaderError(f"tensor {name[:200]!r} has {len(shape)} dims (more than {MAX_NDIM})")
    if not _uints(offsets) or len(offsets) != 2:
        raise HeaderError(f"tensor {name[:200]!r} has data_offsets {str(offsets)[:80]}, not "
                          "two non-negative integers")
    begin, end = offsets
    if end < begin:
        raise HeaderError(f"tensor {name[:200]!r} has data_offsets [{begin}, {end}] that end "
                          "before they begin")
    size = bits * math.prod(shape)
    if size % 8 or size // 8 != end - begin:
        raise HeaderError(_size_problem(name, code, shape, size, begin, end))
    return _built_info(tuple(shape), DTYPE_NAMES[code], end - begin, (begin, end))


def _uints(values: object) -> bool:
    """A list of integers in 0 .. 2**64 - 1 (what safetensors' ``usize`` reads)."""
    if type(values) is not list:
        return False
    for value in values:  # noqa: SIM110 - a loop: all() of a generator is twice as slow here
        if type(value) is not int or value < 0 or value > _MAX_INT:
            return False
    return True


def _size_problem(name: str, code: str, shape: list[int], bits: int, begin: int,
                  end: int) -> str:
    """Why a shape of ``bits`` bits does not fill the offsets' span (`tensor_info`'s last
    rule: the shape's bytes are the offsets' span)."""
    if bits % 8:
        return f"tensor {name[:200]!r} of {code} {shape} is not a whole number of bytes"
    return (f"tensor {name[:200]!r} of {code} {shape} needs {bits // 8} bytes but its "
            f"data_offsets [{begin}, {end}] hold {end - begin}")


def _check_offsets(tensors: Mapping[str, TensorInfo], data_size: int) -> None:
    position = 0
    for info in tensors.values():  # the usual file: entries already in data order, no gap
        if info.offsets[0] != position:
            break
        position = info.offsets[1]
    else:
        if position == data_size:
            return
    position = 0
    for name, info in sorted(tensors.items(), key=lambda item: item[1].offsets):
        begin, end = info.offsets
        if begin > position:
            raise HeaderError(
                f"gap in the data: bytes {position}..{begin} belong to no tensor "
                f"(before {name[:200]!r})"
            )
        if begin < position:
            raise HeaderError(f"tensor {name[:200]!r} at [{begin}, {end}] overlaps another tensor")
        if end > data_size:
            raise HeaderError(
                f"tensor {name[:200]!r} at [{begin}, {end}] runs past the end of the data "
                f"({data_size} bytes)"
            )
        position = end
    if position != data_size:
        raise HeaderError(
            f"the tensors cover {position} of the {data_size} data bytes; the file has "
            "trailing bytes"
        )


def read_safetensors_header(
    path: str | os.PathLike[str],
) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Read and validate a safetensors file's header; never reads the tensor data.

    Returns ``(tensors, metadata)``: tensor name -> `TensorInfo`, and the ``__metadata__``
    strings. Raises `HeaderError` (with ``.problem``) for any file that is not a valid,
    self-consistent safetensors file, and `OSError` when it cannot be opened.
    """
    tensors, metadata, _ = read_header_and_size(path)
    return tensors, metadata


def header_length(first8: bytes, size: int) -> int:
    """The header length the first 8 bytes of a ``size``-byte file announce, checked against
    the cap and the file size before anything more is read; raises `HeaderError`."""
    if size < 8 or len(first8) < 8:
        raise HeaderError(f"file is {size} bytes, too short for a safetensors header")
    (length,) = struct.unpack("<Q", first8[:8])
    if length > MAX_HEADER_BYTES:
        raise HeaderError(
            f"header length {length} bytes is over the {MAX_HEADER_BYTES} byte cap"
        )
    if length > size - 8:
        raise HeaderError(
            f"header length {length} bytes runs past the end of the file ({size} bytes); "
            "the file is truncated"
        )
    if length < 2:
        raise HeaderError(f"header length {length} bytes is too short for a JSON object")
    return int(length)


OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
              | getattr(os, "O_BINARY", 0))
"""How every file is opened: never blocking (a FIFO opens at once and is then refused by
``fstat``), never inherited by a child."""


def read_header_and_size(
    path: str | os.PathLike[str],
) -> tuple[dict[str, TensorInfo], dict[str, str], int]:
    """`read_safetensors_header` plus the file's size in bytes (from the same open file)."""
    fd = os.open(path, OPEN_FLAGS)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise HeaderError("not a regular file")
        return read_header_from_fd(fd, info.st_size)
    finally:
        os.close(fd)


def _read_exactly(fd: int, count: int) -> bytes:
    chunks: list[bytes] = []
    left = count
    while left:
        chunk = os.read(fd, min(left, 1 << 24))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks) if len(chunks) != 1 else chunks[0]


def header_bytes_from_fd(fd: int, size: int) -> tuple[bytes, int]:
    """The header bytes of the regular file open as ``fd`` (of ``size`` bytes, from its
    fstat), read from its start through the descriptor only, and the size of its data
    section (not read); the length is checked, the header is not parsed."""
    if size < 8:
        raise HeaderError(f"file is {size} bytes, too short for a safetensors header")
    first = _read_exactly(fd, 8)
    if len(first) != 8:  # the file shrank after fstat
        raise HeaderError(f"header truncated: the file shrank to {len(first)} bytes while read")
    length = header_length(first, size)
    raw = _read_exactly(fd, length)
    if len(raw) != length:  # the file shrank while we read it
        raise HeaderError(f"header truncated: read {len(raw)} of {length} bytes")
    return raw, size - 8 - length


def read_header_from_fd(
    fd: int, size: int
) -> tuple[dict[str, TensorInfo], dict[str, str], int]:
    """The parsed header of the regular file open as ``fd`` (of ``size`` bytes)."""
    raw, data_size = header_bytes_from_fd(fd, size)
    tensors, metadata = parse_header(raw, data_size)
    return tensors, metadata, size


# --- writing (tests, examples, benchmarks) -------------------------------------------------


def encode_header(
    tensors: Iterable[tuple[str, str, Sequence[int]]],
    metadata: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any], int]:
    """The header object for ``(name, dtype, shape)`` entries laid out back to back.

    Returns ``(header, data_size)``; the header is a plain dict a caller may still edit.
    """
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    position = 0
    for name, dtype, shape in sorted(tensors, key=lambda t: t[0]):
        code = safetensors_code(dtype)
        nbytes = math.prod(shape) * DTYPE_BITS[code] // 8
        header[name] = {
            "dtype": code, "shape": list(shape), "data_offsets": [position, position + nbytes],
        }
        position += nbytes
    return header, position


def write_safetensors(
    path: str | os.PathLike[str],
    header: Mapping[str, Any] | bytes,
    data_size: int,
    *,
    length: int | None = None,
) -> None:
    """Write a header and ``data_size`` zero bytes of data (a sparse file where possible).

    ``header`` is a header object (serialised compactly, padded to 8 bytes) or raw bytes;
    ``length`` overrides the 8-byte length field (to write a broken file on purpose).
    """
    if isinstance(header, bytes):
        raw = header
    else:
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw) if length is None else length))
        f.write(raw)
        if data_size:
            f.truncate(8 + len(raw) + data_size)
