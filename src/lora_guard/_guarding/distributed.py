"""Tensor-parallel ranks that agree: `assert_rank_consistent`, `guard_rank_consistency`,
fingerprints.

Each rank reduces its state to a fingerprint: one line per leaf, ``path -> description``, where
a tensor contributes its shape, dtype and device *type* (never its data, never its device
index, which differs per rank by design), mappings and sets are read in sorted order (so a
hash seed cannot change the fingerprint), and sequences in their own order (a slot list's
order is state). The ranks then exchange a 16-byte digest of it over a gloo group with a
timeout; only when the digests differ do they exchange the whole fingerprints, so that every
rank can name the ranks that differ and the first difference.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import math
import re
import sys
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence, Set
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar, cast

from lora_guard._checking.checks import dtype_name, shape_of
from lora_guard._core.catalogue import INVARIANTS
from lora_guard._core.config import STATE, refuse, report
from lora_guard._core.errors import Violation, make_violation

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "DEFAULT_TIMEOUT",
    "assert_rank_consistent",
    "guard_rank_consistency",
    "rank_consistent",
    "rank_fingerprint",
]

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_TIMEOUT = 60.0
"""Seconds a rank waits for the others before `assert_rank_consistent` gives up (LG301)."""

_MAX_DEPTH = 64
_DIGEST_SIZE = 16
_OK, _FAILED = 0, 1
MIN_TIMEOUT = 0.001
"""The shortest timeout accepted: gloo counts whole milliseconds and takes 0 as "forever"."""

# The check's wire format. Each exchange opens with a preamble whose size never changes
# (that of release 0.1.0's first message, protocol 1, so a rank of any release meets one of
# the same size and gloo never aborts on a size mismatch): a marker, the protocol, the size
# of the header that follows, and the release. Ranks whose preambles differ stop there, each
# with LG301 naming the releases, before any message whose size could differ.
_PROTOCOL = 2
_MARKER = 0xA7  # protocol 1 opened with its status byte, 0 or 1
_PREAMBLE_SIZE = 25
_RELEASE_SIZE = 13


# --- the fingerprint ----------------------------------------------------------------------


def rank_fingerprint(state: Any, *, root: str = "state") -> dict[str, str]:
    """The rank-independent fingerprint of ``state``: ``path -> description``, in a fixed order.

    ``state`` is any nesting of mappings, sequences, sets, dataclasses, tensors (or tensor
    metadata: anything with ``.shape`` and ``.dtype``), ints, floats, strings, bools, None,
    enums, dtypes and devices. A tensor contributes its shape, dtype and device type only, never
    its data or device index; mapping keys and set elements are sorted, so the fingerprint does
    not depend on insertion order or on the process's hash seed; sequence order is kept.
    Anything else (a module, a lock, an arbitrary object) is a ``TypeError`` naming its path:
    pass the shapes, ids and slot maps it holds instead.

    Example:
        >>> import lora_guard as lg, torch
        >>> fp = lg.rank_fingerprint({
        ...     "uid_to_slot": {"math": 0, "code": 1},
        ...     "lora_a": torch.empty(4, 16, 64, dtype=torch.bfloat16, device="meta"),
        ... })
        >>> for path, what in fp.items():
        ...     print(path, "->", what)
        state -> mapping
        state['lora_a'] -> tensor (4, 16, 64) bfloat16 meta
        state['uid_to_slot'] -> mapping
        state['uid_to_slot']['code'] -> 1
        state['uid_to_slot']['math'] -> 0
    """
    if not isinstance(root, str) or not root:
        raise TypeError(f"lora_guard.rank_fingerprint(root=...) must be a non-empty string, "
                        f"got {root!r}")
    out: dict[str, str] = {}
    _walk(state, root, out, (), 0)
    return out


def _walk(obj: Any, path: str, out: dict[str, str], parents: tuple[int, ...], depth: int) -> None:
    leaf = _describe_leaf(obj)
    if leaf is not None:
        out[path] = leaf
        return
    if depth >= _MAX_DEPTH or id(obj) in parents:
        problem = "nests deeper than 64 levels" if depth >= _MAX_DEPTH else "contains itself"
        raise ValueError(
            f"lora_guard.rank_fingerprint: {path} {problem}; pass a plain tree of the shapes, "
            "ids and slot maps the ranks must agree on."
        )
    kind, children = _children(obj, path)
    out[path] = kind
    inner = (*parents, id(obj))
    for child_path, child in children:
        if child is _PRESENT:
            out[child_path] = "present"
        else:
            _walk(child, child_path, out, inner, depth + 1)


_PRESENT = object()  # a set's element: present, nothing below it


def _children(obj: Any, path: str) -> tuple[str, list[tuple[str, Any]]]:
    """A container's kind and its ``(path, child)`` pairs, in the fingerprint's order."""
    if isinstance(obj, Mapping):
        return "mapping", [(f"{path}[{_key_text(key, path)}]", obj[key])
                           for key in sorted(obj, key=_order)]
    if isinstance(obj, (Set, frozenset)):
        return "set", [(f"{path}{{{_key_text(item, path)}}}", _PRESENT)
                       for item in sorted(obj, key=_order)]
    if isinstance(obj, Sequence) and not isinstance(obj, (str, bytes)):
        return "sequence", [(f"{path}[{i}]", item) for i, item in enumerate(obj)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return type(obj).__name__, [(f"{path}.{f.name}", getattr(obj, f.name))
                                    for f in dataclasses.fields(obj)]
    raise TypeError(
        f"lora_guard.rank_fingerprint: {path} is a {type(obj).__module__}."
        f"{type(obj).__qualname__}, which has no rank-independent fingerprint; pass what "
        "the ranks must agree on instead (its tensors, shapes, adapter ids, slot maps) as "
        "a dict, list or dataclass of tensors, ints and strings."
    )


def _describe_leaf(obj: Any) -> str | None:
    """The description of a leaf value, or None when ``obj`` is a container."""
    kind = type(obj)
    if kind is str or kind is int or kind is bool or obj is None:  # the common leaves first
        return repr(obj)
    if kind is dict or kind is list or kind is tuple:
        return None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return (f"tensor {tuple(obj.shape)} {str(obj.dtype).removeprefix('torch.')} "
                f"{obj.device.type}")
    scalar = _describe_scalar(obj)
    if scalar is not None:
        return scalar
    if kind.__module__ == "torch":
        return _describe_torch_object(obj)
    return _describe_tensor_like(obj)


def _describe_scalar(obj: Any) -> str | None:
    """Bools, enums, ints, floats, strings and bytes (subclasses included), else None."""
    if isinstance(obj, bool):
        return repr(obj)
    if isinstance(obj, enum.Enum):
        return f"{type(obj).__name__}.{obj.name}"
    if isinstance(obj, int):
        return repr(int(obj))
    if isinstance(obj, float):
        return "nan" if math.isnan(obj) else repr(obj)
    if isinstance(obj, (str, bytes)):
        return repr(obj)
    return None


def _describe_torch_object(obj: Any) -> str | None:
    """A torch dtype or device; None for a ``torch.Size`` (walked as a sequence)."""
    name = type(obj).__name__
    if name == "dtype":
        return f"dtype {dtype_name(obj)}"
    if name == "device":
        return f"device {obj.type}"
    return _describe_tensor_like(obj) if name != "Size" else None


def _describe_tensor_like(obj: Any) -> str | None:
    """Tensor metadata (anything with ``.shape`` and ``.dtype``), else None."""
    if not (hasattr(obj, "shape") and hasattr(obj, "dtype")):
        return None
    shape = shape_of(obj)
    if shape is None:
        return None
    device_type = getattr(getattr(obj, "device", None), "type", None)
    where = f" {device_type}" if isinstance(device_type, str) else ""
    return f"tensor {shape} {dtype_name(obj)}{where}"


def _order(key: Any) -> tuple[str, Any]:
    """A total order over keys of mixed types that does not depend on the hash seed."""
    if isinstance(key, (int, float)) and not isinstance(key, bool):
        return ("0", key)
    if isinstance(key, str):
        return ("1", key)
    return (type(key).__name__, _key_text(key, "a key"))


def _key_text(key: Any, path: str) -> str:
    if isinstance(key, tuple):
        inner = ", ".join(_key_text(k, path) for k in key)
        return f"({inner},)" if len(key) == 1 else f"({inner})"
    text = _describe_leaf(key)
    if text is None or text.startswith("tensor "):
        raise TypeError(
            f"lora_guard.rank_fingerprint: {path} has a key or element of type "
            f"{type(key).__name__}; use strings, ints or tuples of them as keys."
        )
    return text


def _digest(entries: Mapping[str, str]) -> bytes:
    h = hashlib.blake2b(digest_size=_DIGEST_SIZE)
    for path, what in entries.items():
        h.update(path.encode("utf-8", "surrogatepass"))
        h.update(b"\x1e")
        h.update(what.encode("utf-8", "surrogatepass"))
        h.update(b"\x1f")
    return h.digest()


def _first_difference(
    ours: Mapping[str, str], theirs: Mapping[str, str]
) -> tuple[str, str, str]:
    """(path, their description, our description) of the first path where they differ."""
    for path, what in ours.items():
        other = theirs.get(path, "missing")
        if other != what:
            return path, other, what
    for path, what in theirs.items():
        if path not in ours:
            return path, what, "missing"
    return "", "", ""  # equal: never asked for


# --- the exchange ---------------------------------------------------------------------------


class _Groups:
    """The gloo group with a timeout used for the exchange, per set of ranks and timeout.

    The default group may be NCCL (collectives need device tensors, and block without a
    timeout on a dead peer); the exchange runs on a companion gloo group over the same ranks
    instead, created once (``use_local_synchronization``: only its members take part).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.groups: dict[tuple[tuple[int, ...], float], tuple[Any, ProcessGroup]] = {}

    def get(self, ranks: tuple[int, ...], timeout: float) -> ProcessGroup:
        import torch.distributed as dist

        default = dist.group.WORLD
        key = (ranks, timeout)
        with self.lock:
            entry = self.groups.get(key)
            if entry is not None and entry[0] is default:
                return entry[1]
            group = dist.new_group(
                ranks=list(ranks), timeout=timedelta(seconds=timeout), backend="gloo",
                use_local_synchronization=True,
            )
            if group is None or group == dist.GroupMember.NON_GROUP_MEMBER:
                raise ValueError(f"this process is not among the group's ranks {list(ranks)}")
            self.groups[key] = (default, group)
            return cast("ProcessGroup", group)

    def drop(self, ranks: tuple[int, ...], timeout: float) -> None:
        with self.lock:  # after a timeout its collectives are out of step: never reuse it
            self.groups.pop((ranks, timeout), None)


_GROUPS = _Groups()
_EXCHANGE_LOCK = threading.Lock()


def _all_gather_bytes(data: bytes, group: ProcessGroup, size: int) -> list[bytes]:
    """Every rank's ``data`` (at most ``size`` bytes), in group-rank order, as CPU tensors."""
    import torch
    import torch.distributed as dist

    buffer = torch.zeros(size, dtype=torch.uint8)
    if data:
        buffer[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    world = dist.get_world_size(group)
    outputs = [torch.empty(size, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(outputs, buffer, group=group)
    return [bytes(o.numpy().tobytes()) for o in outputs]


@functools.cache
def _release() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lora-guard")
    except PackageNotFoundError:  # run from a source tree
        return "unknown"


def _preamble() -> bytes:
    release = _release().encode("ascii", "replace")[:_RELEASE_SIZE].ljust(_RELEASE_SIZE, b"\0")
    header = (1 + _DIGEST_SIZE + 8).to_bytes(2, "little")
    return bytes([_MARKER, _PROTOCOL]) + header + release + bytes(
        _PREAMBLE_SIZE - 4 - _RELEASE_SIZE)


def _speaks(preamble: bytes) -> str:
    """What a rank's preamble says of its release, in words."""
    if preamble[0] != _MARKER:
        return "an earlier lora_guard release (check protocol 1, a 25-byte header)"
    release = preamble[4:4 + _RELEASE_SIZE].rstrip(b"\0").decode("ascii", "replace")
    header = int.from_bytes(preamble[2:4], "little")
    return f"lora_guard {release} (check protocol {preamble[1]}, a {header}-byte header)"


class _ReleasesDiffer(Exception):
    """The ranks' preambles differ: what each rank said, in group order."""

    def __init__(self, spoken: list[str]) -> None:
        super().__init__(spoken)
        self.spoken = spoken


def _releases_differ(subject: str, ranks: Sequence[int], spoken: Sequence[str]) -> list[Violation]:
    """One LG301 ``protocol`` per release that differs from the most common one."""
    groups: dict[str, list[int]] = {}
    for rank, said in zip(ranks, spoken, strict=True):
        groups.setdefault(said, []).append(rank)
    ours = max(groups, key=lambda k: (len(groups[k]), -groups[k][0]))
    reference = groups[ours][0]
    return [make_violation(
        "LG301", "protocol", subject, ranks=members, reference=reference, path="protocol",
        diff=(f"rank {members[0]} runs" if len(members) == 1 else f"ranks {members} run")
        + f" {said}, rank {reference} runs {ours}",
        values={str(r): said for r in members} | {str(reference): ours},
    ) for said, members in groups.items() if said != ours]


def _exchange(
    local: dict[str, str] | BaseException, group: ProcessGroup
) -> list[dict[str, str] | str] | None:
    """None when every rank's fingerprint equals ours; else every rank's, in group order.

    A rank that could not fingerprint its state sends its error text instead. Ranks of
    another release: `_ReleasesDiffer`, after the preamble only.
    """
    preambles = _all_gather_bytes(_preamble(), group, _PREAMBLE_SIZE)
    if len(set(preambles)) > 1:
        raise _ReleasesDiffer([_speaks(p) for p in preambles])
    if isinstance(local, BaseException):
        status, digest = _FAILED, bytes(_DIGEST_SIZE)
        payload = json.dumps(f"{type(local).__name__}: {local}").encode()
    else:
        status, digest = _OK, _digest(local)
        payload = json.dumps(list(local.items())).encode()
    headers = _all_gather_bytes(bytes([status]) + digest + len(payload).to_bytes(8, "little"),
                                group, 1 + _DIGEST_SIZE + 8)
    if all(h[0] == _OK for h in headers) and len({h[1:1 + _DIGEST_SIZE] for h in headers}) == 1:
        return None
    longest = max(int.from_bytes(h[1 + _DIGEST_SIZE:], "little") for h in headers)
    gathered: list[dict[str, str] | str] = []
    for header, data in zip(headers, _all_gather_bytes(payload, group, longest), strict=True):
        length = int.from_bytes(header[1 + _DIGEST_SIZE:], "little")
        value = json.loads(data[:length].decode())
        gathered.append(dict(value) if header[0] == _OK else str(value))
    return gathered


def _plural(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]} has" if len(ranks) == 1 else f"ranks {list(ranks)} have"


def _divergence(
    subject: str, ranks: Sequence[int], fingerprints: Sequence[dict[str, str] | str]
) -> list[Violation]:
    """One LG301 per distinct fingerprint that differs from the most common one."""
    groups: dict[str, list[int]] = {}
    by_key: dict[str, dict[str, str] | str] = {}
    for rank, fp in zip(ranks, fingerprints, strict=True):
        # A failed rank's key starts with "!", which no hex digest does.
        key = "!" + fp if isinstance(fp, str) else _digest(fp).hex()
        groups.setdefault(key, []).append(rank)
        by_key.setdefault(key, fp)
    healthy = [k for k in groups if not k.startswith("!")]
    # The reference is the most common fingerprint; ties go to the lowest rank.
    ref_key = max(healthy, key=lambda k: (len(groups[k]), -groups[k][0])) if healthy else None
    reference = groups[ref_key][0] if ref_key is not None else ranks[0]
    ours = by_key[ref_key] if ref_key is not None else {}
    assert not isinstance(ours, str)
    found = []
    for key, members in groups.items():
        if key == ref_key:
            continue
        fp = by_key[key]
        if isinstance(fp, str):
            who = f"rank {members[0]}" if len(members) == 1 else f"ranks {members}"
            path, diff = "state", f"{who} could not fingerprint its state ({fp})"
            values: dict[str, str] = {str(r): fp for r in members}
        else:
            path, theirs, mine = _first_difference(ours, fp)
            diff = f"{_plural(members)} {theirs}, rank {reference} has {mine}"
            values = {str(r): theirs for r in members} | {str(reference): mine}
        found.append(make_violation(
            "LG301", "diverged", subject, ranks=list(members), reference=reference, path=path,
            diff=diff, values=values,
        ))
    return found


def _group_ranks(group: ProcessGroup | None) -> tuple[int, ...] | None:
    """The global ranks of ``group`` when a check makes sense, else None (nothing to compare)."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch without distributed support
        return None
    if not dist.is_available() or not dist.is_initialized():
        return None
    if isinstance(group, int):  # dist.GroupMember.NON_GROUP_MEMBER
        raise ValueError(
            "lora_guard.assert_rank_consistent: this process is not a member of the group it "
            "was given; pass the tensor-parallel group this rank belongs to (or None)."
        )
    ranks = tuple(dist.get_process_group_ranks(group))
    if dist.get_rank() not in ranks:
        raise ValueError(
            f"lora_guard.assert_rank_consistent: this process (rank {dist.get_rank()}) is not "
            f"in the group's ranks {list(ranks)}; pass the group this rank belongs to."
        )
    return ranks if len(ranks) > 1 else None


def _backend_problem(exc: BaseException) -> str:
    """The backend's own words, without its source location and boilerplate."""
    text = str(exc).strip()
    text = text.splitlines()[0] if text else type(exc).__name__
    text = re.sub(r"^\[[^\]]*\]\s*", "", text)  # gloo's "[.../pair.cc:537] "
    text = text.split(" This is typically caused", 1)[0]
    return text if len(text) <= 200 else text[:197] + "..."


def _check_timeout(timeout: object, where: str) -> float:
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
            0 < timeout < math.inf):
        raise ValueError(
            f"{where}(timeout=...) is how long to wait for the other ranks, in seconds (a "
            f"positive number or a datetime.timedelta), got {timeout!r}; the default is "
            f"{DEFAULT_TIMEOUT:g}."
        )
    if timeout < MIN_TIMEOUT:
        raise ValueError(
            f"{where}(timeout=...) is {timeout!r} s, under a millisecond: gloo counts whole "
            "milliseconds and would round it to 0, which it takes as 'wait forever'; pass at "
            f"least {MIN_TIMEOUT:g} (1 ms), or a few seconds: the default is "
            f"{DEFAULT_TIMEOUT:g}."
        )
    return float(timeout)


def _stands_aside() -> bool:
    if STATE.off:
        return True
    try:
        import torch
    except ImportError:  # pragma: no cover
        return True
    return bool(torch.compiler.is_dynamo_compiling())


def _check(
    local: dict[str, str] | BaseException,
    ranks: tuple[int, ...],
    *,
    timeout: float,
    subject: str,
) -> list[Violation]:
    """Exchange fingerprints over a gloo group; the LG301 divergences (refuses on timeout)."""
    stage = "creating the check's gloo group"
    try:
        group = _GROUPS.get(ranks, timeout)
        stage = "exchanging fingerprints"
        with _EXCHANGE_LOCK:  # two threads' collectives on one group must not interleave
            gathered = _exchange(local, group)
    except _ReleasesDiffer as differ:  # no comparison possible: refused whatever the mode
        refuse(_releases_differ(subject, ranks, differ.spoken))
    except RuntimeError as exc:  # gloo: a peer timed out, closed the connection or died
        _GROUPS.drop(ranks, timeout)
        problem = _backend_problem(exc)
        refuse([make_violation(
            "LG301", "timeout", subject, hint=INVARIANTS["LG301"].fixes[1],
            timeout=f"{timeout:g}", ranks=list(ranks), stage=stage,
            problem=f"expected ranks {list(ranks)}; {stage}: {problem}",
        )])
    if gathered is None:
        return []
    return _divergence(subject, ranks, gathered)


_UNSET: Any = object()


def assert_rank_consistent(
    state: Any,
    _group: ProcessGroup | None = _UNSET,
    /,
    *,
    group: ProcessGroup | None = None,
    timeout: float | timedelta = DEFAULT_TIMEOUT,
    subject: str = "rank state",
) -> None:
    """Check that every rank of ``group`` holds the same ``state``; LG301 on every rank if not.

    ``state`` is what the ranks must agree on: pool shapes, slot maps, adapter ids, as a
    nesting of mappings, sequences, sets and tensors (see `rank_fingerprint`; tensors count by
    shape, dtype and device type, never by data). Every rank of ``group`` (keyword-only, as
    every option of lora_guard; the default group when None) must call it at the same point,
    like any collective. Passing the group by position still works, with a
    ``DeprecationWarning``.

    The ranks exchange a 16-byte digest of their fingerprint (one small collective); only when
    the digests differ are the full fingerprints exchanged, and then every rank reports LG301
    naming the ranks that differ from the most common state, the path of the first difference
    and both values. The exchange runs on a gloo group over the same ranks, created on the
    first call, with Python-level byte buffers on the CPU: an NCCL job needs no device tensors
    and no ``torch.cuda.set_device`` for it. A rank that does not answer within ``timeout``
    seconds (dead, hung, or not calling) makes the others raise LG301 ``timeout`` whatever the
    mode, never hang: the job is broken at that point, restart it. A timeout under a
    millisecond is refused (gloo would round it to 0, "wait forever"). Ranks running
    different lora_guard releases raise LG301 ``protocol`` naming each rank's release, whatever
    the mode, before any message whose size could differ between releases.

    Returns at once, checking nothing, when torch.distributed is not initialised, when the
    group has one rank, in mode ``off`` (use one mode on every rank) and under
    ``torch.compile`` tracing. A divergence is reported through the mode (``warn`` and
    ``record`` proceed); a rank whose state cannot be fingerprinted raises its ``TypeError``
    while the others report LG301 naming it.

    Example:
        >>> import lora_guard as lg
        >>> lg.assert_rank_consistent({"uid_to_slot": {"math": 0}})  # not distributed: no-op

        Across 2 ranks whose slot maps differ, every rank raises::

            lora_guard.RankDivergenceError: LG301 rank-divergence: rank state: ranks [1]
            differ from rank 0 at state['uid_to_slot']['math']: rank 1 has 1, rank 0 has 0.
    """
    if _group is not _UNSET:
        warnings.warn(
            "lora_guard.assert_rank_consistent(state, group): passing the group by position is "
            "deprecated; pass it as group=..., as guard_rank_consistency and rank_fingerprint "
            "take their options.",
            DeprecationWarning,
            stacklevel=2,
        )
        group = _group
    seconds = _check_timeout(timeout, "lora_guard.assert_rank_consistent")
    if not isinstance(subject, str):
        raise TypeError(f"lora_guard.assert_rank_consistent(subject=...) must be a string, "
                        f"got {type(subject).__name__}")
    if _stands_aside():
        return
    ranks = _group_ranks(group)
    if ranks is None:
        return
    local: dict[str, str] | BaseException
    try:
        local = rank_fingerprint(state)
    except (TypeError, ValueError) as exc:
        local = exc
    violations = _check(local, ranks, timeout=seconds, subject=subject)
    if isinstance(local, BaseException):
        raise local
    report(violations)


def guard_rank_consistency(
    *,
    state: Callable[..., Any],
    group: ProcessGroup | Callable[..., Any] | None = None,
    timeout: float | timedelta = DEFAULT_TIMEOUT,
    subject: str | None = None,
) -> Callable[[F], F]:
    """Decorator: check, after each call, that every rank ended in the same state (LG301).

    For a method whose effect must agree across tensor-parallel ranks (loading or unloading
    an adapter, preparing a batch's slot map). After the method returns, or raises, ``state``
    is called with the method's first argument (``self``; no argument for a function called
    without any) and `assert_rank_consistent` compares it across ``group``, together with the
    call's outcome: a load that failed on one rank only is itself a divergence. ``group`` is a
    process group, None (the default group), or a callable over the same first argument.

    On a rank whose call raised, the original error propagates when the ranks agree, and is
    the cause of LG301 when they do not. Every rank must make the call, as with any
    collective. In mode ``off`` the decorator returns the method undecorated. Formerly
    ``rank_consistent``, which still works with a ``DeprecationWarning``.

    Example:
        >>> import lora_guard as lg
        >>> class Pool:
        ...     def __init__(self):
        ...         self.uid_to_slot = {}
        ...     @lg.guard_rank_consistency(state=lambda self: self.uid_to_slot)
        ...     def load(self, uid):
        ...         self.uid_to_slot[uid] = len(self.uid_to_slot)
        >>> pool = Pool()
        >>> pool.load("math")   # one process: nothing to compare, the call just runs
        >>> pool.uid_to_slot
        {'math': 0}
    """
    where = "lora_guard.guard_rank_consistency"
    if not callable(state):
        raise TypeError(
            f"{where}(state=...) takes a callable over the instance that returns what the "
            "ranks must agree on, e.g. state=lambda self: "
            f"{{'slots': self.uid_to_slot}}; got {type(state).__name__}"
        )
    seconds = _check_timeout(timeout, where)
    if subject is not None and not isinstance(subject, str):
        raise TypeError(f"{where}(subject=...) must be a string, got {type(subject).__name__}")

    def decorate(fn: F) -> F:
        if STATE.off:
            return fn
        if not callable(fn):
            raise TypeError(f"{where} decorates a function, got {type(fn).__name__}")
        guard = _RankGuard(fn, state, group, seconds,
                           subject or str(getattr(fn, "__qualname__", repr(fn))))

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return guard.call(*args, **kwargs)

        return cast(F, wrapper)

    return decorate


@dataclasses.dataclass(frozen=True)
class _RankGuard:
    """One method under `guard_rank_consistency`: call it, then compare the ranks."""

    fn: Callable[..., Any]
    state: Callable[..., Any]
    group: Any
    timeout: float
    subject: str

    def call(self, *args: Any, **kwargs: Any) -> Any:
        if _stands_aside():
            return self.fn(*args, **kwargs)
        failure: BaseException | None = None
        result: Any = None
        try:
            result = self.fn(*args, **kwargs)
        except Exception as exc:  # compared across ranks, then re-raised
            failure = exc
        owner = args[:1]
        ranks = _group_ranks(self.group(*owner) if callable(self.group) else self.group)
        if ranks is not None:
            self._compare(owner, ranks, failure)
        if failure is not None:
            raise failure
        return result

    def _compare(self, owner: tuple[Any, ...], ranks: tuple[int, ...],
                 failure: BaseException | None) -> None:
        outcome = "returned" if failure is None else f"raised {type(failure).__name__}"
        local: dict[str, str] | BaseException
        try:
            local = {"outcome": outcome, **rank_fingerprint(self.state(*owner))}
        except Exception as exc:
            local = exc
        violations = _check(local, ranks, timeout=self.timeout, subject=self.subject)
        if isinstance(local, BaseException):
            raise local from failure
        try:
            report(violations)
        except BaseException as exc:
            if failure is not None:
                raise exc from failure
            raise


def rank_consistent(
    state: Callable[..., Any],
    *,
    group: ProcessGroup | Callable[..., Any] | None = None,
    timeout: float | timedelta = DEFAULT_TIMEOUT,
    subject: str | None = None,
) -> Callable[[F], F]:
    """Deprecated name of `guard_rank_consistency` (a decorator, not a predicate).

    Warns with a ``DeprecationWarning`` naming the new name, then behaves exactly like it.

    Example:
        >>> import warnings, lora_guard as lg
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     decorate = lg.rank_consistent(state=lambda self: {})
        >>> "guard_rank_consistency" in str(caught[0].message)
        True
    """
    warnings.warn(
        "lora_guard.rank_consistent is deprecated: use @lora_guard.guard_rank_consistency("
        "state=...), the same decorator under a name that reads as one.",
        DeprecationWarning,
        stacklevel=2,
    )
    return guard_rank_consistency(state=state, group=group, timeout=timeout, subject=subject)
