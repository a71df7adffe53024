"""What makes an adapter unreadable: `Malformed` (LG108) and `NotLoRA` (LG117), the file names
of an adapter folder, and the violation of an unreadable adapter."""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

from lora_guard._core.errors import Violation, make_violation

CONFIG_NAME = "adapter_config.json"


WEIGHTS_NAME = "adapter_model.safetensors"


ADDED_TOKENS_NAME = "added_tokens.json"


PICKLE_NAMES = ("adapter_model.bin", "adapter_model.pt", "adapter_model.pth", "pytorch_model.bin")


MAX_CONFIG_BYTES = 10_000_000


class Malformed(Exception):
    """An adapter that cannot be read safely: which file, and the problem."""

    code = "LG108"  # a subclass reports another code (LG140: a remote read failed)

    def __init__(self, file: str, problem: str, *, kind: str = "malformed",
                 **details: Any) -> None:
        self.file = file
        self.problem = problem
        self.kind = kind  # the LG108 message variant, which picks the fitting fix
        self.details = details  # more values for the message of a subclass's code
        super().__init__(f"{file}: {problem}")


def other_method(peft_type: object) -> bool:
    """Whether a config's ``peft_type`` names a PEFT method other than LoRA (``"LOHA"``,
    ``"IA3"``, any other word): only a string that is not LoRA in some spelling. How each
    engine reads LoRA's own spellings (``"lora"``, ``"LORA "``, null, a missing field) is its
    profile's to say (LG117's engine rules), not the reader's.

    Example:
        >>> [other_method(v) for v in ("IA3", "LORA", "lora", " Lora ", None, 5)]
        [True, False, False, False, False, False]
    """
    return isinstance(peft_type, str) and peft_type.strip().casefold() != "lora"


class NotLoRA(Malformed):
    """An adapter of another PEFT method (LoHa, IA3, ...): LG117, not a LoRA to check
    (`other_method`)."""

    code = "LG117"

    def __init__(self, peft_type: object) -> None:
        text = str(peft_type)
        method = PEFT_METHODS.get(text.strip().upper(), text)
        super().__init__(CONFIG_NAME, f"peft_type {text!r} is {method}, not LoRA",
                         kind="method", method=method, peft_type=text)


PEFT_METHODS: Mapping[str, str] = types.MappingProxyType({
    "ADALORA": "AdaLoRA", "ADAPTION_PROMPT": "adaption prompt", "BOFT": "BOFT",
    "BONE": "Bone", "C3A": "C3A", "CPT": "CPT", "DELORA": "DeLoRA", "FOURIERFT": "FourierFT",
    "GRALORA": "GraLoRA", "HRA": "HRA", "IA3": "IA3", "LN_TUNING": "LayerNorm tuning",
    "LOHA": "LoHa", "LOKR": "LoKr", "MISS": "MiSS",
    "MULTITASK_PROMPT_TUNING": "multitask prompt tuning", "OFT": "OFT", "OSF": "OSF",
    "P_TUNING": "P-tuning", "POLY": "Poly", "PREFIX_TUNING": "prefix tuning",
    "PROMPT_TUNING": "prompt tuning", "RANDLORA": "RandLoRA", "ROAD": "RoAd",
    "SHIRA": "SHiRA", "TRAINABLE_TOKENS": "trainable tokens", "VBLORA": "VB-LoRA",
    "VERA": "VeRA", "WAVEFT": "WaveFT", "XLORA": "X-LoRA",
})
"""Display names of PEFT's other methods, by ``peft_type``."""


def malformed_violation(subject: str, exc: Malformed) -> Violation:
    """The LG108 violation for an unreadable adapter (LG140 for a failed remote read)."""
    return make_violation(exc.code, exc.kind, subject, file=exc.file, problem=exc.problem,
                          **exc.details)
