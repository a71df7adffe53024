"""``lora-guard verify``: what the installed engine computes with an adapter, module by module.

The checker reads headers and predicts; ``verify`` measures. It builds the installed engine's own
model and LoRA layers on the CPU (vLLM's CPU punica wrapper, sglang's ``torch_native`` backend),
loads the adapter through the engine's own loader, and runs every LoRA-wrapped module of the
engine (every layer's projections, the embeddings, lm_head) on the same inputs as PEFT's own
LoRA layers reloaded from the adapter's files, in prefill and in decode. Each module is then
*as trained* (within `TOLERANCE` of PEFT), *base* (the engine ignores the adapter there), or
*differs*, with how (scaled by x, an offset such as a dropped bias, other).

The base model's weights are read lazily from its safetensors files, one engine module at a
time, and released after it (the engine's and PEFT's models are built without their weights),
so the memory it needs is about one module's weights, the embedding and lm_head being the
largest, plus the adapter.

Example (needs the engine installed; see docs/guides/verify.md)::

    lora-guard verify ./adapters/math --engine sglang --base ./models/llama-3-8b

    >>> from lora_guard._frontends.verify import classify
    >>> import torch
    >>> base = torch.zeros(2, 3); peft = torch.ones(2, 3)
    >>> classify(peft * 0.5, peft, base)
    ('differs', 'scaled by 0.5')
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

from lora_guard._frontends._verify_engines import (
    ENGINE_CLASSES,
    EngineModule,
    Refused,
    release_module,
)
from lora_guard._frontends._verify_peft import BaseWeights, PeftReference

TOLERANCE = 1e-4
"""A module serves *as trained* when the largest difference from PEFT's output is at most this
fraction of the adapter's effect there (the largest ``|PEFT - base|``), or of the output's
magnitude where the adapter changes nothing (fp32 on both sides: the rest is summation order)."""

ENGINES = ("vllm", "sglang")
VALIDATED_RELEASES: dict[str, tuple[str, ...] | None] = {"vllm": ("0.34.0",), "sglang": None}
"""The releases whose LoRA layers verify's driver was measured against, per engine (None: any
supported release). vLLM 0.31.0's CPU decode path, driven the same way, left every module at
the base: until that is understood, verify refuses vLLM releases it has not been measured on
rather than report what may be its own driver's fault."""
PHASES = ("prefill", "decode")
_TOKENS = 8
_SEED = 0


class VerifyError(Exception):
    """``verify`` cannot run: ``code`` names why, the message says what to do (exit 2)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"[{code}] {message}")
        self.code = code


# --- results --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModuleResult:
    """One PEFT module inside one engine module, in one phase."""

    module: str
    """The engine's module, e.g. ``model.layers.0.self_attn.qkv_proj``."""
    part: str
    """PEFT's module whose output slice this is, e.g. ``model.layers.0.self_attn.q_proj``."""
    phase: str
    verdict: str
    """``as trained``, ``base`` (the engine ignores the adapter here) or ``differs``."""
    how: str
    """For ``differs``: ``scaled by X``, ``offset (a bias) differs by X``, ``max diff X``."""
    effect: float
    """The adapter's effect here: the largest ``|PEFT - base|``."""
    diff: float
    """The largest ``|engine - PEFT|``."""


@dataclass(frozen=True)
class Report:
    engine: str
    version: str
    adapter: str
    results: tuple[ModuleResult, ...]
    refused: str = ""
    """The engine's own refusal to load the adapter (then ``results`` is empty)."""
    unloadable: str = ""
    """PEFT's own refusal to load the adapter's files (then ``results`` is empty)."""

    @property
    def verdict(self) -> str:
        """``refused`` (by the engine), ``unloadable`` (by PEFT), ``as trained`` (every
        module), ``base`` (every module the adapter changes is served as the base) or
        ``differs``."""
        if self.refused:
            return "refused"
        if self.unloadable:
            return "unloadable"
        off = [r for r in self.results if r.verdict != "as trained"]
        if not off:
            return "as trained"
        changed = {r.part for r in self.results if r.effect > 0}
        if all(r.verdict == "base" for r in off) and changed <= {r.part for r in off}:
            return "base"
        return "differs"


def _close(a: torch.Tensor, b: torch.Tensor, scale: float) -> bool:
    return float((a - b).abs().max()) <= TOLERANCE * max(scale, 1e-6)


def classify(engine: torch.Tensor, peft: torch.Tensor, base: torch.Tensor,
             scales: dict[str, float] | None = None) -> tuple[str, str]:
    """``(verdict, how)`` for one output: the engine's, PEFT's and the base's (no adapter).

    ``scales`` names the strengths an engine could serve instead of PEFT's (e.g. ``{"rsLoRA
    ignored (alpha/r)": 0.354}``): a scaled delta that matches one is named by it.
    """
    engine, peft, base = (t.detach().double() for t in (engine, peft, base))
    effect = float((peft - base).abs().max())
    magnitude = float(peft.abs().max())
    if _close(engine, peft, effect if effect > 0 else magnitude):
        return "as trained", ""
    if _close(engine, base, effect):
        return "base", "the adapter is not applied"
    served, trained = engine - base, peft - base
    norm = float((trained * trained).sum())
    if norm > 0:
        scale = float((served * trained).sum()) / norm
        if _close(served, trained * scale, effect * max(abs(scale), 1.0)):
            named = [name for name, value in (scales or {}).items()
                     if abs(value - scale) <= 1e-3 * max(abs(value), 1e-6)]
            return "differs", f"scaled by {scale:.4g}" + (f": {named[0]}" if named else "")
    offset = engine - peft
    if offset.dim() >= 2 and offset.shape[0] > 1 and _close(offset, offset[:1].expand_as(offset),
                                                            effect):
        return "differs", (f"offset (a bias) differs by up to "
                           f"{float(offset[0].abs().max()):.3g}")
    return "differs", f"max diff {float(offset.abs().max()):.3g} (effect {effect:.3g})"


def _check_base_files(base: Path) -> None:
    if not (base / "config.json").is_file():
        raise VerifyError("base-missing", f"{base} has no config.json: --base takes the base "
                          "model's folder (config.json and *.safetensors), as the engine serves "
                          "it; download it first, e.g. huggingface-cli download MODEL --local-dir "
                          "DIR")
    if not any(base.glob("*.safetensors")):
        raise VerifyError("base-weights-missing", f"{base} has no *.safetensors weights: verify "
                          "runs the base's modules and needs its weights (.bin checkpoints: "
                          "convert them to safetensors first)")


# --- the measurement --------------------------------------------------------------------------


def _inputs(kind: str, width: int, vocab: int, dtype: torch.dtype,
            tokens: Sequence[int]) -> torch.Tensor:
    generator = torch.Generator().manual_seed(_SEED)
    if kind == "embedding":
        picked = list(dict.fromkeys([*tokens, *torch.randint(
            0, vocab, (_TOKENS,), generator=generator).tolist()]))
        return torch.tensor([t for t in picked if 0 <= t < vocab], dtype=torch.long)
    return torch.randn(_TOKENS, width, generator=generator).to(dtype)


def _in_width(module: EngineModule, config: Any) -> int:
    base = getattr(module.module, "base_layer", module.module)
    for attr in ("input_size", "in_features", "embedding_dim"):
        value = getattr(base, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return int(config.hidden_size)


def _key_names(module: EngineModule, peft: PeftReference) -> list[str]:
    names = [p for p, _ in module.parts]
    if module.kind == "lm_head" and getattr(peft.inner.config, "tie_word_embeddings", False):
        names.append(names[0].replace("lm_head", "model.embed_tokens"))
    return names


def measure(engine: Any, peft: PeftReference, weights: BaseWeights, config: Any, *,
            dtype: torch.dtype, tokens: Sequence[int] = (),
            references: Sequence[tuple[str, PeftReference]] = (),
            progress: Callable[[int, int, str], None] | None = None,
            ) -> dict[str, list[ModuleResult]]:
    """Every engine module of ``engine`` against ``peft`` (and any other ``references``, e.g.
    PEFT as trained): ``{reference name: results}``, ``"files"`` for ``peft``."""
    everyone = [("files", peft), *references]
    adapter_config = peft.adapter_config
    modules = engine.modules(peft.out_size)
    found: dict[str, list[ModuleResult]] = {label: [] for label, _ in everyone}
    vocab = int(config.vocab_size)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    for count, module in enumerate(modules):
        if progress is not None:
            progress(count, len(modules), module.name)
        names = [p for p, _ in module.parts]
        read = peft.materialise(_key_names(module, peft), weights, dtype)
        for _, ref in references:
            ref.materialise(names, weights, dtype)
        engine.load(read)
        width = _in_width(module, config)
        x = _inputs(module.kind, width, vocab, dtype, tokens)
        for phase in PHASES:
            with torch.no_grad():
                served = engine.run(module, x, phase, True).float()
                plain = engine.run(module, x, phase, False).float()
            for label, ref in everyone:
                outputs = [ref.run(name, x).float() for name in names]
                trained = torch.cat(outputs, dim=-1) if len(outputs) > 1 else outputs[0]
                trained = trained[..., : served.shape[-1]]
                start = 0
                for (name, _), out in zip(module.parts, outputs, strict=True):
                    size = out.shape[-1]
                    cut = slice(start, start + size)
                    start += size
                    verdict, how = classify(served[..., cut], trained[..., cut],
                                            plain[..., cut], alternatives(adapter_config, name))
                    found[label].append(ModuleResult(
                        module=module.name, part=name, phase=phase, verdict=verdict, how=how,
                        effect=float((trained[..., cut] - plain[..., cut]).abs().max()),
                        diff=float((served[..., cut] - trained[..., cut]).abs().max())))
        if not (module.kind == "embedding" and tied):  # a tied lm_head reads it again
            release_module(module.module)
        peft.release(_key_names(module, peft))
    if progress is not None:
        progress(len(modules), len(modules), "")
    return found


def alternatives(adapter_config: dict[str, Any], part: str) -> dict[str, float]:
    """The strengths, relative to PEFT's, that an engine serving ``part`` by another rule would
    apply: rsLoRA read as plain LoRA, ``alpha_pattern`` or ``rank_pattern`` not read."""
    def pick(pattern: dict[str, Any], default: float) -> float:
        for key, value in (pattern or {}).items():
            if part == key or part.endswith("." + key) or part.split(".")[-1] == key:
                return float(value)
        return default

    r = pick(adapter_config.get("rank_pattern") or {}, float(adapter_config.get("r") or 8))
    alpha = pick(adapter_config.get("alpha_pattern") or {},
                 float(adapter_config.get("lora_alpha") or 8))
    rs = bool(adapter_config.get("use_rslora"))

    def strength(r_: float, alpha_: float, rs_: bool) -> float:
        return alpha_ / (math.sqrt(r_) if rs_ else r_)

    peft = strength(r, alpha, rs)
    out = {}
    if rs:
        out["rsLoRA ignored (alpha/r)"] = strength(r, alpha, False) / peft
    base_r = float(adapter_config.get("r") or 8)
    base_alpha = float(adapter_config.get("lora_alpha") or 8)
    if alpha != base_alpha:
        out["alpha_pattern ignored"] = strength(r, base_alpha, rs) / peft
    if r != base_r:
        out["rank_pattern ignored (alpha/r of the config's r)"] = strength(base_r, alpha,
                                                                          rs) / peft
    return out


_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
"""``--max-lora-rank`` values vLLM takes (sglang takes any)."""


def _max_rank(adapter: Path) -> int:
    """The server's max rank for this adapter alone: its largest rank, rounded up to a value
    vLLM takes (the rank is not what verify tests: the checker does that)."""
    config = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    largest = max([int(config.get("r") or 8), *(int(r) for r in
                                                (config.get("rank_pattern") or {}).values())])
    return next((r for r in _RANKS if r >= largest), largest)


def check_can_run(adapter: Path, engine: str, base: Path) -> Any:
    """Refuse early, before anything heavy is imported: a missing adapter, base or engine."""
    if engine not in ENGINES:
        raise VerifyError("engine-unknown", f"--engine takes one of {', '.join(ENGINES)}, "
                          f"not {engine!r}")
    if not (adapter / "adapter_config.json").is_file():
        raise VerifyError("adapter-missing", f"{adapter} has no adapter_config.json: give the "
                          "adapter's folder (PEFT's save_pretrained output)")
    _check_base_files(base)
    for needed in ("peft", "transformers", "safetensors", engine):
        if importlib.util.find_spec(needed) is None:
            extra = (f"pip install {engine} (the release you serve)" if needed == engine
                     else f"pip install {needed}")
            raise VerifyError("engine-missing" if needed == engine else "peft-missing",
                              f"verify runs {engine}'s own LoRA layers and PEFT's, and "
                              f"{needed} is not installed in this environment: {extra}, or run "
                              "verify where the server runs")
    validated = VALIDATED_RELEASES[engine]
    if validated is not None and _version(engine) not in validated:
        raise VerifyError("engine-release-unverified",
                          f"verify drives {engine}'s LoRA layers the way {engine} "
                          f"{', '.join(validated)} runs them and has not been measured on "
                          f"{engine} {_version(engine)}: run it in an environment with "
                          f"{engine}=={validated[-1]}, or check the adapter with "
                          f"lora-guard check --engine {engine}=={_version(engine)}")
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(base))


def verify(adapter: Path, *, engine: str, base: Path, dtype: torch.dtype = torch.float32,
           progress: Callable[[int, int, str], None] | None = None) -> Report:
    """Run ``engine``'s own LoRA layers with ``adapter`` on ``base`` and PEFT's, module by
    module (see the module docstring); raises `VerifyError` when it cannot run."""
    config = check_can_run(adapter, engine, base)
    torch.manual_seed(_SEED)
    # PEFT's model first: built on the meta device, which the engines' CPU shims (tensor
    # factories without pin_memory) would turn into a full allocation of the base
    peft: PeftReference | None = None
    unloadable = ""
    try:
        peft = PeftReference(adapter, config, dtype)
    except Exception as exc:  # PEFT itself cannot load these files on this base
        unloadable = f"{type(exc).__name__}: {exc}"
    try:
        served = ENGINE_CLASSES[engine](base, config, adapter, max_rank=_max_rank(adapter),
                                         dtype=dtype)
    except Refused as exc:  # the engine's own refusal of the adapter
        return Report(engine, _version(engine), str(adapter), (), str(exc))
    except Exception as exc:  # the engine cannot build this base on the CPU
        raise VerifyError("engine-setup", f"{engine} {_version(engine)} could not build "
                          f"{', '.join(getattr(config, 'architectures', None) or ['the base'])}"
                          f" on the CPU ({type(exc).__name__}: {exc}); verify supports the "
                          "architectures both the engine and transformers implement (Llama, "
                          "Qwen2, Mistral, ...): run it on a GPU server's environment, or "
                          "report the base") from exc
    if peft is None:
        return Report(engine, served.version, str(adapter), (), unloadable=unloadable)
    found = measure(served, peft, BaseWeights(base), config, dtype=dtype,
                    tokens=_adapter_tokens(adapter), progress=progress)
    return Report(engine, served.version, str(adapter), tuple(found["files"]))


def _version(engine: str) -> str:
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        return version(engine)
    return "?"


def _adapter_tokens(adapter: Path) -> list[int]:
    """Token ids the adapter trains (trainable tokens), to be among the embedding's inputs."""
    config = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    indices = config.get("trainable_token_indices") or []
    if isinstance(indices, dict):
        return sorted({int(i) for v in indices.values() for i in v})
    return [int(i) for i in indices]


# --- the command ------------------------------------------------------------------------------


def summarise(report: Report) -> list[str]:
    """The report as lines: one per module that is not as trained, then the verdict."""
    lines = [f"lora-guard verify: {report.adapter} on {report.engine} {report.version}"]
    if report.refused:
        lines.append(f"  the engine refuses to load it: {report.refused}")
        lines.append("verdict: refused (the engine does not serve it)")
        return lines
    if report.unloadable:
        lines.append(f"  PEFT cannot load its files on this base: {report.unloadable}")
        lines.append("verdict: unloadable (nothing to compare the engine with)")
        return lines
    off: dict[str, list[ModuleResult]] = {}
    for r in report.results:
        if r.verdict != "as trained":
            off.setdefault(r.part, []).append(r)
    for part, found in off.items():  # the first phase speaks for both when they agree
        phases = ", ".join(sorted({r.phase for r in found}))
        how = f": {found[0].how}" if found[0].how else ""
        lines.append(f"  {part:<48} {found[0].verdict}{how} ({phases})")
    good = len({r.part for r in report.results if r.verdict == "as trained"} -
               {r.part for r in report.results if r.verdict != "as trained"})
    total = len({r.part for r in report.results})
    lines.append(f"verdict: {report.verdict} ({good} of {total} modules as trained, prefill "
                 f"and decode; tolerance {TOLERANCE:g} of the adapter's effect)")
    return lines


def _bar(stream: TextIO) -> Callable[[int, int, str], None]:
    start = time.monotonic()
    tty = stream.isatty()

    def show(done: int, total: int, name: str) -> None:
        if not tty and done not in (0, total):
            return
        filled = int(30 * done / max(total, 1))
        text = (f"\r[{'#' * filled}{'.' * (30 - filled)}] {done}/{total} modules "
                f"{time.monotonic() - start:5.1f}s {name[:40]:<40}")
        stream.write(text if tty else text.strip("\r") + "\n")
        if done == total and tty:
            stream.write("\n")
        stream.flush()
    return show


def run(adapter: str, *, engine: str, base: str, out: TextIO, err: TextIO,
        progress: bool = True, as_json: bool = False) -> int:
    """``lora-guard verify``: 0 as trained, 1 differs/base/refused; `VerifyError` -> exit 2."""
    report = verify(Path(adapter), engine=engine, base=Path(base),
                    progress=_bar(err) if progress else None)
    if as_json:
        out.write(json.dumps({
            "adapter": report.adapter, "engine": report.engine, "version": report.version,
            "verdict": report.verdict, "refused": report.refused, "tolerance": TOLERANCE,
            "unloadable": report.unloadable,
            "modules": [dataclasses.asdict(r) for r in report.results]}, indent=1) + "\n")
    else:
        out.write("\n".join(summarise(report)) + "\n")
    return 0 if report.verdict == "as trained" else 1
