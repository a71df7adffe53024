"""Replica of the vllm package for lora_guard's tests (not the real vLLM)."""

__version__ = "0.11.2"
