"""Build the differential corpus into a folder, for an engine whose environment cannot build it.

lmdeploy pins peft<=0.14.0, which cannot save aLoRA, trainable tokens or a current config, so
its tier builds the corpus with another Python that has a current PEFT (the main test
environment, or the newest engines' environment) and reads the folders it writes:

    python tests/engines/build_corpus.py ROOT   # ROOT/adapters/<case>, ROOT/checker-base

Each adapter is built exactly as `corpus.Case.build` builds it for vLLM and sglang.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1] / "src")]  # this checkout's lora_guard

import _harness as h  # noqa: E402  (after the path set-up above)
import corpus  # noqa: E402


def main(root: Path) -> None:
    for case in corpus.CASES:
        case.build(root / "adapters")
    h.vllm_base_dir(root / "checker-base")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
