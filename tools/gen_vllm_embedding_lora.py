"""Print the table of which embeddings vLLM serves LoRA on, per architecture, for
``src/lora_guard/_checking/engines/vllm.py`` (``_EMBEDDING_LORA``).

vLLM applies LoRA to ``embed_tokens`` / ``lm_head`` only where the model class lists them in its
``embedding_modules`` (``vllm/lora/utils.py:get_supported_lora_modules``); on any other
``SupportsLoRA`` class an adapter with LoRA on them is refused at load ("expected target modules
in {...}"). Every architecture of vLLM's registry that imports here is loaded and read.

Run in the engine environment (vLLM installed, on a CPU):
    VLLM_TARGET_DEVICE=cpu PYTHONPATH=src python tools/gen_vllm_embedding_lora.py
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from lora_guard._frontends._verify_cpu import cpu_shims, vllm_cpu_platform


def main() -> None:
    cpu_shims()
    vllm_cpu_platform()
    import vllm
    from vllm.model_executor.models.interfaces import supports_lora
    from vllm.model_executor.models.registry import ModelRegistry

    groups: dict[tuple[str, ...], list[str]] = {}
    for arch in sorted(ModelRegistry.get_supported_archs()):
        try:
            cls = ModelRegistry._try_load_model_cls(arch)
        except Exception:
            continue
        if cls is None or not supports_lora(cls):
            continue
        served = tuple(sorted(getattr(cls, "embedding_modules", None) or {}))
        groups.setdefault(served, []).append(arch)
    print(f"# vLLM {vllm.__version__}: tools/gen_vllm_embedding_lora.py")
    print("_EMBEDDING_LORA_GROUPS: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (")
    for served, archs in sorted(groups.items()):
        print(f"    ({served!r}, (")
        line = "       "
        for arch in archs:
            item = f" {arch!r},"
            if len(line) + len(item) > 98:
                print(line)
                line = "       "
            line += item
        print(line)
        print("    )),")
    print(")")


if __name__ == "__main__":
    main()
