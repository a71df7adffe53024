"""vLLM 0.29.0 to 0.34.0: its LoRA flags (``vllm/engine/arg_utils.py``,
``vllm/config/lora.py``) and its own rules, each with the releases it holds for and its source."""

from __future__ import annotations

import functools
import types
from collections.abc import Mapping
from typing import Any

from lora_guard._checking.engines import vllm_embeddings
from lora_guard._checking.engines.spec import (
    Engine,
    EngineOptionError,
    EngineProfile,
    Flag,
    Rule,
    ServeSpec,
    in_range,
)

__all__ = ["EMBEDDINGS", "ENGINE", "embedding_lora"]

_VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
_VLLM_HEADS = ("classifier", "score")
_VLLM_ARGS = "vllm/engine/arg_utils.py:EngineArgs.add_cli_args"
_VLLM_CONFIG = "vllm/config/lora.py:LoRAConfig"

_VLLM_FLAGS = (
    Flag("--enable-lora", "enable_lora", "bool", None,
         "LoRA on (--disable-lora off); without it no adapter serves"),
    Flag("--max-lora-rank", "max_lora_rank", "choice", 16,
         "largest rank served, r and every rank_pattern value (LG101)", _VLLM_RANKS),
    Flag("--max-loras", "max_loras", "int", 1,
         "GPU slots used in one batch; adapters beyond it are swapped in (no limit on the set)"),
    Flag("--max-cpu-loras", "max_cpu_loras", "int", None,
         "CPU cache of loaded adapters (default --max-loras), LRU: no limit on the set; must be "
         ">= --max-loras"),
    Flag("--lora-dtype", "lora_dtype", "choice", "auto",
         "dtype adapter weights are cast to (auto = the model's): every dtype serves",
         ("auto", "float16", "bfloat16")),
    Flag("--lora-target-modules", "lora_target_modules", "list", None,
         "module suffixes LoRA is applied to (packed qkv_proj/gate_up_proj match their parts "
         "and the reverse); default all the model supports (LG104)"),
    Flag("--fully-sharded-loras", "fully_sharded_loras", "bool", False, "no bearing on a check"),
    Flag("--specialize-active-lora", "specialize_active_lora", "bool", False,
         "no bearing on a check (CUDA graphs per active-adapter count)"),
    Flag("--enable-tower-connector-lora", "enable_tower_connector_lora", "bool", False,
         "LoRA on a multimodal model's vision tower and connector; parsed, not modelled by "
         "the check yet (a tower's weights are checked against the base's config)"),
    Flag("--enable-mixed-moe-lora-format", "enable_mixed_moe_lora_format", "bool", False,
         "2D and 3D MoE adapters in one deployment; parsed, not modelled by the check yet"),
    Flag("--enable-moe-shared-loras", "enable_moe_shared_loras", "bool", False,
         "MoE adapters in the shared-outer layout; parsed, not modelled by the check yet"),
    Flag("--max-lora-cls-labels", "max_lora_cls_labels", "int", None,
         "no bearing on a check from headers", since="0.31.0"),
    Flag("--lora-modules", "lora_modules", "adapters", None,
         "adapters served: name=path or JSON {\"name\", \"path\"} (checked)"),
    Flag("--runner", "runner", "choice", "auto",
         "pooling serves classification heads (modules_to_save classifier/score); auto runs a "
         "*ForCausalLM base as a generator, which has none (LG105)",
         ("auto", "generate", "pooling", "draft")),
    Flag("--convert", "convert", "choice", "auto",
         "classify turns a causal LM into a pooling model that serves the heads (embed "
         "serves none)", ("auto", "none", "embed", "classify")),
)


@functools.cache
def embedding_lora(version: str) -> Mapping[str, frozenset[str]]:
    """Architecture (``LlamaForCausalLM``) -> the embeddings (``embed_tokens``, ``lm_head``)
    vLLM ``version`` serves LoRA on: its model class's ``embedding_modules``
    (``vllm/lora/utils.py:get_supported_lora_modules``), read from that release's registry
    (`vllm_embeddings`, generated); LoRA on another embedding of that class is refused at
    load. An architecture not in the release's table gets no verdict.

    Example:
        >>> from lora_guard._checking.engines.vllm import embedding_lora
        >>> sorted(embedding_lora("0.34.0")["GemmaForCausalLM"])
        ['embed_tokens']
        >>> sorted(embedding_lora("0.31.0")["GemmaForCausalLM"])
        []
    """
    return types.MappingProxyType({
        arch: frozenset(served) for served, since, until, archs in vllm_embeddings.GROUPS
        if in_range(version, since, until) for arch in archs})


EMBEDDINGS = frozenset(name for served, *_ in vllm_embeddings.GROUPS for name in served)
"""Every embedding a release's table may list (``embed_tokens``, ``lm_head``, ``wte``)."""


def _vllm_validate(options: Mapping[str, Any]) -> None:
    cpu, slots = options.get("max_cpu_loras"), options["max_loras"]
    if cpu is not None and cpu < slots:  # vllm/config/lora.py:LoRAConfig._validate_lora_config
        raise EngineOptionError(
            f"--max-cpu-loras ({cpu}) must be >= --max-loras ({slots}): vLLM refuses to start")


def _vllm_build(options: Mapping[str, Any], release: EngineProfile) -> dict[str, Any]:
    rules = release.uses()
    heads = "served-heads" in rules
    pooling = options.get("runner") == "pooling" or options.get("convert") == "classify"
    return {
        "max_rank": options["max_lora_rank"],
        "target_modules": options.get("lora_target_modules"),
        "served_heads": _VLLM_HEADS if heads else None,
        "engine_rules": tuple(r for r in rules if r != "served-heads")
        + (("heads-need-pooling",) if heads and not pooling else ()),
    }


_VLLM_FEATURES_SOURCE = "vllm/lora/peft_helper.py:PEFTHelper._validate_features"
_VLLM_RULES = (
    Rule("LG117", "peft_type is not read: LoRA's in any spelling ('lora', 'LORA ' with a "
         "space, null, a missing field) loads the same weights as 'LORA' and serves; a name "
         "of another method stays LG117 (its weights are not LoRA's). Only the optional "
         "filesystem resolver plugin (VLLM_LORA_RESOLVER_CACHE_DIR) looks for 'LORA' exactly",
         "vllm/lora/peft_helper.py:PEFTHelper.from_local_dir, PEFTHelper.from_dict; "
         "vllm/plugins/lora_resolvers/filesystem_resolver.py:FilesystemResolver.resolve_lora",
         uses=("peft-type-unread",)),
    Rule("LG101", "r and every rank_pattern value at most --max-lora-rank (default 16); the flag "
         "takes only 1, 8, 16, 32, 64, 128, 256, 320, 512",
         "vllm/lora/peft_helper.py:PEFTHelper.validate_legal", since="0.32.0"),
    Rule("LG101", "r at most --max-lora-rank when the adapter loads (validate_legal reads r "
         "only); a larger rank_pattern value fails later, when its weights are copied into "
         "the layer's slots",
         "vllm/lora/peft_helper.py:PEFTHelper.validate_legal; "
         "vllm/lora/layers/base_linear.py:BaseLinearLayerWithLoRA.set_lora", until="0.32.0"),
    Rule("LG105", "refuses DoRA and bias other than none",
         f"{_VLLM_FEATURES_SOURCE}; vllm/lora/peft_helper.py:PEFTHelper.validate_legal"),
    Rule("LG105", "refuses every modules_to_save (no classification head is served)",
         _VLLM_FEATURES_SOURCE, until="0.31.0"),
    Rule("LG105", "refuses modules_to_save other than the classification heads classifier/"
         "score", _VLLM_FEATURES_SOURCE, since="0.31.0", uses=("served-heads",)),
    Rule("LG105", "a SEQ_CLS/TOKEN_CLS adapter gets the heads classifier/score added to "
         "modules_to_save, as PEFT does", "vllm/lora/peft_helper.py:PEFTHelper.__post_init__",
         since="0.34.0"),
    Rule("LG105", "a classification head (modules_to_save score/classifier) loads only on a "
         "cross-encoder (pooling) model: on a *ForCausalLM base run as a generator or with "
         "--convert embed the load fails",
         "vllm/lora/model_manager.py:LoRAModelManager._validate_modules_to_save",
         since="0.31.0", until="0.33.0"),
    Rule("LG105", "a classification head (modules_to_save score/classifier) loads only on a "
         "classify/token_classify pooling model: on a *ForCausalLM base run as a generator "
         "(no --runner pooling or --convert classify) or with --convert embed the load fails",
         "vllm/lora/model_manager.py:LoRAModelManager._validate_classification_head_lora",
         since="0.33.0"),
    Rule("LG105", "refuses lora_bias, aLoRA, layer_replication, BD-LoRA and QALoRA",
         _VLLM_FEATURES_SOURCE, since="0.32.0"),
    Rule("LG105", "lora_bias, aLoRA, layer_replication, BD-LoRA and QALoRA are not read: "
         "such adapters load without a word and serve wrongly",
         "vllm/lora/peft_helper.py:PEFTHelper.from_dict", until="0.32.0",
         engine_refuses=False),
    Rule("LG109", "weights named by a packed module (qkv_proj, gate_up_proj) load only on a "
         "model that has that module (Phi-3); on Llama the load fails: expected target "
         "modules q_proj, k_proj, v_proj, ...",
         "vllm/lora/lora_model.py:LoRAModel.from_local_checkpoint",
         uses=("packed-names-native",)),
    Rule("LG104", "full embedding weights saved by save_embedding_layers are skipped only "
         "as <module>.base_layer.weight (embed_tokens, lm_head targeted by LoRA); saved as "
         "<module>.weight (the embedding was no LoRA target) the key is refused as an "
         "unsupported LoRA weight and the load fails",
         "vllm/lora/utils.py:is_base_embedding_weights, parse_fine_tuned_lora_name; "
         "vllm/lora/lora_model.py:LoRAModel.from_local_checkpoint",
         uses=("plain-embeddings-refused",)),
    Rule("LG104", "LoRA on embed_tokens / lm_head loads only on a model class that lists "
         "them in its embedding_modules, read from each release's registry (Llama, Qwen3, "
         "Phi-3: both; Gemma: embed_tokens from 0.34.0, neither before; GLM, Jais2, Mellum: "
         "lm_head too before 0.32.0; Qwen2, Mistral, Gemma 2: neither); elsewhere the load "
         "fails: expected target modules in {...}",
         "vllm/lora/utils.py:get_supported_lora_modules; "
         "vllm/lora/lora_model.py:LoRAModel.from_local_checkpoint",
         uses=("embeddings-by-architecture",)),
    Rule("LG116", "refuses PiSSA, OLoRA, CorDA and LoftQ initialisations that were not "
         "converted to plain LoRA (they rewrote the base weights in training)",
         "vllm/lora/peft_helper.py:PEFTHelper._init_is_supported", since="0.32.0"),
    Rule("LG116", "init_lora_weights is not read: a PiSSA, OLoRA, CorDA or LoftQ adapter not "
         "converted to plain LoRA loads without a word and serves on the original base "
         "weights it no longer matches", "vllm/lora/peft_helper.py:PEFTHelper.from_dict",
         until="0.32.0", engine_refuses=False),
    Rule("LG112", "one scaling per adapter, lora_alpha / r (/ sqrt(r) for rsLoRA): "
         "alpha_pattern and a rank_pattern rank other than r load and serve at the wrong "
         "strength", "vllm/lora/peft_helper.py:PEFTHelper.__post_init__", until="0.32.0",
         engine_refuses=False, uses=("one-scaling-rslora",)),
    Rule("LG112", "no scaling rule: each module is scaled by its own rank_pattern / "
         "alpha_pattern values, as PEFT does",
         "vllm/lora/peft_helper.py:PEFTHelper.get_rank_and_scaling; "
         "vllm/lora/lora_weights.py:LoRALayerWeights.from_config", since="0.32.0"),
    Rule("LG112", "MoE experts are packed with lora_alpha / r even for rsLoRA: an rsLoRA "
         "MoE adapter serves its experts at the wrong strength",
         "vllm/lora/lora_weights.py:PackedLoRALayerWeights.pack_moe", until="0.30.0",
         engine_refuses=False, uses=("moe-rslora-alpha-r",)),
    Rule("LG111", "the experts of one MoE projection must have one rank: pack_moe refuses "
         "experts of different ranks by name",
         "vllm/lora/lora_weights.py:PackedLoRALayerWeights.pack_moe", since="0.32.0",
         uses=("moe-expert-ranks",)),
    Rule("LG111", "the experts of one MoE projection must have one rank: pack_moe stacks "
         "them into one tensor, and experts of different ranks fail the load there",
         "vllm/lora/lora_weights.py:PackedLoRALayerWeights.pack_moe", until="0.32.0",
         uses=("moe-expert-ranks",)),
    Rule("LG002", "a 3-D (fused) MoE adapter on a model with 2-D MoE LoRA layers is refused "
         "unless --enable-mixed-moe-lora-format is given",
         "vllm/lora/model_manager.py:LoRAModelManager._validate_moe_lora_format",
         since="0.32.0", checked=False),
    Rule("LG104", "LoRA weights on a layer LoRA does not wrap although its name matches "
         "(BERT's pooler.dense) are refused", "vllm/lora/lora_model.py:"
         "LoRAModel.from_local_checkpoint", since="0.34.0", checked=False),
    Rule("LG105", "trainable_token_indices is not read; the adapter's token deltas are not "
         "served", "vllm/lora/peft_helper.py:PEFTHelper.from_dict", engine_refuses=False),
    Rule("LG105", "added_tokens.json is not read (extra-vocab support was removed): requests "
         "are tokenized with the base model's tokenizer, so an adapter's added tokens are split "
         "into base pieces and never produced; the adapter loads without a word",
         "vllm/lora/lora_model.py:LoRAModel.from_local_checkpoint; "
         "vllm/v1/engine/input_processor.py:InputProcessor._validate_lora",
         engine_refuses=False),
    Rule("LG104", "weight keys (not target_modules) are compared with the served modules; "
         "--lora-target-modules filters by suffix, and a packed module (qkv_proj, gate_up_proj) "
         "matches its parts and the reverse; a module outside the filter is not wrapped and "
         "its weights are ignored",
         "vllm/lora/utils.py:is_in_target_modules; "
         "vllm/lora/lora_model.py:LoRAModel.from_local_checkpoint", engine_refuses=False,
         uses=("packed-slices",)),
    Rule("LG106", "no dtype rule: weights are cast to --lora-dtype (auto = the model's dtype)",
         "vllm/config/lora.py:LoRAConfig.verify_with_model_config", uses=("cast",)),
    Rule("LG110", "no count rule: --max-loras is GPU slots per batch and --max-cpu-loras an LRU "
         "cache, so any number of adapters serves", _VLLM_CONFIG),
    Rule("LG103", "a lora_A without its lora_B (or a zero-size tensor, LG107, or a base of "
         "other dims, LG109) loads without a word and fails or serves wrongly later",
         "vllm/lora/lora_model.py:LoRAModel.from_local_checkpoint", engine_refuses=False),
)


ENGINE = Engine(
    "vllm", ("0.34.0", "0.33.0", "0.32.0", "0.31.0", "0.30.0", "0.29.0"),
    _VLLM_FLAGS, _VLLM_RULES, _vllm_build, _vllm_validate,
    serve=ServeSpec(programs=(("vllm", "serve"),),
                    modules=("vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main"),
                    module_subcommand="serve", model_positional=True, model_flags=("--model",),
                    adapters="lora_modules"))
"""vLLM: every flag and rule with the releases it holds for."""
