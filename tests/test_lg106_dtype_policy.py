"""LG106 (dtype-policy): a dtype outside the served set, or mixed dtypes in one adapter.

A server that serves bf16 only (`dtypes=("bf16",)`) casts or refuses a float32 adapter: the
check names the dtype, the tensor and what is allowed.
"""

from __future__ import annotations

import pathlib

import lora_guard as lg
