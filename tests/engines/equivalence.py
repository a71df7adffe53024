"""Serving equivalence: what the real engine computes with each corpus adapter, measured.

For every corpus adapter and each engine, the engine's own model and LoRA layers are built on
the CPU over the base the adapter was trained on (its weights saved as served, loaded through
the engine's ``load_weights``), the adapter goes through the engine's own loader, and every
LoRA-wrapped module of the engine (each layer's projections, the embeddings, lm_head) runs in
prefill and in decode, beside PEFT's LoRA layers *as trained* (the model in memory after
training) and *reloaded* from the files (``PeftModel.from_pretrained``). The machinery is
``lora-guard verify``'s (`lora_guard._frontends.verify`), so the tier also tests that command.

Each adapter is then, against PEFT as trained:

- ``as trained``: every module within ``verify.TOLERANCE`` of PEFT;
- ``base``: the engine serves the base where the adapter changes something (ignored);
- ``other``: naming what it matches instead (scaled by x: rsLoRA ignored, an offset: a bias
  dropped, ...);
- ``refused``: the engine does not load it (nothing served);
- ``by source`` where a module forward cannot see the difference (tokenizer, classifier
  heads, towers): `BY_SOURCE`, each with its citation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _harness as h
import corpus
import torch

from lora_guard._frontends import verify

BY_SOURCE: dict[str, dict[str, str]] = {
    "sglang": {
        "seq-cls-score": "the trained `score` head is a classifier's, outside the causal LM "
                         "sglang serves (`sglang/srt/lora/lora_manager.py:init_lora_modules` "
                         "wraps decoder modules, embed_tokens and lm_head only)",
        "loftq": "LoftQ's init trains on a quantised residual of the base (bitsandbytes), "
                 "which the tier cannot build on a CPU: the case carries the config flag over "
                 "plain LoRA weights (`sglang/srt/lora/lora_config.py` does not read "
                 "`init_lora_weights`)",
    },
    "vllm": {
        "added-tokens": "the tokenizer, not a module: requests are tokenized with the base "
                        "tokenizer (`vllm/lora/lora_model.py:LoRAModel.from_local_checkpoint` "
                        "reads no added_tokens.json)",
        "vision-tower": "a tower the text model does not have: no module runs those weights "
                        "(`vllm/lora/lora_model.py:LoRAModel.from_local_checkpoint` keeps them)",
    },
}
"""Cases whose difference lies outside every module forward: the table cites the source."""


ANOTHER_BASE = {"other-base-hidden", "other-base-vocab", "packed-qkv", "seq-cls-score"}
"""Cases trained on another base on purpose: served on the tier's tiny Llama, like every
server of the tables; the others are served on the base they were trained on."""


@dataclass(frozen=True)
class Measured:
    case: str
    verdict: str  # as trained / base / other / refused / by source
    detail: str
    files: str  # the same summary against PEFT reloaded from the files
    results: tuple[verify.ModuleResult, ...] = ()

    @property
    def column(self) -> str:
        text = self.verdict + (f": {self.detail}" if self.detail else "")
        if self.files and self.files != self.verdict:
            text += f" (PEFT reloaded from the files: {self.files})"
        return text


def summarise(results: list[verify.ModuleResult], rounding: float = 0.0) -> tuple[str, str]:
    """An adapter's verdict and detail from its modules' results (both phases); ``rounding``:
    the relative error the adapter's saved dtype explains (fp16/bf16 files of an fp32 fit)."""
    off = [r for r in results if r.verdict != "as trained"
           and not (r.how.startswith("max diff") and r.diff <= rounding * r.effect)]
    if not off:
        return "as trained", ""
    changed = [r for r in results if r.effect > 0]
    parts = sorted({r.part.split(".")[-1] for r in off})
    layers = sorted({r.part for r in off})
    if all(r.verdict == "base" for r in off):
        verdict = "base" if {r.part for r in changed} <= {r.part for r in off} else "other"
        return verdict, (f"adapter ignored at {len(layers)} module(s) "
                         f"({', '.join(parts)})")
    hows = sorted({_rounded(r.how) for r in off if not r.how.startswith("max diff")})
    diffs = [r for r in off if r.how.startswith("max diff")]
    if diffs:  # the largest relative difference speaks for them
        worst = max(diffs, key=lambda r: r.diff / max(r.effect, 1e-12))
        hows.append(f"differs by up to {worst.diff:.3g} (the adapter's effect there: "
                    f"{worst.effect:.3g})")
    return "other", f"{', '.join(parts)}: {'; '.join(hows)}"


def _rounded(how: str) -> str:
    if how.startswith("offset"):
        return "an offset: a bias differs"
    return how


def measure_case(engine: str, case: corpus.Case, root: Path) -> Measured:
    keep: dict[str, Any] = {}
    path = case.build(root / "adapters", keep=keep)
    if case.name in BY_SOURCE[engine]:  # engines that accept these: the table's rows
        return Measured(case.name, "by source", BY_SOURCE[engine][case.name], "")
    base: Path = keep["base"]
    if case.name in ANOTHER_BASE:  # served on the tier's base, as the table's servers do
        base = h.vllm_base_dir(root / "served")
        if not list(base.glob("*.safetensors")):
            from transformers import AutoModelForCausalLM

            torch.manual_seed(0)
            AutoModelForCausalLM.from_config(h.llama_config()).save_pretrained(str(base))
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(base))
    dtype = torch.float32
    options: dict[str, Any] = {"target_modules": set(corpus.ALL)} if engine == "sglang" else {}
    try:
        served = verify.ENGINE_CLASSES[engine](base, config, path, max_rank=16, dtype=dtype,
                                                **options)
    except verify.Refused as exc:
        return Measured(case.name, "refused", h_short(str(exc)), "")
    references: list[tuple[str, verify.PeftReference]] = []
    try:
        files: verify.PeftReference | None = verify.PeftReference(path, config, dtype)
    except Exception as exc:  # PEFT itself cannot reload these files
        files, files_said = None, f"PEFT cannot reload it ({type(exc).__name__})"
    if case.name in ANOTHER_BASE:
        if files is None:
            return Measured(case.name, "other", "trained on another base: PEFT cannot load "
                            "it on the served base either", files_said)
        trained = files
    else:
        trained = verify.PeftReference(path, config, dtype, model=keep["model"])
    primary = files if files is not None else trained
    if files is not None:
        references.append(("trained", trained))
    found = verify.measure(served, primary, verify.BaseWeights(base), config, dtype=dtype,
                           tokens=verify._adapter_tokens(path), references=references)
    as_trained = found["trained"] if files is not None else found["files"]
    from safetensors import safe_open

    with safe_open(str(path / "adapter_model.safetensors"), framework="pt") as f:
        saved = {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118
    rounding = 8 * max([torch.finfo(t).eps for t in (torch.float16, torch.bfloat16)
                        if str(t).split(".")[1].replace("bfloat16", "BF16").replace(
                            "float16", "F16") in saved] or [0.0])
    verdict, detail = summarise(as_trained, rounding)
    if files is not None:
        files_verdict, files_detail = summarise(found["files"])
        files_said = files_verdict + (f": {files_detail}" if files_detail and (
            files_detail, files_verdict) != (detail, verdict) else "")
    return Measured(case.name, verdict, detail, files_said, tuple(as_trained))


def h_short(text: str) -> str:
    import agreement

    return agreement._short(text, 70)


def measure_all(engine: str, root: Path) -> dict[str, Measured]:
    return {case.name: measure_case(engine, case, root / case.name) for case in corpus.CASES}


def table(engine: str, version: str, found: dict[str, Measured],
          checker: dict[str, tuple[str, ...]]) -> str:
    """The measured column of the engine's table (its own block of the page)."""
    counts: dict[str, int] = {}
    for m in found.values():
        counts[m.verdict] = counts.get(m.verdict, 0) + 1
    lines = [f"{engine} {version}, measured: {len(found)} adapters; " + ", ".join(
        f"{n} {v}" for v, n in sorted(counts.items())) + ".", "",
        "| adapter | check --engine | measured (against PEFT as trained) |", "|---|---|---|"]
    for name, m in found.items():
        codes = checker.get(name, ())
        check = "refuses (" + ", ".join(codes) + ")" if codes else "accepts"
        lines.append(f"| `{name}` | {check} | {m.column.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def check_tier(engine: str, version: str, root: Path) -> dict[str, Measured]:
    """The equivalence tier's assertions for ``engine`` (each engine's test module calls it).

    - every engine-silent row of the agreement table is measured (served other than as
      trained, or the base) or cited by source;
    - no adapter that ``check --engine`` refuses is measured as trained (an over-flag), except
      a case that cannot be measured here (`BY_SOURCE`);
    - the page's measured block is current.
    """
    import agreement

    found = measure_all(engine, root)
    base_config = h.vllm_base_dir(root / "checker-base") / "config.json"
    checker: dict[str, tuple[str, ...]] = {}
    for case in corpus.CASES:
        path = root / case.name / "adapters" / case.name
        checker[case.name] = agreement.check_verdict(engine, path, base_config)[1]
    unmeasured = [n for n in agreement.SILENT[engine]
                  if found[n].verdict in ("as trained", "refused")]
    assert unmeasured == [], f"engine-silent rows the measurement does not show: {unmeasured}"
    over = [n for n, codes in checker.items() if codes and found[n].verdict == "as trained"]
    assert over == [], f"lora_guard refuses these, the engine serves them as trained: {over}"
    block = table(engine, version, found, checker)
    stale = agreement.check_page(f"{engine} measured", block, version)
    assert stale is None, stale
    return found
