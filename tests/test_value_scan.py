"""The opt-in value scan: adapters that load and do nothing, or compute NaN.

`lora-guard check --scan-values` / `check_adapters(..., scan_values=True)` read each tensor
once; the adapters are saved by PEFT from a tiny Llama built from a config.
"""

from __future__ import annotations

import os
import pathlib
import warnings
from typing import Any

import pytest

import lora_guard as lg
from conftest_adapters import TINY_LLAMA
from lora_guard._checking import values as _values
from lora_guard._frontends.cli import main

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")
safetensors_torch = pytest.importorskip("safetensors.torch")

from peft import LoraConfig, get_peft_model  # noqa: E402

TARGETS = ["q_proj", "v_proj"]


def peft_adapter(folder: pathlib.Path, *, trained: bool = True, dtype: Any = None,
                 edit: Any = None) -> pathlib.Path:
    """A PEFT adapter; ``trained`` moves every LoRA weight off its initial value (PEFT
    initialises lora_B to zeros), ``edit(name, param)`` breaks some of them."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY_LLAMA))
    peft_model = get_peft_model(model, LoraConfig(r=8, target_modules=TARGETS))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                if trained:
                    param.add_(torch.randn_like(param) * 0.01)
                if edit is not None:
                    edit(name, param)
    if dtype is not None:
        peft_model = peft_model.to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model.save_pretrained(str(folder))
    return folder


def scan(folder: pathlib.Path) -> lg.Report:
    return lg.check_adapters([folder], scan_values=True)


def test_a_trained_adapter_scans_clean(tmp_path: pathlib.Path) -> None:
    assert scan(peft_adapter(tmp_path / "trained")).ok


def test_an_untrained_adapter_is_a_no_op_lg119(tmp_path: pathlib.Path) -> None:
    """save_pretrained right after get_peft_model: every lora_B is still PEFT's zeros."""
    folder = peft_adapter(tmp_path / "untrained", trained=False)

    assert lg.check_adapters([folder]).ok  # the header alone cannot tell
    report = scan(folder)

    assert report.codes() == ["LG119"]
    v = report.violations[0]
    assert "lora_B is all zeros in every one of its 4 modules " \
           "(model.layers.0.self_attn.q_proj and 3 more): the adapter computes the base " \
           "model unchanged" in v.message
    assert "after train()" in v.hint


def test_some_modules_left_at_zero_are_named(tmp_path: pathlib.Path) -> None:
    def lose_v_proj_b(name: str, param: Any) -> None:
        if "v_proj.lora_B" in name:
            param.zero_()

    report = scan(peft_adapter(tmp_path / "half", edit=lose_v_proj_b))

    assert report.codes() == ["LG119"]
    assert "lora_B is all zeros in 2 of its 4 modules (model.layers.0.self_attn.v_proj and " \
           "1 more)" in report.violations[0].message


@pytest.mark.parametrize("dtype", [None, "float16", "bfloat16"])
def test_nan_and_inf_weights_are_lg120(tmp_path: pathlib.Path, dtype: str | None) -> None:
    def diverge(name: str, param: Any) -> None:
        if name.startswith("base_model.model.model.layers.1.self_attn.q_proj.lora_A"):
            param.view(-1)[:3] = float("nan")
            param.view(-1)[3:5] = float("inf")
            param.view(-1)[5] = -float("inf")

    folder = peft_adapter(tmp_path / "nan", edit=diverge,
                          dtype=getattr(torch, dtype) if dtype else None)
    report = scan(folder)

    assert report.codes() == ["LG120"]
    assert "tensor base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight holds 3 " \
           "NaN and 3 Inf values (of 512)" in report.violations[0].message


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_16_bit_pattern_is_classified_as_torch_does(dtype: str) -> None:
    """All 65,536 values: NaN and Inf counted as torch.isnan / torch.isinf count them."""
    values = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(
        getattr(torch, dtype))
    chunk = values.view(torch.int16).numpy().tobytes()
    expected = (int(torch.isnan(values).sum()), int(torch.isinf(values).sum()))
    assert _values._nonfinite(chunk, dtype) == expected
    assert _values._stats_np(bytearray(chunk), 0, len(chunk), dtype) == (False, *expected)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_wide_floats_are_classified_as_torch_does(dtype: str) -> None:
    torch.manual_seed(0)
    bits = torch.randint(-(2**31), 2**31 - 1, (100_000,), dtype=torch.int64)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-45,
                            3.4e38], dtype=getattr(torch, dtype))
    if dtype == "float32":
        values = torch.cat([bits.to(torch.int32).view(torch.float32), special])
    else:
        values = torch.cat([(bits << 32 | bits.abs()).view(torch.float64), special])
    chunk = values.numpy().tobytes()
    expected = (int(torch.isnan(values).sum()), int(torch.isinf(values).sum()))
    assert _values._nonfinite(chunk, dtype) == expected
    assert _values._stats_np(bytearray(chunk), 0, len(chunk), dtype) == (False, *expected)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("stats", ["_stats_np", "_stats_py"])
def test_all_zero_means_every_bit_zero(dtype: str, stats: str) -> None:
    """+0.0 everywhere is a no-op; -0.0 or values whose squares underflow are not called
    zeros (the numpy test of wide floats starts from a dot product that is 0 for them)."""
    scan_chunk = getattr(_values, stats)
    torch_dtype = getattr(torch, dtype)
    for values, zero in ((torch.zeros(300, dtype=torch_dtype), True),
                         (torch.full((300,), -0.0, dtype=torch_dtype), False),
                         (torch.full((300,), 1e-40, dtype=torch.float64).to(torch_dtype),
                          bool(torch.all(torch.tensor(1e-40).to(torch_dtype) == 0)))):
        chunk = bytearray(values.view(torch.uint8).numpy().tobytes())
        assert scan_chunk(chunk, 0, len(chunk), dtype) == (zero, 0, 0), (values[0], dtype)


@pytest.mark.parametrize("chunk", [64, 10], ids=["64-bytes", "10-bytes-cutting-elements"])
@pytest.mark.parametrize("with_numpy", [True, False], ids=["numpy", "no-numpy"])
def test_tensors_larger_than_a_chunk_are_streamed(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, chunk: int,
        with_numpy: bool) -> None:
    """Memory stays bounded: every read fills one reused buffer of CHUNK bytes, and a value
    in the last chunk of a tensor is still found, with or without numpy, also when a chunk
    ends inside an element (10 bytes: two and a half float32)."""
    def last_value_nan(name: str, param: Any) -> None:
        if name.startswith("base_model.model.model.layers.0.self_attn.q_proj.lora_B"):
            param.view(-1)[-1] = float("nan")

    folder = peft_adapter(tmp_path / "late-nan", edit=last_value_nan)
    buffers: set[int] = set()
    reads: list[int] = []
    real_read_at = _values._read_at

    def read_at(fd: int, buf: bytearray, offset: int) -> int:
        buffers.add(id(buf))
        reads.append(len(buf))
        return real_read_at(fd, buf, offset)

    monkeypatch.setattr(_values, "CHUNK", chunk)
    monkeypatch.setattr(_values, "_read_at", read_at)
    if not with_numpy:
        monkeypatch.setattr(_values, "_NP", None)
    report = scan(folder)

    assert report.codes() == ["LG120"]
    assert "holds 1 NaN and 0 Inf values (of 512)" in report.violations[0].message
    assert set(reads) == {chunk} and len(reads) > 8 and len(buffers) == 1


def test_a_file_that_shrinks_before_its_values_are_read_is_lg108(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Truncated by another process after its header was read: LG108 saying so, not a
    hang on a read that returns nothing, nor a clean report."""
    folder = peft_adapter(tmp_path / "shrinking")
    weights = folder / "adapter_model.safetensors"
    spec = lg.inspect_adapter(folder)
    real_read_at = _values._read_at
    truncated: list[int] = []

    def read_at(fd: int, buf: bytearray, offset: int) -> int:
        if not truncated:  # what is left: one and a half float32
            truncated.append(offset)
            os.truncate(weights, offset + 6)
        return real_read_at(fd, buf, offset)

    monkeypatch.setattr(_values, "_read_at", read_at)
    report = lg.check_adapters([spec], scan_values=True)
    assert report.codes() == ["LG108"]
    assert "the file shrank while it was scanned" in report.violations[0].message


@pytest.mark.parametrize("with_numpy", [True, False], ids=["numpy", "no-numpy"])
def test_an_untrained_adapter_is_found_without_numpy_too(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, with_numpy: bool) -> None:
    folder = peft_adapter(tmp_path / "untrained", trained=False)
    if not with_numpy:
        monkeypatch.setattr(_values, "_NP", None)
    assert scan(folder).codes() == ["LG119"]
    assert scan(peft_adapter(tmp_path / "trained")).ok


def test_a_file_changed_after_inspection_is_scanned_as_it_is_now(tmp_path: pathlib.Path) -> None:
    folder = peft_adapter(tmp_path / "swapped")
    spec = lg.inspect_adapter(folder)
    (folder / "adapter_model.safetensors").write_bytes(b"\x00" * 4)

    report = lg.check_adapters([spec], scan_values=True)

    assert report.codes() == ["LG108"]
    assert "when its values were scanned" in report.violations[0].message


def test_the_cli_scans_values_when_asked(tmp_path: pathlib.Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    folder = peft_adapter(tmp_path / "untrained", trained=False)
    assert main(["check", str(folder)]) == 0
    capsys.readouterr()
    assert main(["check", str(folder), "--scan-values"]) == 1
    assert "LG119" in capsys.readouterr().out


def test_scan_values_takes_a_bool(tmp_path: pathlib.Path) -> None:
    with pytest.raises(TypeError, match="scan_values"):
        lg.check_adapters([tmp_path], scan_values="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(("dtype", "pattern"), [
    ("float16", 0x7C00), ("float16", 0xFC00), ("float16", 0x7C01), ("float16", 0xFFFF),
    ("bfloat16", 0x7F80), ("bfloat16", 0xFF80), ("bfloat16", 0x7F81), ("bfloat16", 0xFFFF),
])
@pytest.mark.parametrize("stats", ["_stats_np", "_stats_py"])
def test_one_non_finite_16_bit_value_alone_among_finite_ones_is_found(
        dtype: str, pattern: int, stats: str) -> None:
    """+Inf, -Inf and the smallest and largest NaN patterns, each the only one in a chunk of
    finite values of both signs: the edges of the two ranges the quick test looks at."""
    finite = [0x3C00, 0xBC00, 0x7BFF, 0xFBFF] if dtype == "float16" else [
        0x3F80, 0xBF80, 0x7F7F, 0xFF7F]  # 1, -1, the largest finite, its negative
    chunk = bytearray(b"".join(v.to_bytes(2, "little") for v in [*finite, pattern, *finite]))
    is_inf = pattern & 0x7FFF in (0x7C00, 0x7F80)
    assert getattr(_values, stats)(chunk, 0, len(chunk), dtype) == (
        False, 0 if is_inf else 1, 1 if is_inf else 0)
    clean = bytearray(b"".join(v.to_bytes(2, "little") for v in finite))
    assert getattr(_values, stats)(clean, 0, len(clean), dtype) == (False, 0, 0)


@pytest.mark.parametrize("stats", ["_stats_np", "_stats_py"])
def test_only_the_bytes_of_the_segment_are_tested(stats: str) -> None:
    """A segment's offset and size are honoured: non-zero or NaN bytes next to it do not
    count; a tensor that is not a float (or a tail shorter than one element) gets the zero
    test only."""
    scan_chunk = getattr(_values, stats)
    nan = (0x7E00).to_bytes(2, "little")
    buf = bytearray(nan + bytes(8) + nan)
    assert scan_chunk(buf, 2, 8, "float16") == (True, 0, 0)
    assert scan_chunk(buf, 0, 10, "float16") == (False, 1, 0)
    assert scan_chunk(buf, 2, 10, "float16") == (False, 1, 0)
    ints = bytearray(bytes(4) + b"\x01" + bytes(3))
    assert scan_chunk(ints, 0, 4, "int8") == (True, 0, 0)
    assert scan_chunk(ints, 0, 8, "int8") == (False, 0, 0)
    assert scan_chunk(ints, 4, 4, "uint8") == (False, 0, 0)
    assert scan_chunk(bytearray(nan), 0, 1, "float16") == (True, 0, 0)
    assert scan_chunk(bytearray(nan), 1, 1, "float16") == (False, 0, 0)
