"""LG110 (too-many-adapters): more adapters than the server has slots (`--max-loras`).

A check of the whole set, reported once for the set (`by_adapter["*"]`, the JSON report's
`set_violations`). Boundary tests (3 adapters against 2, 3, 4 slots) are in
`tests/test_boundaries.py`.
"""

from __future__ import annotations

import pathlib

import lora_guard as lg
from lora_guard._testing.adapter_writer import write_adapter
