"""lmdeploy 0.18.0, its PyTorch engine: the LoRA flags of ``lmdeploy serve api_server``
(``lmdeploy/cli/serve.py``, ``lmdeploy/cli/utils.py:ArgumentHelper``) and its own rules, each
with its source in the release (files under ``lmdeploy/``; the config reader is the pinned
``peft<=0.14.0``'s).

lmdeploy reads the adapters once, at start-up (``PytorchEngineConfig.adapters``, ``--adapters
name=path``): ``pytorch/models/patch.py:add_adapters`` reads each config with PEFT 0.14's
``PeftConfig.from_pretrained``, sizes each module's buffers as the sum of the adapters' ranks,
and copies the weights in by name. It has no dynamic load, no rank cap and no count limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lora_guard._checking.engines.spec import (
    Engine,
    EngineOptionError,
    EngineProfile,
    Flag,
    Rule,
    ServeSpec,
)

__all__ = ["ENGINE", "PEFT_0_14_LORA_KEYS"]

PEFT_0_14_LORA_KEYS = frozenset((
    "alpha_pattern", "auto_mapping", "base_model_name_or_path", "bias", "eva_config",
    "exclude_modules", "fan_in_fan_out", "inference_mode", "init_lora_weights",
    "layer_replication", "layers_pattern", "layers_to_transform", "loftq_config",
    "lora_alpha", "lora_bias", "lora_dropout", "megatron_config", "megatron_core",
    "modules_to_save", "peft_type", "r", "rank_pattern", "revision", "runtime_config",
    "target_modules", "task_type", "use_dora", "use_rslora",
))
"""The keys of an ``adapter_config.json`` that peft 0.14.0's ``LoraConfig`` takes (its dataclass
fields): any other key makes ``PeftConfig.from_pretrained`` drop the config to PeftConfig's own
fields (``peft/config.py:PeftConfigMixin.from_peft_type``)."""

_LMDEPLOY_TARGETS = (
    "q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj", "gate_proj", "up_proj", "gate_up_proj",
    "down_proj", "lm_head",
)  # the modules of lmdeploy's Llama-family models built with LoRA slots (lora_adapters)
_PATCH = "lmdeploy/pytorch/models/patch.py:add_adapters"
_ADAPTER = "lmdeploy/pytorch/adapter/adapter.py"

_LMDEPLOY_FLAGS = (
    Flag("--adapters", "adapters", "adapters", None,
         "adapters served, fixed at start-up: NAME=PATH (one PATH alone is named 'default') "
         "(checked)"),
    Flag("--backend", "backend", "choice", None,
         "only the PyTorch engine serves adapters; not given, lmdeploy picks TurboMind for a "
         "model TurboMind supports (no adapter served); --backend turbomind with --adapters "
         "is refused by the check", ("pytorch", "turbomind")),
)


def _lmdeploy_validate(options: Mapping[str, Any]) -> None:
    # lmdeploy/cli/serve.py:SubCliServe.api_server passes adapters to PytorchEngineConfig only
    if options.get("adapters") and options.get("backend") == "turbomind":
        raise EngineOptionError(
            "--adapters with --backend turbomind: lmdeploy serves adapters only with its "
            "PyTorch engine and starts TurboMind without them; give --backend pytorch")


def _lmdeploy_build(options: Mapping[str, Any], release: EngineProfile) -> dict[str, Any]:
    return {"max_rank": None, "target_modules": _LMDEPLOY_TARGETS,
            "engine_rules": release.uses()}


_LMDEPLOY_RULES = (
    Rule("LG117", "configs are read by PeftConfig.from_pretrained of the pinned peft 0.14: "
         "only peft_type 'LORA' loads; 'lora', 'LORA ' with a space, null fail (KeyError), a "
         "missing field reads a bare PeftConfig that LoRA's fields do not fit (TypeError)",
         f"{_PATCH}; peft/config.py:PeftConfigMixin.from_peft_type (peft 0.14.0)"),
    Rule("LG110", "no count rule and no rank cap: the adapters are fixed at start-up and "
         "each module's buffers hold the sum of their ranks; there is no dynamic load",
         f"{_PATCH}; lmdeploy/pytorch/engine/model_agent/agent.py:BaseModelAgent._build_model"),
    Rule("LG202", "configs are read with the pinned peft<=0.14.0: a config carrying a key "
         "PEFT 0.14 does not know (peft_version, trainable_token_indices, "
         "alora_invocation_tokens, target_parameters...: every adapter saved by PEFT 0.15 or "
         "newer) comes back with r, lora_alpha and target_modules at their defaults, and the "
         "union of target_modules fails the start-up (TypeError)",
         f"{_PATCH}; peft/config.py:PeftConfigMixin.from_peft_type (peft 0.14.0)",
         uses=("peft-0.14-config",)),
    Rule("LG202", "target_modules is unioned as a set of names: a string ('all-linear', a "
         "regex) is read letter by letter and the weights find no LoRA slot (KeyError); two "
         "entries naming one module lmdeploy does not pack (the full paths PEFT saves for "
         "'all-linear': model.layers.0.mlp.down_proj, model.layers.1.mlp.down_proj) fail the "
         "start-up (AssertionError); null fails the union (TypeError)",
         f"{_PATCH}; {_ADAPTER}:find_all_target", uses=("target-modules-by-name",)),
    Rule("LG105", "only lora_A/lora_B .weight keys load: DoRA magnitudes, lora_bias, saved "
         "biases, modules_to_save, trainable tokens, embedding LoRA and the embeddings PEFT "
         "saves with an lm_head/embed_tokens target fail the start-up (AssertionError)",
         f"{_ADAPTER}:load_lora_weights", uses=("bias-by-tensors", "saved-embeddings-refused")),
    Rule("LG104", "weights are looked up by name in the model's LoRA slots (packed qkv_proj "
         "and gate_up_proj with their parts, o_proj, down_proj): a weight of any other module "
         "(a vision tower, MoE experts, a layer the base does not have) fails the start-up "
         "(KeyError)", f"{_ADAPTER}:load_lora_weights; {_ADAPTER}:find_all_target",
         uses=("packed-slices",)),
    Rule("LG112", "one scaling per adapter, lora_alpha / r: use_rslora and alpha_pattern load "
         "and serve at the wrong strength", f"{_ADAPTER}:get_ranks_and_scalings",
         engine_refuses=False, uses=("one-scaling",)),
    Rule("LG112", "every module's slot is sized at r: a rank_pattern rank other than r fails "
         "the start-up when its weights are copied (RuntimeError)",
         f"{_ADAPTER}:get_ranks_and_scalings; "
         "lmdeploy/pytorch/nn/linear/lora.py:LoRA.weight_loader_A", uses=("one-scaling",)),
    Rule("LG116", "init_lora_weights is not read: a PiSSA, OLoRA, CorDA or LoftQ adapter not "
         "converted to plain LoRA loads without a word and serves on the original base "
         "weights it no longer matches", _PATCH, engine_refuses=False),
    Rule("LG103", "a lora_A without its lora_B loads without a word: that module's slot of "
         "lora_B stays uninitialised (torch.empty) and serves garbage",
         f"{_PATCH}; {_ADAPTER}:load_lora_weights", engine_refuses=False),
    Rule("LG103", "each target_modules name gets a slot of rank r in every layer whose module "
         "name ends with it: a layer without its weights (layers_to_transform, "
         "layers_pattern) is never written and serves uninitialised memory (torch.empty)",
         f"{_PATCH}; {_ADAPTER}:find_all_target", engine_refuses=False,
         uses=("slots-in-every-layer",)),
    Rule("LG105", "added_tokens.json is not read: the adapter's added tokens are never "
         "served", _PATCH, engine_refuses=False),
    Rule("LG106", "no dtype rule: weights are copied into buffers of the model's dtype",
         "lmdeploy/pytorch/nn/linear/lora.py:LoRA.weight_loader_A", uses=("cast",)),
    Rule("LG105", "adapters are served by the PyTorch engine only: without --backend pytorch, "
         "lmdeploy picks TurboMind for a model TurboMind supports and serves no adapter",
         "lmdeploy/cli/serve.py:SubCliServe.api_server; lmdeploy/archs.py:autoget_backend",
         engine_refuses=False, checked=False),
)


ENGINE = Engine(
    "lmdeploy", ("0.18.0",), _LMDEPLOY_FLAGS, _LMDEPLOY_RULES, _lmdeploy_build,
    _lmdeploy_validate,
    serve=ServeSpec(programs=(("lmdeploy", "serve", "api_server"),), modules=(),
                    model_positional=True, model_flags=(), adapters="adapters"))
"""lmdeploy (PyTorch engine): every flag and rule with the releases it holds for."""
