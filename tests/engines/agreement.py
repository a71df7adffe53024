"""Differential agreement: the real engine's own verdict on each corpus adapter, beside
lora_guard's runtime-integration verdict, and the page that publishes both.

An engine *refuses* an adapter when its loader (or, for sglang, the memory-pool admission of
the next batch) raises or returns a failed result; lora_guard *refuses* when its integration
reports a violation before the engine reads a tensor. The two must agree, except where the
engine accepts an adapter it then serves wrongly: those are `SILENT`, each with the reason.
`docs/engines/compatibility.md` holds one table per engine between markers; the tier fails
when the page and the engines disagree (``LORA_GUARD_WRITE_COMPAT=1`` rewrites it).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _harness as h
import corpus

import lora_guard as lg

PAGE = h.HERE.parents[1] / "docs" / "engines" / "compatibility.md"

SILENT: dict[str, dict[str, str]] = {
    "sglang": {
        "lora-bias": "sglang loads no LoRA bias: the adapter serves without the bias it trained",
        "bias-lora-only": "sglang ignores `bias`: the trained biases are dropped",
        "save-lm-head": "sglang ignores `modules_to_save`: the fully trained lm_head is dropped",
        "save-embed": "sglang ignores `modules_to_save`: the trained embed_tokens is dropped",
        "pissa": "PiSSA rewrote the base weights in training: on the original base, garbage",
        "olora": "OLoRA rewrote the base weights in training: on the original base, garbage",
        "loftq": "LoftQ trained on a quantised residual base: on the original base, garbage",
        "trainable-tokens": "sglang drops the trainable token deltas: new tokens are not served",
        "seq-cls-score": "sglang serves a causal LM: the trained `score` head is dropped",
        "good-rslora": "sglang scales by lora_alpha / r, not rsLoRA's lora_alpha / sqrt(r): "
                       "the delta serves at another strength",
        "good-alpha-pattern": "sglang scales every module by lora_alpha / r: the "
                              "alpha_pattern modules serve at another strength",
    },
    "vllm": {
        "rank-config-lies": "config r=8, tensors rank 4 (a mis-saved adapter): vLLM pads and "
                            "serves what was never trained that way",
        "vision-tower": "the text model has no vision tower: those weights load and are never "
                        "applied",
        "layer-beyond-base": "layer 7 of a 2-layer base: trained on another base, loads and is "
                             "never applied",
        "zero-size": "a zero-size lora_A loads: that module serves nothing",
        "missing-lora-b": "lora_A without lora_B loads: that module's delta is silently missing",
        "added-tokens": "vLLM reads no added_tokens.json and tokenizes with the base "
                        "tokenizer: the adapter's new tokens are never served",
    },
}


SILENT_BEFORE: dict[str, dict[str, dict[str, str]]] = {
    "vllm": {
        "0.32.0": {  # vllm/lora/peft_helper.py before 0.32: these fields are not read
            "lora-bias": "vLLM before 0.32 does not read lora_bias: the adapter serves "
                         "without the bias it trained",
            "pissa": "vLLM before 0.32 does not read init_lora_weights: PiSSA rewrote the "
                     "base in training, on the original base it serves garbage",
            "olora": "vLLM before 0.32 does not read init_lora_weights: OLoRA rewrote the "
                     "base in training, on the original base it serves garbage",
            "loftq": "vLLM before 0.32 does not read init_lora_weights: LoftQ trained on a "
                     "quantised residual base",
            "good-alpha-pattern": "vLLM before 0.32 scales every module by lora_alpha / r: "
                                  "the alpha_pattern modules serve at another strength",
            "good-rank-pattern-lower": "vLLM before 0.32 scales every module by lora_alpha / "
                                       "r: the rank_pattern modules serve at another strength",
            "rank-pattern-mixed-qkv": "vLLM before 0.32 scales every module by lora_alpha / "
                                      "r: q_proj at rank 16 serves at half its strength",
        },
    },
}
"""Engine -> first release that refuses (or serves right) -> cases the releases before it
accept and serve wrongly, with the reason."""


def silent(engine: str, version: str) -> dict[str, str]:
    """The engine-silent cases of one release: `SILENT` and those of `SILENT_BEFORE` that
    hold for ``version``."""
    from lora_guard._checking.engines import version_key

    found = dict(SILENT.get(engine, {}))
    for until, cases in SILENT_BEFORE.get(engine, {}).items():
        if version_key(version) < version_key(until):
            found.update(cases)
    return found


@dataclass(frozen=True)
class Row:
    case: corpus.Case
    engine: str  # "accepts" / "refuses"
    engine_says: str
    guard: str
    codes: tuple[str, ...]
    check: str  # `lora-guard check --engine` with the server's flags: "accepts" / "refuses"
    check_codes: tuple[str, ...]

    @property
    def agreement(self) -> str:
        return _agreement(self.engine, self.guard)

    @property
    def check_agreement(self) -> str:
        return _agreement(self.engine, self.check)


def _agreement(engine: str, lora_guard: str) -> str:
    if engine == lora_guard:
        return "agree"
    return "engine-silent" if engine == "accepts" else "MISS"


def _short(text: str, limit: int = 90) -> str:
    text = re.sub(r"/tmp/\S+", "<path>", " ".join(text.split()))
    text = re.sub(r"\{[^{}]*\}", "{...}", text)  # a set's order changes between processes
    text = text.replace("|", "/")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def sglang_verdict(name: str, path: Path) -> tuple[str, str, tuple[str, ...]]:
    manager = h.sglang_server(max_lora_rank=16, target_modules=set(corpus.ALL))
    with lg.recording() as seen:
        try:
            result = manager.load_lora_adapter(h.sglang_ref(name, path))
            if not result.success:
                said = result.error_message or "(an empty error message)"
                codes = tuple(dict.fromkeys(seen.codes)) if said.startswith("LG") else ()
                return "refuses", said, codes
            manager.fetch_new_loras({name})  # the memory pool admits it into a slot
        except Exception as exc:  # the engine's own failure, whatever it is
            return "refuses", f"{type(exc).__name__}: {exc}", ()
    return "accepts", "", ()


def vllm_verdict(name: str, path: Path, base: Path) -> tuple[str, str, tuple[str, ...]]:
    worker = h.vllm_server(base, max_lora_rank=16)
    with lg.recording() as seen:
        try:
            worker.add_adapter(h.vllm_request(name, 1, path))
        except lg.LoRAGuardError as exc:
            return "refuses", str(exc), tuple(dict.fromkeys(seen.codes))
        except Exception as exc:  # the engine's own refusal
            return "refuses", f"{type(exc).__name__}: {exc}", ()
    return "accepts", "", ()


SERVE_FLAGS: dict[str, tuple[str, ...]] = {
    "vllm": ("--max-lora-rank", "16"),
    "sglang": ("--max-lora-rank", "16", "--lora-target-modules", *corpus.ALL),
}
"""The servers' flags, as in `_harness`'s `vllm_server` and `sglang_server` of `rows`."""


def check_verdict(engine: str, path: Path, base: Path) -> tuple[str, tuple[str, ...]]:
    """`lora-guard check --engine ENGINE -- FLAGS --base-config BASE` on one adapter."""
    limits = lg.ServingLimits.for_engine(engine, *SERVE_FLAGS[engine], base_config=base)
    codes = tuple(dict.fromkeys(lg.check_adapters([path], limits).codes()))
    return ("refuses" if codes else "accepts"), codes


def rows(engine: str, root: Path, guard: Any) -> list[Row]:
    """Each corpus adapter through the real engine, first alone, then with lora_guard."""
    base = h.vllm_base_dir(root) if engine == "vllm" else None
    # Both servers run the tiny Llama of `_harness.llama_config`: its config.json is the base.
    base_config = h.vllm_base_dir(root / "checker-base") / "config.json"
    out = []
    for case in corpus.CASES:
        path = case.build(root / "adapters")
        verdicts = []
        for guarded in (False, True):
            if guarded:
                guard.instrument()
            try:
                if engine == "sglang":
                    verdicts.append(sglang_verdict(case.name, path))
                else:
                    assert base is not None
                    verdicts.append(vllm_verdict(case.name, path, base))
            finally:
                if guarded:
                    guard.uninstrument()
        (alone, said, _), (_, _, codes) = verdicts
        out.append(Row(case, alone, said, "refuses" if codes else "accepts", codes,
                       *check_verdict(engine, path, base_config)))
    return out


def table(engine: str, version: str, found: list[Row]) -> str:
    quiet = silent(engine, version)
    lines = []
    for label, of in (("lora_guard (runtime)", lambda r: r.agreement),
                      ("check --engine", lambda r: r.check_agreement)):
        agree = sum(of(r) == "agree" for r in found)
        quiet_count = sum(of(r) == "engine-silent" for r in found)
        lines.append(
            f"{engine} {version}, {label}: {len(found)} adapters; {agree} same verdict, "
            f"{quiet_count} engine-silent (lora_guard refuses, the engine would serve them "
            f"wrongly), {len(found) - agree - quiet_count} disagreements.")
        lines.append("")
    lines += [
        "| adapter | what | engine | engine says | lora_guard (runtime) | check --engine | "
        "agreement |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in found:
        why = quiet.get(r.case.name, "")
        verdict = r.agreement if not why else f"engine-silent: {why}"
        guard = r.guard + (f" ({', '.join(r.codes)})" if r.codes else "")
        check = r.check + (f" ({', '.join(r.check_codes)})" if r.check_codes else "")
        if r.check_agreement != r.agreement:
            verdict += f"; check --engine: {r.check_agreement}"
        lines.append(
            f"| `{r.case.name}` | {r.case.what} | {r.engine} | "
            f"{_short(r.engine_says) if r.engine_says else ''} | {guard} | {check} | "
            f"{verdict} |")
    return "\n".join(lines) + "\n"


def check_page(engine: str, text: str, version: str | None = None) -> str | None:
    """The page's block for ``engine`` ``version`` against ``text``: None when equal (or
    rewritten; a release without a block gets one at the end of the page). Without a
    version, the block named by ``engine`` alone (e.g. ``vllm measured``)."""
    name = engine if version is None else f"{engine} {version}"
    start, end = (f"<!-- {name} table: start -->\n", f"<!-- {name} table: end -->")
    page = PAGE.read_text(encoding="utf-8")
    if start not in page or end not in page:
        if os.environ.get("LORA_GUARD_WRITE_COMPAT") == "1":
            PAGE.write_text(f"{page.rstrip()}\n\n### {name}\n\n{start}{text}{end}\n",
                            encoding="utf-8")
            return None
        return (f"{PAGE} has no {name} table; rerun the tier with "
                "LORA_GUARD_WRITE_COMPAT=1 and review the diff")
    head, rest = page.split(start, 1)
    current, tail = rest.split(end, 1)
    if current == text:
        return None
    if os.environ.get("LORA_GUARD_WRITE_COMPAT") == "1":
        PAGE.write_text(head + start + text + end + tail, encoding="utf-8")
        return None
    return (f"{PAGE.name}: the {engine} table is stale; rerun the tier with "
            "LORA_GUARD_WRITE_COMPAT=1 and review the diff")
