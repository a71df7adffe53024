"""``decode_jpeg``, as sglang 0.5.16 to 0.5.20 import it at module level in
``sglang/srt/utils/common.py`` (0.5.21 and later import it lazily). Never called by the LoRA
code the tier drives: calling it says so."""

from typing import Any


def decode_jpeg(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("the engine tier's torchvision stand-in decodes no images")
