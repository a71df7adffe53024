"""Fuzzing the safetensors header reader and `lg.check_adapters` with Hypothesis.

The reader must answer every byte string with either a self-consistent header or a
`HeaderError`; the checker must answer every folder with a report, never an exception. The CI
run tries `CI_EXAMPLES` examples in all; ``pytest -m slow`` runs `SLOW_EXAMPLES` per test for
a nightly-style soak. The atheris harnesses in ``fuzz/`` drive the same properties for hours.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import lora_guard as lg
from lora_guard._reading.safetensors import (
    DTYPE_BITS,
    HeaderError,
    TensorInfo,
    parse_header,
    read_safetensors_header,
)

# These tests provoke violations on purpose: under `pytest --lora-guard` they are expected.
pytestmark = pytest.mark.lora_guard(allow=tuple(lg.INVARIANTS))

CI_EXAMPLES = {
    "header_bytes": 1500,
    "structured_header": 1000,
    "mutated_file": 1000,
    "check_adapters": 600,
}
"""Examples per CI run, by test; docs/reliability.md quotes these numbers."""
SLOW_EXAMPLES = 50_000


def fuzz_settings(name: str) -> settings:
    return settings(max_examples=CI_EXAMPLES[name], deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


SLOW = settings(max_examples=SLOW_EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# --- strategies ----------------------------------------------------------------------------

json_scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12,
)
dtypes = (st.sampled_from(sorted(DTYPE_BITS)) | st.sampled_from(["F16", "BF16", "F32"])
          | st.sampled_from(["Q4", "f16", "", "F128"]))
small = st.integers(0, 8)
dims = small | small | small | st.integers(0, 2**20) | st.sampled_from([-1, 2**63, 2**64,
                                                                          2**64 - 1])
names = st.text(min_size=1, max_size=40) | st.sampled_from([
    "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
    "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", "__metadata__"])


@st.composite
def headers(draw: st.DrawFn) -> tuple[dict[str, Any], int]:
    """A header dict and a data size: usually laid out correctly, then maybe damaged."""
    entries: dict[str, Any] = {}
    position = 0
    for name in draw(st.lists(names, max_size=6, unique=True)):
        if name == "__metadata__":
            entries[name] = draw(st.dictionaries(st.text(max_size=5), st.text(max_size=5),
                                                 max_size=3) | json_values)
            continue
        code = draw(dtypes)
        shape = draw(st.lists(dims, max_size=4))
        bits = DTYPE_BITS.get(code, 16) * math.prod(shape) if all(d >= 0 for d in shape) else 0
        size = bits // 8 if bits < 2**40 else 1
        entries[name] = {"dtype": code, "shape": shape,
                         "data_offsets": [position, position + size]}
        position += size
    data = position
    for _ in range(draw(st.integers(0, 2))):  # damage
        if not entries:
            break
        name = draw(st.sampled_from(sorted(entries)))
        how = draw(st.sampled_from(["field", "drop", "offsets", "data", "replace"]))
        entry = entries[name]
        if how == "field" and isinstance(entry, dict):
            entry[draw(st.sampled_from(["dtype", "shape", "data_offsets", "x"]))] = draw(
                json_values)
        elif how == "drop" and isinstance(entry, dict) and entry:
            entry.pop(draw(st.sampled_from(sorted(entry))))
        elif how == "offsets" and isinstance(entry, dict):
            entry["data_offsets"] = draw(st.lists(st.integers(-5, 2**65), max_size=3))
        elif how == "data":
            data = max(0, data + draw(st.integers(-64, 64)))
        else:
            entries[name] = draw(json_values)
    return entries, data


def assert_consistent(tensors: dict[str, TensorInfo], data_size: int) -> None:
    """What an accepted header guarantees: known dtypes, sizes that match, no gap/overlap."""
    position = 0
    for info in sorted(tensors.values(), key=lambda i: i.offsets):
        assert info.offsets[0] == position
        assert info.nbytes == info.offsets[1] - info.offsets[0]
        assert all(isinstance(d, int) and d >= 0 for d in info.shape)
        position = info.offsets[1]
    assert position == data_size


def read_bytes(raw: bytes, data_size: int) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    try:
        tensors, metadata = parse_header(raw, data_size)
    except HeaderError as exc:
        assert exc.problem and len(exc.problem) < 1_000
        raise
    assert_consistent(tensors, data_size)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    return tensors, metadata


# --- the header reader ---------------------------------------------------------------------


def _header_bytes(raw: bytes, data: int) -> None:
    try:
        tensors, _ = read_bytes(raw, data)
    except HeaderError as exc:
        event("refused: " + re.sub(r"'[^']*'|\[[^\]]*\]|\d+|\(.*", "_", exc.problem)[:48])
    else:
        event(f"read: {len(tensors)} tensors")


@fuzz_settings("header_bytes")
@given(raw=st.binary(max_size=300) | st.text(max_size=200).map(str.encode)
       | st.binary(max_size=300).map(lambda b: b'{"' + b), data=st.integers(0, 4096))
def test_any_header_bytes_are_read_or_refused_with_header_error(raw: bytes, data: int) -> None:
    _header_bytes(raw, data)


@fuzz_settings("structured_header")
@given(header=headers())
def test_a_damaged_header_is_refused_and_an_intact_one_is_consistent(
        header: tuple[dict[str, Any], int]) -> None:
    entries, data = header
    try:
        raw = json.dumps(entries).encode()
    except (ValueError, TypeError):  # pragma: no cover - strategies make JSON-able values
        return
    _header_bytes(raw, data)


def _mutate(base: bytes, ops: list[tuple[str, int, bytes]]) -> bytearray:
    """Apply truncations, bit flips, insertions and header-length rewrites, in order."""
    data = bytearray(base)
    for op, at, chunk in ops:
        at = at % (len(data) + 1)
        if op == "truncate":
            del data[at:]
        elif op == "flip" and at < len(data):
            data[at] ^= 0xFF
        elif op == "insert":
            data[at:at] = chunk
        elif op == "length":
            data[:8] = struct.pack("<Q", int.from_bytes(chunk[:8].ljust(8, b"\0"), "little"))
    return data


def _mutated_file(base: bytes, ops: list[tuple[str, int, bytes]], directory: str) -> None:
    data = _mutate(base, ops)
    path = os.path.join(directory, "adapter_model.safetensors")
    with open(path, "wb") as f:
        f.write(data)
    try:
        tensors, _ = read_safetensors_header(path)
    except HeaderError as exc:
        assert exc.problem
        event("refused: " + re.sub(r"'[^']*'|\[[^\]]*\]|\d+|\(.*", "_", exc.problem)[:48])
        return
    event("read")
    assert_consistent(tensors, os.path.getsize(path) - 8 - int.from_bytes(data[:8], "little"))


def _valid_file() -> bytes:
    head: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    position = 0
    for proj in ("q_proj", "v_proj"):
        for half, shape in (("A", [4, 8]), ("B", [8, 4])):
            key = f"base_model.model.model.layers.0.self_attn.{proj}.lora_{half}.weight"
            head[key] = {"dtype": "F16", "shape": shape,
                         "data_offsets": [position, position + 64]}
            position += 64
    raw = json.dumps(head).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(position)


VALID_FILE = _valid_file()
mutations = st.lists(st.tuples(st.sampled_from(["truncate", "flip", "insert", "length"]),
                               st.integers(0, 2**16), st.binary(min_size=1, max_size=16)),
                     min_size=1, max_size=4)


@fuzz_settings("mutated_file")
@given(ops=mutations)
def test_a_mutated_file_is_read_or_refused_never_crashes(ops: list[tuple[str, int, bytes]]
                                                         ) -> None:
    with tempfile.TemporaryDirectory() as directory:
        _mutated_file(VALID_FILE, ops, directory)


# --- the adapter checker -------------------------------------------------------------------

VALID_CONFIG: dict[str, Any] = {
    "peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"],
    "bias": "none", "rank_pattern": {}, "alpha_pattern": {}, "modules_to_save": None,
    "use_dora": False,
}
CONFIG_FIELDS = [*VALID_CONFIG, "target_parameters", "layers_to_transform", "lora_bias",
                 "trainable_token_indices", "base_model_name_or_path", "unknown_field"]


@st.composite
def configs(draw: st.DrawFn) -> bytes:
    config = dict(VALID_CONFIG)
    for _ in range(draw(st.integers(0, 3))):
        field = draw(st.sampled_from(CONFIG_FIELDS))
        if draw(st.booleans()):
            config[field] = draw(json_values)
        else:
            config.pop(field, None)
    raw = json.dumps(config).encode()
    if draw(st.integers(0, 9)) == 0:  # now and then, broken bytes
        raw = raw[: draw(st.integers(0, len(raw)))] + draw(st.binary(max_size=8))
    return raw


def _check_folder(config_raw: bytes, weights: bytes, directory: str,
                  limits: lg.ServingLimits) -> None:
    folder = Path(directory) / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_bytes(config_raw)
    (folder / "adapter_model.safetensors").write_bytes(weights)
    report = lg.check_adapters(folder, limits)  # must never raise
    event(" ".join(sorted({v.code for v in report.violations})) or "ok")
    assert all(v.code in lg.INVARIANTS for v in report.violations)
    assert report.ok == (not report.violations)
    if report.ok:
        spec = lg.inspect_adapter(folder)  # what passed must also inspect cleanly
        assert spec.rank >= 1


limits_strategy = st.sampled_from([
    lg.ServingLimits(),
    lg.ServingLimits(max_rank=8, target_modules=("q_proj", "v_proj"), max_loras=1),
    lg.ServingLimits(max_rank=2, dtypes=("bfloat16",)),
])


@fuzz_settings("check_adapters")
@given(config_raw=configs(), ops=st.lists(
    st.tuples(st.sampled_from(["truncate", "flip", "insert", "length"]),
              st.integers(0, 2**16), st.binary(min_size=1, max_size=16)), max_size=2),
    limits=limits_strategy)
def test_check_adapters_answers_any_folder_with_a_report(
        config_raw: bytes, ops: list[tuple[str, int, bytes]], limits: lg.ServingLimits) -> None:
    _check_mutated(config_raw, ops, limits)


def _check_mutated(config_raw: bytes, ops: list[tuple[str, int, bytes]],
                   limits: lg.ServingLimits) -> None:
    data = _mutate(VALID_FILE, ops)
    with tempfile.TemporaryDirectory() as directory:
        _check_folder(config_raw, bytes(data), directory, limits)


# --- the same, for hours: pytest -m slow -----------------------------------------------------


@pytest.mark.slow
@SLOW
@given(raw=st.binary(max_size=2000), data=st.integers(0, 2**20))
def test_slow_header_bytes(raw: bytes, data: int) -> None:
    _header_bytes(raw, data)


@pytest.mark.slow
@SLOW
@given(header=headers())
def test_slow_structured_header(header: tuple[dict[str, Any], int]) -> None:
    _header_bytes(json.dumps(header[0]).encode(), header[1])


@pytest.mark.slow
@SLOW
@given(config_raw=configs(), ops=mutations, limits=limits_strategy)
def test_slow_check_adapters(config_raw: bytes, ops: list[tuple[str, int, bytes]],
                             limits: lg.ServingLimits) -> None:
    _check_mutated(config_raw, ops, limits)


def test_the_reliability_page_quotes_these_counts() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "reliability.md").read_text("utf-8")
    assert f"{sum(CI_EXAMPLES.values()):,} examples per CI run" in page
    for name, count in CI_EXAMPLES.items():
        test = {"header_bytes": "test_any_header_bytes", "structured_header":
                "test_a_damaged_header", "mutated_file": "test_a_mutated_file",
                "check_adapters": "test_check_adapters_answers"}[name]
        row = next(line for line in page.splitlines() if test in line)
        assert f"| {count:,} |" in row
    assert f"{SLOW_EXAMPLES:,} examples" in page
