"""Replica of the sglang package for lora_guard's tests (not the real sglang)."""

__version__ = "0.5.23"
