"""Memory a checked adapter keeps: bytes per adapter that `lg.check_adapters` still holds
when it returns (its `Report`), measured with tracemalloc, beside a budget; exits 1 when one
is over. Bytes, not timings: they hold on a loaded machine.

    python bench/bench_retention.py [N]      # N adapters per corpus (default 2,000)

A report keeps each adapter's spec (`Report.adapters`: path, whole config, tensors...). The
adapters of a fleet share their config, tensors and modules (`Recipe`); adapters that share
no bytes (``bench_check --distinct``: each its own ``revision`` and ``__metadata__``) keep
their own config, held compactly (`FrozenConfig`: values in a tuple beside its layout's
field positions, strings interned) instead of the parser's dict of fresh strings. The
budgets are what keeps 100,000 adapters under 300 MB in every output format (the CLI's
peak RSS, `bench_check.py --huge --cli`, recorded on the performance page):

- fleet (eight recipes): 1,000 bytes per adapter (measured 0.6 KB at 2,000: path, id, spec);
- distinct: 2,800 bytes per adapter (measured 2.4 KB at 2,000, the run's bounded caches of
  256 recipes included; 6.1 KB before the compact config).
"""

from __future__ import annotations

import gc
import pathlib
import sys
import tempfile
import tracemalloc

sys.path.insert(0, str(pathlib.Path(__file__).parent))

BUDGETS = {"fleet": 1_000, "distinct": 2_800}
"""Bytes per adapter a report may keep, by corpus."""


def retained(count: int, distinct: bool) -> float:
    """Bytes per adapter held by the report of ``count`` adapters, after a first check of
    another corpus (imports and lazily built tables are not counted)."""
    import bench_check

    import lora_guard as lg

    with tempfile.TemporaryDirectory() as tmp:
        warm = pathlib.Path(tmp) / "warm"
        bench_check.write_corpus(warm, 16, distinct)
        lg.check_adapters(warm)
        root = pathlib.Path(tmp) / "corpus"
        bench_check.write_corpus(root, count, distinct)
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            report = lg.check_adapters(root)
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        if len(report.adapters) != count or not report.ok:
            raise SystemExit(f"the corpus did not check clean: {report.codes()[:5]}")
        return (after - before) / count


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2_000
    over = False
    for corpus, budget in BUDGETS.items():
        per_adapter = retained(count, corpus == "distinct")
        status = "ok" if per_adapter <= budget else "OVER"
        over = over or per_adapter > budget
        print(f"{corpus:8s} {count:,} adapters: {per_adapter:7.0f} bytes kept per adapter  "
              f"budget {budget:,}  {status}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
