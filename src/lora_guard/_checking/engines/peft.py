"""PEFT (``PeftModel.from_pretrained``): what it loads back, as the reference engine."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lora_guard._checking.engines.spec import Engine, EngineProfile, Rule
from lora_guard._reading.adapters import FEATURES

__all__ = ["ENGINE"]

_PEFT_RULES = (
    Rule("LG105", "every LoRA feature PEFT saves it loads back (DoRA, biases, modules_to_save, "
         "trainable tokens, aLoRA, layer replication; added tokens with the embeddings saved "
         "by save_embedding_layers, once the base is resized to the adapter's tokenizer)",
         "peft/tuners/lora/model.py:LoraModel"),
    Rule("LG106", "no dtype rule: loading copies into the model's own parameters",
         "peft/utils/save_and_load.py:set_peft_model_state_dict", uses=("cast",)),
    Rule("LG116", "a PiSSA or OLoRA adapter loads back as trained: PeftModel.from_pretrained "
         "redoes the (deterministic) init on the base; pissa_niter_N (randomised SVD), CorDA and "
         "LoftQ do not come out the same and stay refused",
         "peft/tuners/lora/layer.py:LoraLayer.update_layer", uses=("init-rerun",)),
    Rule("LG104", "LoRA goes only on the modules the adapter's config selects "
         "(target_modules, less exclude_modules and modules_to_save, in the layers "
         "layers_to_transform selects): the weights of any other module are dropped without "
         "a word, and a config that selects none fails the load",
         "peft/tuners/tuners_utils.py:check_target_module_exists", engine_refuses=False,
         uses=("peft-selects-modules",)),
    Rule("LG202", "layers_to_transform neither an integer nor a list fails the load "
         "(TypeError); layers_to_transform or layers_pattern beside a regex string "
         "target_modules, and layers_pattern without layers_to_transform, are refused",
         "peft/tuners/lora/config.py:LoraConfig.__post_init__; "
         "peft/tuners/tuners_utils.py:check_target_module_exists",
         uses=("peft-selects-modules",)),
)


def _peft_build(options: Mapping[str, Any], release: EngineProfile) -> dict[str, Any]:
    return {"allow": tuple(FEATURES), "engine_rules": release.uses()}


ENGINE = Engine("peft", ("0.21",), (), _PEFT_RULES, _peft_build)
"""PEFT: its rules (no serve flags)."""
