"""Where lora_guard's instructions go on a vLLM load of an adapter it has not seen, part by part.

    python bench/bench_vllm_first_load.py [--calls N] [--field "all linear"|q/v]

Runs in the engine environment under valgrind's callgrind, as ``bench_callgrind_loads.py``
(whose ``vllm-r8-first`` row gives the whole load's ratio): one real r8 load through vLLM's
``LoRAModel.from_local_checkpoint`` is intercepted where lora_guard checks it
(``_check_loaded``: the config and tensors vLLM read), then each part of that check is run
``N`` times on the same arguments with its own count: the whole check of a first load (its
remembered verdicts and module passes emptied before each call, outside the count), the same
for an adapter whose parts a load before had (a recipe's next adapter: its verdict alone
forgotten), and in it the
integration's parts (the limits, the verdict key, the look-up that misses, the tensors'
infos, the file rules, vLLM's packed-name rule, the report, the verdict remembered) and the
reader's and checker's (the config's fields, the spec, ``added_tokens.json``, the checks).
The first part, "first of its kind", forgets every memory lora_guard keeps (the reader's
too), as on the first adapter of its base, rank and modules a server loads. ``--field``
loads instead an r16 adapter of a base of Llama-3.2-1B's dimensions (``bench_engine_paths.py
--only vllm-field``'s: all linear modules, 112, or q/v, 32) on a worker serving that base.
Printed: instructions per call of each part, and which side it is on.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from bench_callgrind_loads import callgrind_counts  # noqa: E402  (one harness)


def _field(tmp: Path, label: str) -> tuple[Any, Path]:
    """A worker serving a base of Llama-3.2-1B's dimensions, and its field adapter ``label``
    (`bench_engine_paths.vllm_field_rows`'s)."""
    import _harness as h
    from bench_engine_paths import FIELD_BASE, _field_adapters

    worker = h.vllm_server(h.vllm_base_dir(tmp, h.llama_config(**FIELD_BASE)),
                           max_lora_rank=16, max_loras=4, max_cpu_loras=8, dtype="bfloat16")
    return worker, _field_adapters(tmp)[label]


def _parts(tmp: Path, field: str | None = None,
           ) -> list[tuple[str, str, Callable[[], Any], Callable[[], Any] | None]]:
    """(name, side, the part, its set-up outside the count) of a first vLLM load's check."""
    sys.path.insert(0, str(ROOT / "tests" / "engines"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import _harness as h

    from lora_guard._checking.check_adapters import spec_violations
    from lora_guard._checking.rules.context import _GUARDED
    from lora_guard._core.config import report
    from lora_guard._reading.adapters import (
        FrozenConfig,
        _read_added_tokens,
        build_spec,
        checked_config,
    )
    from lora_guard._reading.bounded import ValueKey, forget_all
    from lora_guard.integrations import _base
    from lora_guard.integrations import vllm as g

    env = h.vllm_env()
    if field is None:
        worker = h.vllm_server(h.vllm_base_dir(tmp), max_lora_rank=16, max_loras=4,
                               max_cpu_loras=8)
        path = h.peft_adapter(tmp / "v-r8", r=8, seed=8)
    else:
        worker, path = _field(tmp, field)
    seen: dict[str, Any] = {}
    check = g._check_loaded

    def keep(load: Any, config: dict[str, Any], tensors: dict[str, Any]) -> None:
        seen.update(load=load, config=config, tensors=tensors)
        check(load, config, tensors)

    g.instrument()
    g._check_loaded = keep  # type: ignore[assignment]
    try:
        assert worker.add_adapter(h.vllm_request("a", 1, path))
    finally:
        g._check_loaded = check  # type: ignore[assignment]
    load, config, tensors = seen["load"], seen["config"], seen["tensors"]
    del env
    limits = g._limits_for(load.expected, mapped=load.mapped, peft_helper=load.peft_helper,
                           server=load.server)
    key = _base.read_key(config, tensors, load.vocab)
    subject = g._subject(load.lora_dir)
    trimmed = {k: v for k, v in config.items() if k not in g._VLLM_KEYS}
    spec, found = _base.loaded_adapter(load.lora_dir, trimmed, tensors, subject, key=key)
    assert spec is not None
    assert not found
    folder = Path(load.lora_dir)
    checked = FrozenConfig(checked_config(dict(trimmed)))
    layout = ValueKey(key[1])
    infos, nbytes = _base._tensor_infos(tensors, layout)
    violations = spec_violations(spec, limits, subject=subject, vocab_size=load.vocab)

    def first() -> None:
        g._check_loaded(load, config, tensors)

    def forget() -> None:  # a first load: its verdict and its module pass not remembered
        g._CLEAN.clear()
        _GUARDED.clear()

    return [
        ("whole check (first of its kind)", "all", first, forget_all),
        ("whole check (first load)", "all", first, forget),
        ("whole check (parts seen)", "all", first, g._CLEAN.clear),
        ("_limits_for", "integration", lambda: g._limits_for(
            load.expected, mapped=load.mapped, peft_helper=load.peft_helper,
            server=load.server), None),
        ("read_key", "integration", lambda: _base.read_key(config, tensors, load.vocab), None),
        ("CleanVerdicts.clean (a miss)", "integration",
         lambda: g._CLEAN.clean(key, limits, load.lora_dir), g._CLEAN.clear),
        ("_subject + config copy", "integration", lambda: (
            g._subject(load.lora_dir), dict(config).pop("vllm_max_position_embeddings")), None),
        ("loaded_adapter (whole)", "both",
         lambda: _base.loaded_adapter(load.lora_dir, trimmed, tensors, subject, key=key), None),
        ("  checked_config + FrozenConfig", "reader",
         lambda: FrozenConfig(checked_config(dict(trimmed))), None),
        ("  _tensor_infos (a layout not seen)", "integration",
         lambda: _base._tensor_infos(tensors, layout), _base._LAYOUT_INFOS.clear),
        ("  _files_stay_inside", "integration",
         lambda: _base._files_stay_inside(load.lora_dir), None),
        ("  build_spec", "reader", lambda: build_spec(
            folder, checked, infos, {}, nbytes, added_tokens=None, entries_key=layout), None),
        ("  _read_added_tokens", "reader", lambda: _read_added_tokens(folder), None),
        ("spec_violations", "checker", lambda: spec_violations(
            spec, limits, subject=subject, vocab_size=load.vocab), _GUARDED.clear),
        ("spec_violations (parts seen)", "checker", lambda: spec_violations(
            spec, limits, subject=subject, vocab_size=load.vocab), None),
        ("_packed_names", "integration+checker",
         lambda: g._packed_names(spec, load.server.served, subject, violations), None),
        ("report([])", "core", lambda: report([]), None),
        ("CleanVerdicts.remember", "integration", lambda: g._CLEAN.remember(key, limits),
         g._CLEAN.clear),
    ]


def measure(calls: int, client: str, field: str | None) -> None:
    cg = ctypes.CDLL(client)
    with tempfile.TemporaryDirectory(prefix="lora-guard-callgrind-") as folder:
        parts = _parts(Path(folder), field)
        cg.cg_start()
        for index, (_name, _side, part, setup) in enumerate(parts):
            for counted in (3, calls):
                cg.cg_zero()
                for _ in range(counted):
                    if setup is not None:
                        cg.cg_toggle()  # the set-up is not counted
                        setup()
                        cg.cg_toggle()
                    part()
            cg.cg_dump(f"part{index}".encode())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50, help="calls per part (default 50)")
    parser.add_argument("--field", choices=("all linear", "q/v"),
                        help="a field-size adapter on a 1B-dims base instead of the toy r8")
    parser.add_argument("--client", help=argparse.SUPPRESS)  # set when run under valgrind
    args = parser.parse_args()
    if args.client:
        measure(args.calls, args.client, args.field)
        return 0
    found = callgrind_counts(__file__, ["--field", args.field] if args.field else [],
                             args.calls)
    if isinstance(found, int):
        return found
    counts = {int(name.removeprefix("part")): count for name, count in found}
    names = _names()
    print(f"## vLLM first load, lora_guard's check by part: instructions per call "
          f"({args.calls} calls a part, callgrind; adapter: {args.field or 'toy r8 q/v'})")
    for index, (name, side) in enumerate(names):
        print(f"{name:<34} {side:<20} {counts.get(index, float('nan')):12,.0f}")
    return 0


def _names() -> list[tuple[str, str]]:
    """The parts' names and sides, as `_parts` lists them (read from its source)."""
    text = Path(__file__).read_text()
    body = text[text.index("    return [\n        (\"whole"):text.index("def measure")]
    return re.findall(r'\(\s*"([^"]+)", "([^"]+)"', body)


if __name__ == "__main__":
    raise SystemExit(main())
