"""Hostile adapter folders, each written by code into a fresh directory.

Every `Case` builds one adapter (or one folder of adapters) that a user could upload: broken
or lying safetensors headers, broken or lying configs, pickles that would run code, symlinks
out of the folder, special files, folders with thousands of entries. ``expect`` is the code
the checker must report and ``says`` a piece of the message that tells the user why; ``None``
means a file that is odd but valid, which must pass (bounded, never reading tensor data).

The writers here are independent of lora_guard's own test writer: they produce bytes by
hand, so that a bug shared by the reader and its writer cannot hide.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "base_model.model.model.layers.{layer}.self_attn.{proj}"
MARKER = "PWNED"  # the file a pickle payload would create if anything unpickled it


@dataclass(frozen=True)
class Case:
    """One hostile input: how to build it, and what the user must be told."""

    name: str
    what: str
    expect: str | None
    says: str
    build: Callable[[Path], Path]
    """Writes the input under the given empty directory; returns the path to check."""
    max_mib: int = 16
    """Peak memory the check may take (tracemalloc), in MiB."""
    outside: bool = False
    """The case plants a file outside the adapter folder that must never be opened."""


# --- writers -------------------------------------------------------------------------------


def config(**overrides: Any) -> dict[str, Any]:
    """What PEFT writes for a rank-8 q_proj/v_proj adapter (the fields that matter)."""
    base: dict[str, Any] = {
        "peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"],
        "bias": "none", "use_dora": False, "modules_to_save": None, "rank_pattern": {},
        "alpha_pattern": {}, "task_type": "CAUSAL_LM", "base_model_name_or_path": "tiny",
    }
    base.update(overrides)
    return base


def tensors(rank: int = 8, hidden: int = 64) -> list[tuple[str, str, list[int]]]:
    """(key, dtype, shape) of a valid adapter: q_proj and v_proj, A and B, one layer."""
    out = []
    for proj in ("q_proj", "v_proj"):
        p = PREFIX.format(layer=0, proj=proj)
        out += [(f"{p}.lora_A.weight", "F16", [rank, hidden]),
                (f"{p}.lora_B.weight", "F16", [hidden, rank])]
    return out


def header(entries: list[tuple[str, str, list[int]]], *, elem: int = 2) -> tuple[dict[str, Any],
                                                                                  int]:
    """A header laying ``entries`` out back to back; returns it and the data size."""
    head: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    pos = 0
    for key, dtype, shape in entries:
        n = elem
        for d in shape:
            n *= d
        head[key] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + n]}
        pos += n
    return head, pos


def write_weights(path: Path, raw: bytes | dict[str, Any], data: int, *,
                  length: int | None = None) -> None:
    """8-byte little-endian length, the header bytes, ``data`` zero bytes (sparse)."""
    body = raw if isinstance(raw, bytes) else json.dumps(raw).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(body) if length is None else length))
        f.write(body)
        f.truncate(8 + len(body) + data)


def adapter(root: Path, *, cfg: dict[str, Any] | bytes | None = None,
            weights: tuple[bytes | dict[str, Any], int] | None = None,
            name: str = "adapter") -> Path:
    """An adapter folder with the given config (default valid) and weights (default valid)."""
    folder = root / name
    folder.mkdir(parents=True)
    raw_cfg = cfg if isinstance(cfg, bytes) else json.dumps(cfg or config()).encode()
    (folder / "adapter_config.json").write_bytes(raw_cfg)
    write_weights(folder / "adapter_model.safetensors", *(weights or header(tensors())))
    return folder


def with_header(raw: bytes | dict[str, Any], data: int = 0, **kw: Any) -> Callable[[Path],
                                                                                   Path]:
    def build(root: Path) -> Path:
        folder = adapter(root)
        write_weights(folder / "adapter_model.safetensors", raw, data, **kw)
        return folder
    return build


def with_config(raw: bytes | dict[str, Any]) -> Callable[[Path], Path]:
    def build(root: Path) -> Path:
        return adapter(root, cfg=raw)
    return build


def edited(edit: Callable[[dict[str, Any]], None], entries: list[tuple[str, str, list[int]]]
           | None = None, extra_data: int = 0) -> Callable[[Path], Path]:
    """A valid header changed by ``edit`` (which works on the parsed header)."""
    head, data = header(entries or tensors())
    edit(head)
    return with_header(head, data + extra_data)


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


# --- the cases -----------------------------------------------------------------------------

A = PREFIX.format(layer=0, proj="q_proj") + ".lora_A.weight"
B = PREFIX.format(layer=0, proj="q_proj") + ".lora_B.weight"
VA = PREFIX.format(layer=0, proj="v_proj") + ".lora_A.weight"


def _set(key: str, field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(head: dict[str, Any]) -> None:
        head[key][field] = value
    return edit


def _duplicate_key(root: Path) -> Path:
    head, data = header(tensors())
    text = json.dumps(head)
    entry = json.dumps(head[A])
    text = text[:-1] + f', "{A}": {entry}' + "}"  # the same tensor key twice
    return with_header(text.encode(), data)(root)


def _huge_key(root: Path) -> Path:
    key = "base_model.model." + "x" * 1_000_000 + ".lora_A.weight"
    head, data = header([(key, "F16", [8, 64])])
    return with_header(head, data)(root)


def _many_tensors(root: Path) -> Path:
    entries = [(f"junk.{i}", "F16", [1]) for i in range(20_000)]
    head, data = header(entries)
    return with_header(head, data)(root)


def _many_dims_list(root: Path) -> Path:
    head, data = header(tensors())
    head[A]["shape"] = [0] * 300_000  # a 300,000-entry shape list, 900 KB of JSON
    return with_header(head, data)(root)


def _sparse_64_gib(root: Path) -> Path:
    # A valid header whose one tensor claims 64 GiB, backed by a sparse file: the checker
    # must answer from the header without reading (or mapping) any of it.
    entries = [(A, "F16", [8, 2**32]), (B, "F16", [64, 8])]
    head, data = header(entries)
    return adapter(root, weights=(head, data))


def _header_at_cap(root: Path) -> Path:
    folder = adapter(root)
    cap = 100_000_000
    write_weights(folder / "adapter_model.safetensors", b"", cap, length=cap)  # all zeros
    return folder


def _pickle_payload(root: Path) -> Path:
    """An old-style adapter_model.bin whose unpickling would run code that writes MARKER."""
    folder = root / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps(config()))
    marker = root / MARKER
    code = f"open({str(marker)!r}, 'w').write('code ran')"

    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (exec, (code,))

    (folder / "adapter_model.bin").write_bytes(pickle.dumps(Payload()))
    return folder


def _pickle_next_to_safetensors(root: Path) -> Path:
    folder = adapter(root)
    marker = root / MARKER

    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (exec, (f"open({str(marker)!r}, 'w')",))

    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(Payload()))
    return folder


def _outside(root: Path) -> Path:
    """A valid-looking file outside the adapter folder, which must never be opened."""
    secret = root / "outside" / "secret.safetensors"
    secret.parent.mkdir()
    head, data = header(tensors())
    write_weights(secret, head, data)
    return secret


def _symlinked_weights(root: Path) -> Path:
    secret = _outside(root)
    folder = root / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps(config()))
    (folder / "adapter_model.safetensors").symlink_to(secret)
    return folder


def _symlinked_config(root: Path) -> Path:
    secret = _outside(root)
    folder = adapter(root)
    (folder / "adapter_config.json").unlink()
    (folder / "adapter_config.json").symlink_to(secret)
    return folder


def _relative_escape(root: Path) -> Path:
    _outside(root)
    folder = adapter(root)
    (folder / "adapter_model.safetensors").unlink()
    (folder / "adapter_model.safetensors").symlink_to("../outside/secret.safetensors")
    return folder


def _dev_zero(root: Path) -> Path:
    folder = adapter(root)
    (folder / "adapter_model.safetensors").unlink()
    (folder / "adapter_model.safetensors").symlink_to("/dev/zero")
    return folder


def _symlink_loop(root: Path) -> Path:
    folder = adapter(root)
    (folder / "adapter_model.safetensors").unlink()
    (folder / "adapter_model.safetensors").symlink_to("adapter_model.safetensors")
    return folder


def _fifo(name: str) -> Callable[[Path], Path]:
    def build(root: Path) -> Path:
        folder = adapter(root)
        (folder / name).unlink()
        os.mkfifo(folder / name)  # opening it would block forever: no writer
        return folder
    return build


def _directory_instead_of(name: str) -> Callable[[Path], Path]:
    def build(root: Path) -> Path:
        folder = adapter(root)
        (folder / name).unlink()
        (folder / name).mkdir()
        return folder
    return build


def _missing(name: str) -> Callable[[Path], Path]:
    def build(root: Path) -> Path:
        folder = adapter(root)
        (folder / name).unlink()
        return folder
    return build


def _thousands_of_files(root: Path) -> Path:
    folder = adapter(root)
    for i in range(3_000):
        (folder / f"junk-{i:04d}.txt").write_bytes(b"")
    return folder


def _thousands_of_empty_folders(root: Path) -> Path:
    top = root / "uploads"
    for i in range(3_000):
        (top / f"d{i:04d}").mkdir(parents=True)
    return top


def _hundreds_of_broken_adapters(root: Path) -> Path:
    top = root / "uploads"
    for i in range(500):
        folder = top / f"a{i:03d}"
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_bytes(b"{")
    return top


def _symlinked_adapter_folder(root: Path) -> Path:
    """A search folder whose only entry is a symlink to an adapter elsewhere: not followed."""
    elsewhere = adapter(root / "outside")
    top = root / "uploads"
    top.mkdir()
    (top / "linked").symlink_to(elsewhere, target_is_directory=True)
    return top


def _regular_file(root: Path) -> Path:
    path = root / "adapter.tar"
    path.write_bytes(os.urandom(4096))
    return path


def _deep_dirs(root: Path, depth: int = 200) -> Path:
    top = root / "uploads"
    path = top
    top.mkdir()
    for _ in range(depth):  # one level at a time: Path.mkdir(parents=True) recurses
        path = path / "d"
        path.mkdir()
    return top


def remove_deep_folders(directory: Path) -> None:
    """Remove the nested ``uploads/d/d/...`` of the deep-folder cases built under
    ``directory``, deepest first: ``shutil.rmtree``, and so pytest's removal of old temporary
    folders, recurses once per level and fails at 1,500 levels before Python 3.12."""
    for top in (directory / "uploads", directory / "deep-folders-1500" / "uploads"):
        chain = [top] if top.is_dir() else []
        while chain and (chain[-1] / "d").is_dir():
            chain.append(chain[-1] / "d")
        if len(chain) > 500:
            for folder in reversed(chain):
                folder.rmdir()


def _hf_snapshot(root: Path, *, escape: bool = False) -> Path:
    """How every downloaded adapter looks: ``models--org--name/snapshots/<rev>/`` whose
    files are symlinks into ``../../blobs/``; with ``escape`` the weights link leaves the
    cached repository (into another repository's blobs)."""
    repo = root / "hub" / "models--org--lora"
    other = root / "hub" / "models--org--other"
    made = adapter(root / "made")
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    for r in (repo, other):
        (r / "blobs").mkdir(parents=True)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        blob = (other if escape and name.endswith("safetensors") else repo) / "blobs" / name
        (made / name).rename(blob)
        depth = "../../../models--org--other" if blob.parent.parent == other else "../.."
        (snapshot / name).symlink_to(f"{depth}/blobs/{name}")
    return snapshot


def _many_values(root: Path) -> Path:
    """A valid adapter whose header adds 3,000,000 empty lists in an extra field."""
    head, data = header(tensors())
    raw = json.dumps(head).encode()
    raw = raw[:-1] + b',"x":{"dtype":"F16","shape":[],"data_offsets":[0,0],"e":[' + (
        b"[]," * 3_000_000) + b"[]]}}"
    folder = adapter(root)
    write_weights(folder / "adapter_model.safetensors", raw, data)
    return folder


def _header_100mb_lists(root: Path) -> Path:
    """A valid adapter whose header, just under the 100 MB cap, is mostly ``[],`` (33
    million empty lists: 2.48 GB when parsed whole)."""
    head, data = header(tensors())
    raw = json.dumps(head).encode()[:-1] + b',"x":['
    count = (99_999_000 - len(raw)) // 3
    folder = adapter(root)
    write_weights(folder / "adapter_model.safetensors", raw + b"[]," * count + b"[]]}", data)
    return folder


def _long_name(root: Path) -> Path:
    """A search path one component of which is longer than any file system allows."""
    return root / ("a" * 300) / "adapter"


def _surrogate_key(root: Path) -> Path:
    """A tensor key holding a lone surrogate (JSON ``\\ud800``), which no terminal prints."""
    head, data = header(tensors())
    raw = json.dumps(head).encode()[:-1] + (
        b',"base_model.model.x\\ud800.lora_A.weight":{"dtype":"F16","shape":[0],'
        b'"data_offsets":[%d,%d]}}' % (data, data))
    folder = adapter(root)
    write_weights(folder / "adapter_model.safetensors", raw, data)
    return folder


def _long_module_names(keys: dict[str, int], modules: int, length: int) -> Callable[[Path],
                                                                                    Path]:
    """``modules`` LoRA modules whose names are ``length`` characters, and a rank_pattern."""
    def build(root: Path) -> Path:
        entries = []
        for i in range(modules):
            name = f"base_model.model.m{i}." + "a." * ((length - 20) // 2) + "q_proj"
            entries += [(f"{name}.lora_A.weight", "F16", [8, 4]),
                        (f"{name}.lora_B.weight", "F16", [4, 8])]
        return adapter(root, cfg=config(rank_pattern=keys), weights=header(entries))
    return build


def _empty_weights(root: Path) -> Path:
    folder = adapter(root)
    (folder / "adapter_model.safetensors").write_bytes(b"")
    return folder


def _short_weights(root: Path, raw: bytes) -> Path:
    folder = adapter(root)
    (folder / "adapter_model.safetensors").write_bytes(raw)
    return folder


_CFG = config()

CASES: list[Case] = [
    # safetensors: the length prefix
    Case("empty-weights", "adapter_model.safetensors of 0 bytes", "LG108", "too short",
         _empty_weights),
    Case("five-bytes", "a weights file of 5 bytes", "LG108", "too short",
         lambda root: _short_weights(root, b"\x01\x02\x03\x04\x05")),
    Case("length-past-eof", "header length 4,096 in a 100-byte file", "LG108",
         "runs past the end", with_header(b"{}" + b" " * 90, 0, length=4096)),
    Case("length-2^64-1", "header length 2^64 - 1", "LG108", "cap",
         with_header(b"{}", 0, length=2**64 - 1)),
    Case("length-2^63", "header length 2^63", "LG108", "cap",
         with_header(b"{}", 0, length=2**63)),
    Case("length-cap+1", "header length 100,000,001 (the cap + 1)", "LG108", "cap",
         with_header(b"{}", 0, length=100_000_001)),
    Case("length-zero", "header length 0", "LG108", "too short",
         with_header(b"", 0, length=0)),
    Case("header-at-cap", "a 100 MB header of zero bytes (exactly the cap)", "LG108",
         "does not start", _header_at_cap, max_mib=240),
    # safetensors: the header's text and JSON
    Case("invalid-utf8", "header bytes that are not UTF-8", "LG108", "not UTF-8",
         with_header(b'{"\xff\xfe": 1}')),
    Case("utf8-bom", "a UTF-8 byte-order mark before the JSON", "LG108", "does not start",
         with_header(b"\xef\xbb\xbf{}")),
    Case("invalid-json", "a header cut in the middle of the JSON", "LG108", "not valid JSON",
         with_header(b'{"a": {"dtype": ')),
    Case("json-array", "a JSON array instead of an object", "LG108", "JSON object",
         with_header(b"[1, 2, 3]")),
    Case("json-string", "a JSON string instead of an object", "LG108", "JSON object",
         with_header(b'"hello"')),
    Case("nul-in-json", "a NUL byte inside a JSON key", "LG108", "not valid JSON",
         with_header(b'{"a\x00b": 1}')),
    Case("duplicate-key", "one tensor key twice, with other offsets", "LG108",
         "duplicate key", _duplicate_key),
    Case("nan-in-header", "NaN as a shape dim", "LG108", "NaN",
         with_header(b'{"x": {"dtype": "F16", "shape": [NaN], "data_offsets": [0, 2]}}', 2)),
    Case("infinity-in-header", "Infinity as an offset", "LG108", "Infinity",
         with_header(b'{"x": {"dtype": "F16", "shape": [1], "data_offsets": [0, Infinity]}}',
                     2)),
    Case("deep-json-metadata", "`__metadata__` nested 100,000 levels deep", "LG108", "nest",
         with_header(('{"__metadata__": ' + nested(100_000) + "}").encode())),
    Case("deep-json-entry", "a tensor entry with an extra field nested 50 levels", "LG108",
         "nests", edited(_set(A, "extra", json.loads(nested(50))))),
    Case("metadata-not-strings", "`__metadata__` holding a number", "LG108", "__metadata__",
         edited(lambda h: h.__setitem__("__metadata__", {"format": 1}))),
    Case("entry-not-object", "a tensor entry that is a list", "LG108", "not an object",
         edited(lambda h: h.__setitem__(A, [1, 2, 3]))),
    Case("entry-missing-fields", "a tensor entry without data_offsets", "LG108",
         "data_offsets", edited(lambda h: h[A].pop("data_offsets"))),
    # safetensors: offsets
    Case("offsets-overlap", "two tensors sharing bytes", "LG108", "overlaps",
         edited(_set(B, "data_offsets", [0, 1024]))),
    Case("offsets-gap", "bytes that belong to no tensor", "LG108", "gap",
         edited(_set(A, "data_offsets", [16, 1040]), extra_data=16)),
    Case("offsets-past-end", "the last tensor ends 512 bytes past the file", "LG108",
         "past the end", lambda root: adapter(root, weights=(header(tensors())[0],
                                                             header(tensors())[1] - 512))),
    Case("offsets-reversed", "data_offsets [1024, 0]", "LG108", "end before",
         edited(_set(A, "data_offsets", [1024, 0]))),
    Case("offsets-three", "three data_offsets", "LG108", "data_offsets",
         edited(_set(A, "data_offsets", [0, 512, 1024]))),
    Case("offsets-negative", "a negative offset", "LG108", "data_offsets",
         edited(_set(A, "data_offsets", [-1024, 0]))),
    Case("offsets-2^64", "an offset of 2^64", "LG108", "data_offsets",
         edited(_set(A, "data_offsets", [0, 2**64]))),
    Case("trailing-bytes", "4 KB after the last tensor", "LG108", "trailing",
         edited(lambda h: None, extra_data=4096)),
    # safetensors: shapes and dtypes
    Case("negative-shape", "shape [-8, 64]", "LG108", "non-negative",
         edited(_set(A, "shape", [-8, 64]))),
    Case("huge-shape", "shape [2^62, 2^62] in 1 KB of data", "LG108", "needs",
         edited(_set(A, "shape", [2**62, 2**62]))),
    Case("shape-over-u64", "a dim of 2^70", "LG108", "non-negative integers",
         edited(_set(A, "shape", [2**70, 1]))),
    Case("float-shape", "shape [8.0, 64]", "LG108", "non-negative integers",
         edited(_set(A, "shape", [8.0, 64]))),
    Case("bool-shape", "shape [true, 64]", "LG108", "non-negative integers",
         edited(_set(A, "shape", [True, 64]))),
    Case("string-shape", 'shape "8x64"', "LG108", "non-negative integers",
         edited(_set(A, "shape", "8x64"))),
    Case("thousand-dims", "a shape of 1,000 ones", "LG108", "dims",
         edited(_set(A, "shape", [1] * 998 + [8, 64]))),
    Case("huge-shape-list", "a shape list of 300,000 zeros", "LG108", "dims",
         _many_dims_list),
    Case("unknown-dtype", 'dtype "Q4_K"', "LG108", "unknown dtype",
         edited(_set(A, "dtype", "Q4_K"))),
    Case("dtype-number", "dtype 16", "LG108", "unknown dtype", edited(_set(A, "dtype", 16))),
    Case("dtype-int32", "every LoRA tensor under the I32 code (float bytes relabelled)",
         "LG106", "is int32, not a floating-point dtype",
         lambda root: adapter(root, weights=header(
             [(key, "I32", shape) for key, _, shape in tensors()], elem=4))),
    Case("zero-size-tensor", "a lora_A of shape [0, 64]", "LG107", "zero size",
         lambda root: adapter(root, weights=header(
             [(A, "F16", [0, 64]), *tensors()[1:]]))),
    Case("huge-key", "a 1 MB tensor name (a lora_A without its B)", "LG103", "no lora_B",
         _huge_key),
    Case("many-tensors", "20,000 tensors with keys outside LoRA grammar", "LG104",
         "not LoRA key grammar", _many_tensors, max_mib=64),
    Case("no-tensors", "a valid header with no tensors at all", "LG115", "holds no tensors",
         with_header(b"{}")),
    Case("sparse-64-gib", "a valid 64 GiB sparse file: answered from the header", None, "",
         _sparse_64_gib),
    # adapter_config.json
    Case("config-missing", "no adapter_config.json", "LG108", "missing",
         _missing("adapter_config.json")),
    Case("config-empty", "adapter_config.json of 0 bytes", "LG108", "invalid JSON",
         with_config(b"")),
    Case("config-invalid-utf8", "adapter_config.json in Latin-1", "LG108", "UTF-8",
         with_config(b'{"r": 8, "name": "\xe9"}')),
    Case("config-invalid-json", "a config cut in the middle", "LG108", "invalid JSON",
         with_config(json.dumps(_CFG).encode()[:40])),
    Case("config-array", "a JSON array as the config", "LG108", "not a JSON object",
         with_config(b"[]")),
    Case("config-duplicate-key", "r given twice (8, then 64)", "LG108", "duplicate",
         with_config(json.dumps(_CFG).encode()[:-1] + b', "r": 64}')),
    Case("config-nan-alpha", "lora_alpha: NaN", "LG108", "NaN",
         with_config(json.dumps(config(lora_alpha=float("nan"))).encode())),
    Case("config-infinite-alpha", "lora_alpha: 1e999 (parses as infinity)", "LG108",
         "finite", with_config(json.dumps(_CFG).replace('"lora_alpha": 16',
                                                        '"lora_alpha": 1e999').encode())),
    Case("config-nan-alpha-pattern", "alpha_pattern value NaN", "LG108", "NaN",
         with_config(json.dumps(config(alpha_pattern={"q_proj": float("nan")})).encode())),
    Case("config-r-string", 'r: "8"', "LG108", "positive integer", with_config(config(r="8"))),
    Case("config-r-zero", "r: 0", "LG108", "positive integer", with_config(config(r=0))),
    Case("config-r-negative", "r: -8", "LG108", "positive integer", with_config(config(r=-8))),
    Case("config-r-float", "r: 8.5", "LG108", "positive integer", with_config(config(r=8.5))),
    Case("config-r-bool", "r: true", "LG108", "positive integer", with_config(config(r=True))),
    Case("config-r-huge", "r: 2^70, tensors of rank 8", "LG102", "config says",
         with_config(config(r=2**70))),
    Case("config-rank-pattern-string", 'rank_pattern value "16"', "LG108", "rank_pattern",
         with_config(config(rank_pattern={"q_proj": "16"}))),
    Case("config-rank-pattern-bad-regex", "rank_pattern key '(('", "LG108", "regex",
         with_config(config(rank_pattern={"((": 16}))),
    Case("config-no-r", "no r field", "LG108", "'r'",
         with_config({k: v for k, v in _CFG.items() if k != "r"})),
    Case("config-targets-number", "target_modules: 5", "LG108", "target_modules",
         with_config(config(target_modules=5))),
    Case("config-deep-json", "a config nested 100,000 levels", "LG108", "nested",
         with_config(('{"r": 8, "x": ' + nested(100_000) + "}").encode())),
    Case("config-oversized", "an 11 MB adapter_config.json", "LG108", "larger than",
         with_config(b'{"r": 8, "pad": "' + b"x" * 11_000_000 + b'"}'), max_mib=40),
    Case("config-not-lora", 'peft_type "PREFIX_TUNING"', "LG117", "peft_type",
         with_config(config(peft_type="PREFIX_TUNING"))),
    # files that are not what they claim, or lead elsewhere
    Case("pickle-bin", "adapter_model.bin whose unpickling would run code", "LG108",
         "pickle weights refused", _pickle_payload),
    Case("pickle-beside-safetensors", "a code-running pytorch_model.bin beside valid "
         "safetensors: ignored, never unpickled", None, "", _pickle_next_to_safetensors),
    Case("symlinked-weights", "adapter_model.safetensors -> a file outside the folder",
         "LG108", "outside the adapter folder", _symlinked_weights, outside=True),
    Case("symlinked-config", "adapter_config.json -> a file outside the folder", "LG108",
         "outside the adapter folder", _symlinked_config, outside=True),
    Case("relative-escape", "adapter_model.safetensors -> ../outside/...", "LG108",
         "outside the adapter folder", _relative_escape, outside=True),
    Case("dev-zero", "adapter_model.safetensors -> /dev/zero", "LG108", "outside",
         _dev_zero),
    Case("symlink-loop", "adapter_model.safetensors -> itself", "LG108", "",
         _symlink_loop),
    Case("fifo-weights", "adapter_model.safetensors is a named pipe", "LG108",
         "not a regular file", _fifo("adapter_model.safetensors")),
    Case("fifo-config", "adapter_config.json is a named pipe", "LG108", "not a regular file",
         _fifo("adapter_config.json")),
    Case("dir-weights", "adapter_model.safetensors is a folder", "LG108",
         "not a regular file", _directory_instead_of("adapter_model.safetensors")),
    Case("dir-config", "adapter_config.json is a folder", "LG108", "not a regular file",
         _directory_instead_of("adapter_config.json")),
    Case("weights-missing", "a config and no weights", "LG108", "missing",
         _missing("adapter_model.safetensors")),
    Case("not-a-folder", "4 KB of random bytes given as the adapter path", "LG108",
         "not an adapter folder", _regular_file),
    Case("no-such-path", "a path that does not exist", "LG108", "no such file",
         lambda root: root / "nothing-here"),
    Case("thousands-of-files", "a valid adapter folder with 3,000 other files", None, "",
         _thousands_of_files),
    Case("thousands-of-folders", "3,000 empty subfolders and no adapter", "LG108",
         "no adapter found", _thousands_of_empty_folders),
    Case("hundreds-of-broken", "500 adapter folders whose config is '{'", "LG108",
         "invalid JSON", _hundreds_of_broken_adapters, max_mib=32),
    Case("symlinked-subfolder", "a search folder holding a symlink to an adapter elsewhere",
         "LG108", "", _symlinked_adapter_folder),
    Case("deep-folders", "folders nested 200 deep, no adapter", "LG108", "deeper than 64",
         _deep_dirs),
    # round 2
    Case("null-metadata", '`"__metadata__": null`, which the safetensors library loads', None,
         "", with_header(b'{"__metadata__":null,' + json.dumps(
             {k: v for k, v in header(tensors())[0].items() if k != "__metadata__"})[1:]
             .encode(), header(tensors())[1])),
    Case("header-whitespace", "JSON whitespace before and after the header object", None, "",
         with_header(b" \n\t" + json.dumps(header(tensors())[0]).encode() + b"   ",
                     header(tensors())[1])),
    Case("header-trailing-nul", "NUL padding after the header (safetensors refuses it)",
         "LG108", "not valid JSON", with_header(json.dumps(header(tensors())[0]).encode()
                                                + b"\0\0", header(tensors())[1])),
    Case("hf-cache-snapshot", "a Hugging Face cache snapshot: files link to ../../blobs/",
         None, "", _hf_snapshot),
    Case("hf-cache-escape", "a snapshot whose weights link into another cached repository",
         "LG108", "outside", lambda root: _hf_snapshot(root, escape=True)),
    Case("deep-folders-1500", "folders nested 1,500 deep (a RecursionError before)", "LG108",
         "deeper than 64", lambda root: _deep_dirs(root, 1_500)),
    Case("header-100mb-lists", "a 100 MB header of `[[],[],...]` (2.48 GB parsed before)",
         "LG108", "memory bound", _header_100mb_lists, max_mib=256),
    Case("header-many-values", "a header of 3,000,000 empty lists (9 MB, 2.5 GB parsed)",
         "LG108", "memory bound", _many_values, max_mib=64),
    Case("config-many-values", "a 6 MB config of 1,000,000 empty lists", "LG108",
         "memory bound", with_config(b'{"r":8,"x":[' + b"[]," * 1_000_000 + b"[]]}"),
         max_mib=64),
    Case("config-5000-digits", "r: a 5,000-digit integer (past Python's int-string limit)",
         "LG108", "invalid JSON", with_config(b'{"r":' + b"9" * 5_000 + b"}")),
    Case("config-lone-surrogate", "a config key that is a lone UTF-16 surrogate", "LG108",
         "no 'target_modules'",
         with_config(b'{"r":8,"lora_alpha":16,"\\ud800":1}')),
    Case("surrogate-key", "a tensor key with a lone surrogate (\\ud800): printed escaped",
         "LG103", "\\ud800", _surrogate_key),
    Case("target-modules-redos", "target_modules regex '(a|aa)*c' (exponential backtracking)",
         "LG108", "target_modules regex", with_config(config(target_modules="(a|aa)*c"))),
    Case("rank-pattern-alternation", "rank_pattern key '(a|aa)*c'", "LG108", "exponential",
         with_config(config(rank_pattern={"(a|aa)*c": 16}))),
    Case("rank-pattern-three-stars", "rank_pattern key '.*.*.*z' against 3,000-char names",
         "LG108", "repeats 3 times",
         _long_module_names({".*.*.*z": 16}, modules=2, length=3_000)),
    Case("rank-pattern-budget", "1,000 keys '.*k_i.*z' x 200 module names of 1,000 chars",
         "LG108", "regex steps",
         _long_module_names({f".*k{i}.*z": 16 for i in range(1_000)}, modules=200,
                            length=1_000), max_mib=32),
    Case("rank-pattern-1000-names", "1,000 plain rank_pattern keys x 1,000 modules", None, "",
         _long_module_names({f"m{i}.q_proj": 8 for i in range(1_000)}, modules=1_000,
                            length=60), max_mib=64),
    Case("name-too-long", "a path with a 300-character component (ENAMETOOLONG)", "LG108",
         "", _long_name),
]


def build_all(directory: Path) -> dict[str, Path]:
    """Write every case under ``directory/<case name>``; the path to check for each."""
    out = {}
    for case in CASES:
        root = directory / case.name
        root.mkdir(parents=True)
        out[case.name] = case.build(root)
    return out


if __name__ == "__main__":  # python -m hostile.corpus DIR, from tests/
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "hostile-corpus")
    for name, path in build_all(target).items():
        print(f"{name:32} {path}")
