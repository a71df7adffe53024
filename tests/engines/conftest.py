"""The engine tier: the real vLLM and sglang LoRA modules, on a CPU (see ``_harness.py``).

It runs where the engines are installed (``tests/engines/requirements.txt``; the README's
"Engine tier" command builds that environment); elsewhere every module of the tier is skipped
with the reason, and nothing of the engines is imported.
"""

from __future__ import annotations

import os

import pytest

# nothing of the tier downloads: a name that is not a local folder must not reach the Hub
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

collect_ignore = ["_harness.py", "requirements.txt", "corpus.py", "moe.py", "agreement.py", "run",
                  "equivalence.py"]


def pytest_configure(config: pytest.Config) -> None:
    # the modules' `xdist_group` (one process per engine under -n); known without xdist too
    config.addinivalue_line("markers", "xdist_group(name): run this module's tests in one "
                                       "xdist worker")
