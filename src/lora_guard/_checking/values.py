"""The opt-in value scan: what the header cannot tell (``check_adapters(scan_values=True)``).

An adapter that loads and does nothing is the most common silent failure: an untrained or
lost ``lora_B`` left at zero (LG119), or weights that became NaN or Inf in training (LG120).
Both need the values. This module streams ``adapter_model.safetensors`` once through one
reused buffer of `CHUNK` bytes (``os.preadv``: no allocation per read; memory stays bounded
whatever the file's size; consecutive small tensors come from one read), without torch.
With numpy installed, each tensor's bytes are tested in place through numpy views of the
buffer: one or two reductions per chunk (the max of the 16-bit patterns as unsigned and as
signed integers; a BLAS dot product for 32/64-bit floats) tell a chunk free of NaN and Inf
and whether it is all zeros; only a chunk that may hold a NaN or Inf is counted exactly.
Without numpy, a ``memcmp`` against zeros and the exponent bytes through strided slices,
``bytes.translate`` and big-integer bit operations (pure Python, in C, about ten times
slower): the scan works, slower.

(A scaling of zero, ``lora_alpha`` 0, is in the config: every check reports it, LG121.)
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from lora_guard._core.errors import Violation, make_violation
from lora_guard._reading.adapters import AdapterSpec, Malformed
from lora_guard._reading.files import open_regular
from lora_guard._reading.safetensors import HeaderError, TensorInfo, read_header_from_fd

__all__ = ["CHUNK", "scan_violations", "tensor_stats"]

CHUNK = 1 << 19
"""Bytes read at a time (512 KiB, a multiple of every element width): small enough for the
tests on a chunk to run on data still in the CPU's cache, large enough for few reads."""

_WIDTH = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
_EXPONENT = {"float16": 0x7C00, "bfloat16": 0x7F80, "float32": 0x7F800000,
             "float64": 0x7FF0000000000000}
"""The exponent bits of each float dtype: all set in a NaN or an Inf (and nowhere else)."""
_SIGN_BIT = {dtype: 1 << (8 * width - 1) for dtype, width in _WIDTH.items()}


def _keep(predicate: object) -> bytes:
    """``translate``'s delete argument that keeps the bytes ``predicate`` accepts."""
    return bytes(b for b in range(256) if not predicate(b))  # type: ignore[operator]


def _ones(predicate: object) -> bytes:
    """A ``translate`` table: 1 for the bytes ``predicate`` accepts, 0 for the rest."""
    return bytes(1 if predicate(b) else 0 for b in range(256))  # type: ignore[operator]


# (byte index in a little-endian element, byte test) conditions whose AND marks an element.
# Non-finite: the exponent bits all ones. Inf: that, and a zero mantissa.
_NONFINITE = {
    "float16": ((1, lambda b: b & 0x7C == 0x7C),),
    "bfloat16": ((1, lambda b: b & 0x7F == 0x7F), (0, lambda b: b & 0x80)),
    "float32": ((3, lambda b: b & 0x7F == 0x7F), (2, lambda b: b & 0x80)),
    "float64": ((7, lambda b: b & 0x7F == 0x7F), (6, lambda b: b & 0xF0 == 0xF0)),
}
_INF = {
    "float16": ((1, lambda b: b & 0x7F == 0x7C), (0, lambda b: b == 0)),
    "bfloat16": ((1, lambda b: b & 0x7F == 0x7F), (0, lambda b: b == 0x80)),
    "float32": ((3, lambda b: b & 0x7F == 0x7F), (2, lambda b: b == 0x80), (1, lambda b: b == 0),
                (0, lambda b: b == 0)),
    "float64": ((7, lambda b: b & 0x7F == 0x7F), (6, lambda b: b == 0xF0),
                *((i, lambda b: b == 0) for i in range(6))),
}
_FAST = {dtype: (conds[0][0], _keep(conds[0][1])) for dtype, conds in _NONFINITE.items()}
_TABLES = {
    (name, dtype): tuple((index, _ones(test)) for index, test in conds)
    for name, table in (("nonfinite", _NONFINITE), ("inf", _INF))
    for dtype, conds in table.items()
}


def _count(chunk: bytes, dtype: str, kind: str) -> int:
    """Elements of ``chunk`` meeting every condition of ``kind``: each condition's bytes
    turned into 0/1 bytes, the results AND-ed as big integers, the set bits counted."""
    width = _WIDTH[dtype]
    marks = -1
    for index, table in _TABLES[(kind, dtype)]:
        marks &= int.from_bytes(chunk[index::width].translate(table), "little")
        if not marks:
            return 0
    return int(marks.bit_count()) if marks > 0 else 0


def _nonfinite(chunk: bytes, dtype: str) -> tuple[int, int]:
    """(NaN, Inf) counts of one chunk; a candidate-free chunk costs one slice and one
    ``translate`` of its exponent bytes."""
    index, delete = _FAST[dtype]
    if not chunk[index::_WIDTH[dtype]].translate(None, delete):
        return 0, 0
    bad = _count(chunk, dtype, "nonfinite")
    inf = _count(chunk, dtype, "inf") if bad else 0
    return bad - inf, inf


def _numpy() -> Any:
    """numpy when it is installed (it makes the scan about ten times faster), else None."""
    try:
        import numpy
    except ImportError:
        return None
    return numpy


_NP = _numpy()


def _exact_np(unsigned: Any, dtype: str) -> tuple[int, int]:
    np, exponent = _NP, _EXPONENT[dtype]
    bad = int(np.count_nonzero((unsigned & exponent) == exponent))
    inf = int(np.count_nonzero((unsigned & (_SIGN_BIT[dtype] - 1)) == exponent))
    return bad - inf, inf


def _stats_np(buf: bytearray, offset: int, size: int, dtype: str) -> tuple[bool, int, int]:
    """(all zero, NaN, Inf) of ``size`` bytes of ``buf`` from ``offset``, with numpy and no
    copy. A chunk without NaN or Inf costs one or two reductions over views of the buffer:
    for 16-bit floats, the max of the elements as unsigned integers (0: all zero; at least
    the exponent mask with the sign bit: a negative NaN or Inf) and as signed ones (at least
    the exponent mask: a positive one); for 32/64-bit floats, one BLAS dot product (a NaN or
    Inf makes it non-finite, all zeros make it 0). Only a chunk that may hold some counts
    them exactly."""
    np, width = _NP, _WIDTH.get(dtype)
    if width is None or size < width:  # not a float: only the zero test
        return not np.frombuffer(buf, np.uint8, size, offset).any(), 0, 0
    unsigned = np.frombuffer(buf, f"<u{width}", size // width, offset)
    exponent = _EXPONENT[dtype]
    if width == 2:
        top = int(unsigned.max())
        if top == 0:
            return True, 0, 0
        if top < exponent | _SIGN_BIT[dtype] and int(unsigned.view("<i2").max()) < exponent:
            return False, 0, 0
        return (False, *_exact_np(unsigned, dtype))
    floats = unsigned.view(f"<f{width}")
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf are what we look for
        square = float(np.dot(floats, floats))
    if square == 0.0:  # zeros, or values so small that their squares underflow
        return not unsigned.any(), 0, 0
    if math.isfinite(square):  # (finite values above 1e19 overflow it: then counted exactly)
        return False, 0, 0
    return (False, *_exact_np(unsigned, dtype))


def _stats_py(buf: bytearray, offset: int, size: int, dtype: str) -> tuple[bool, int, int]:
    """`_stats_np` without numpy: a ``memcmp`` against zeros, then `_nonfinite`."""
    chunk = bytes(buf[offset:offset + size])
    if chunk == bytes(size):
        return True, 0, 0
    nan, inf = _nonfinite(chunk, dtype) if dtype in _WIDTH else (0, 0)
    return False, nan, inf


def _read_at(fd: int, buf: bytearray, offset: int) -> int:
    """Fill ``buf`` from byte ``offset`` of ``fd`` (``os.preadv`` into the reused buffer, no
    allocation; ``os.pread`` and a copy where there is no preadv); the count read."""
    if hasattr(os, "preadv"):
        return os.preadv(fd, [buf], offset)
    data = os.pread(fd, len(buf), offset)
    buf[:len(data)] = data
    return len(data)


class _Window:
    """The file's bytes ``[start, start + size)`` held in one reused buffer of `CHUNK` bytes:
    consecutive small tensors are served from one read, a large one is read chunk by chunk;
    every byte is read once (but the few bytes of an element cut by a window's end)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buf, self.start, self.size = fd, bytearray(max(CHUNK, 8)), 0, 0

    def _whole(self, position: int, end: int, width: int) -> int:
        """Bytes of whole elements of ``[position, end)`` in the window, from ``position``."""
        if not self.start <= position < self.start + self.size:
            return 0
        available = min(end, self.start + self.size) - position
        return available - available % width if available < end - position else available

    def segment(self, position: int, end: int, width: int) -> tuple[int, int]:
        """(offset in `buf`, size) of the next whole elements of ``[position, end)``, read
        from ``position`` when the window holds none of them."""
        available = self._whole(position, end, width)
        if available <= 0:
            self.start, self.size = position, _read_at(self.fd, self.buf, position)
            available = self._whole(position, end, width)
        if available <= 0:
            raise OSError("the file shrank while it was scanned")
        return position - self.start, available


def tensor_stats(fd: int, start: int, info: TensorInfo,
                 window: _Window | None = None) -> tuple[bool, int, int]:
    """(all zero, NaN count, Inf count) of one tensor whose data starts at byte ``start`` of
    the file open as ``fd``, read in chunks of at most `CHUNK` bytes into one reused buffer.

    Example:
        >>> import os, tempfile, struct
        >>> from lora_guard._reading.safetensors import TensorInfo
        >>> fd, path = tempfile.mkstemp()
        >>> _ = os.write(fd, struct.pack("<4f", 0.0, float("nan"), float("inf"), 1.0))
        >>> tensor_stats(fd, 0, TensorInfo(shape=(4,), dtype="float32", nbytes=16))
        (False, 1, 1)
        >>> os.close(fd); os.remove(path)
    """
    window = window if window is not None else _Window(fd)
    stats = _stats_np if _NP is not None else _stats_py
    width = _WIDTH.get(info.dtype, 1)
    zero, nan, inf = True, 0, 0
    position, end = start, start + info.nbytes
    while position < end:
        offset, size = window.segment(position, end, width)
        position += size
        more_zero, more_nan, more_inf = stats(window.buf, offset, size, info.dtype)
        zero, nan, inf = zero and more_zero, nan + more_nan, inf + more_inf
    return zero, nan, inf


def _more(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]} and {len(names) - 1} more"


def scan_violations(spec: AdapterSpec, subject: str) -> list[Violation]:
    """LG119 (lora_B all zeros) and LG120 (NaN/Inf) from the values of a local adapter's
    weights, each tensor read once; nothing for a remote adapter or a spec without a
    weights file (only headers are read there).

    The file is opened again as strictly as `lora_guard.inspect_adapter` opens it, and its
    header read again from the same descriptor, so the values scanned are the file's.

    Example:
        >>> import tempfile, lora_guard as lg
        >>> from lora_guard.testing import write_adapter
        >>> from lora_guard._checking.values import scan_violations
        >>> spec = lg.inspect_adapter(write_adapter(tempfile.mkdtemp() + "/untrained"))
        >>> [v.code for v in scan_violations(spec, "adapter 'untrained'")]
        ['LG119']
    """
    if spec.url is not None or spec.weights_file is None:
        return []
    try:
        opened = open_regular(spec.path, spec.weights_file)
        if opened is None:
            raise Malformed(spec.weights_file, "disappeared before its values were scanned")
        fd, stat = opened
        try:
            tensors, _, _ = read_header_from_fd(fd, stat.st_size)
            header = int.from_bytes(os.pread(fd, 8, 0), "little")
            window = _Window(fd)
            stats = {key: tensor_stats(fd, 8 + header + info.offsets[0], info, window)
                     for key, info in sorted(tensors.items(), key=lambda kv: kv[1].offsets)}
        finally:
            os.close(fd)
    except HeaderError as exc:
        return [make_violation("LG108", "malformed", subject, file=spec.weights_file,
                               problem=f"{exc.problem} (when its values were scanned)")]
    except (Malformed, OSError) as exc:
        problem = exc.problem if isinstance(exc, Malformed) else (
            f"cannot be read ({exc.strerror or exc})")
        return [make_violation("LG108", "malformed", subject, file=spec.weights_file,
                               problem=problem)]
    return _findings(spec, subject, tensors, stats)


def _findings(spec: AdapterSpec, subject: str, tensors: Mapping[str, TensorInfo],
              stats: Mapping[str, tuple[bool, int, int]]) -> list[Violation]:
    found: list[Violation] = []
    for key, (_, nan, inf) in stats.items():
        if nan or inf:
            found.append(make_violation("LG120", "values", subject, key=key, nan=nan, inf=inf,
                                        numel=tensors[key].numel))
    with_b = [m for m in spec.modules.values() if m.b_key in stats]
    zero_b = [m.module for m in with_b if m.b_key is not None and stats[m.b_key][0]
              and tensors[m.b_key].numel > 0]
    if zero_b and len(zero_b) == len(with_b):
        found.append(make_violation("LG119", "all", subject, count=len(with_b),
                                    modules=_more(zero_b)))
    elif zero_b:
        found.append(make_violation("LG119", "some", subject, count=len(zero_b),
                                    total=len(with_b), modules=_more(zero_b)))
    return found
