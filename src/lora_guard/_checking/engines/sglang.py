"""sglang 0.5.16 to 0.5.23: its LoRA flags (``sglang/srt/server_args.py``, from 0.5.20
``sglang/srt/arg_groups/fields/lora.py``) and its own rules, each with the releases it holds for
and its source."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from lora_guard._checking.engines.spec import (
    Engine,
    EngineOptionError,
    EngineProfile,
    Flag,
    Rule,
    ServeSpec,
)
from lora_guard._reading.config import read_config
from lora_guard._reading.malformed import Malformed

__all__ = ["EMBEDDING_NAMES", "ENGINE", "config_names", "set_pool"]

_SGLANG_TARGETS = (
    "q_proj", "k_proj", "v_proj", "o_proj", "q_a_proj", "kv_a_proj_with_mqa", "q_b_proj",
    "kv_b_proj", "wq_b", "wk", "weights_proj", "gate_proj", "up_proj", "down_proj", "qkv_proj",
    "gate_up_proj", "embed_tokens", "lm_head", "qkvr", "wo_ud", "all",
)  # sglang/srt/utils/common.py:SUPPORTED_LORA_TARGET_MODULES + LORA_TARGET_ALL_MODULES
_SGLANG_FIELDS = "sglang/srt/arg_groups/fields/lora.py:Lora"

_SGLANG_FLAGS = (
    Flag("--enable-lora", "enable_lora", "bool", None,
         "LoRA on (set by --lora-paths too)"),
    Flag("--max-lora-rank", "max_lora_rank", "int", None,
         "pool rank; default: the largest r of --lora-paths (LG101)"),
    Flag("--lora-target-modules", "lora_target_modules", "list", None,
         "modules of the pool (q/k/v stack into qkv_proj, gate/up into gate_up_proj; 'all' "
         "every supported one); default: the union of the --lora-paths adapters' "
         "target_modules (LG104)", _SGLANG_TARGETS),
    Flag("--max-loras-per-batch", "max_loras_per_batch", "int", 8,
         "GPU slots of one batch; adapters beyond it wait (no limit on the set)"),
    Flag("--max-loaded-loras", "max_loaded_loras", "int", None,
         "adapters loaded at once; more is refused (LG110); must be >= --max-loras-per-batch"),
    Flag("--lora-strict-loading", "lora_strict_loading", "bool", False,
         "sglang refuses mismatched or missing keys itself; lora_guard refuses them either "
         "way (LG103, LG104)"),
    Flag("--experts-shared-outer-loras", "experts_shared_outer_loras", "bool", None,
         "MoE shared-outer layout forced on/off (default: detected from the weights); parsed, "
         "not modelled by the check yet"),
    Flag("--lora-paths", "lora_paths", "adapters", None,
         "adapters loaded at start-up: PATH, NAME=PATH or JSON {\"lora_name\", \"lora_path\"} "
         "(checked); without --max-lora-rank / --lora-target-modules their configs size the "
         "pool, and adapters checked beside them are judged as loaded later, by that pool"),
)


def _sglang_validate(options: Mapping[str, Any]) -> None:
    loaded, per_batch = options.get("max_loaded_loras"), options["max_loras_per_batch"]
    # sglang/srt/arg_groups/lora_hook.py:check_lora_server_args (server_args.py before 0.5.19)
    if loaded is not None and loaded < per_batch:
        raise EngineOptionError(
            f"--max-loaded-loras ({loaded}) must be >= --max-loras-per-batch ({per_batch}): "
            "sglang refuses to start")
    targets = options.get("lora_target_modules") or []
    if "all" in targets and len(targets) > 1:
        raise EngineOptionError(
            "--lora-target-modules: 'all' must be the only module given: sglang refuses to start")


def _sglang_build(options: Mapping[str, Any], release: EngineProfile) -> dict[str, Any]:
    targets = options.get("lora_target_modules")
    max_rank = options.get("max_lora_rank")
    rules = list(release.uses())
    start_up = _start_up_configs(options) if not targets or max_rank is None else None
    pool: Iterable[str] | None = None if not targets or "all" in targets else targets
    if max_rank is None:  # sglang sizes the pool by the largest r of --lora-paths
        if start_up is None:
            rules.append("rank-from-set")
        else:
            max_rank = max((c["r"] for c in start_up if type(c.get("r")) is int), default=None)
    if not targets:  # the pool's modules: the start-up adapters' (LoRAManager.init_lora_shapes)
        if start_up is None:
            rules.append("targets-from-set")
        else:
            pool = set_pool(start_up)
    return {
        "max_rank": max_rank,
        "target_modules": pool,
        "max_loaded": options.get("max_loaded_loras"),
        "engine_rules": rules,
    }


def _start_up_configs(options: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The ``adapter_config.json`` of each ``--lora-paths`` adapter, which sglang's pool is
    sized by when no ``--max-lora-rank`` / ``--lora-target-modules`` is given; None when no
    adapter is named, or one cannot be read here (a hub id, a missing folder: the check reads
    and reports it itself), and the set checked stands for the start-up adapters."""
    configs = []
    for _, path in options.get("lora_paths") or ():
        try:
            config, _ = read_config(path)
        except (Malformed, OSError, ValueError):
            return None
        configs.append(config)
    return configs or None


# sglang's names of the embeddings in a config's target_modules (get_normalized_target_modules)
EMBEDDING_NAMES = {"embed_tokens": "embed_tokens", "vocab_emb": "embed_tokens",
                   "embeddings": "embed_tokens", "word_embeddings": "embed_tokens",
                   "lm_head": "lm_head", "output": "lm_head", "unembed_tokens": "lm_head"}


def config_names(config: Mapping[str, Any]) -> frozenset[str] | None:
    """The modules a config's ``target_modules`` list names as sglang reads them: each name's
    last dotted part, an embedding by its own name (``output`` -> ``lm_head``); None for any
    other value (a string such as ``all-linear`` names every module)."""
    targets = config.get("target_modules")
    if not isinstance(targets, list):
        return None
    lasts = (name.rsplit(".", 1)[-1] for name in targets if isinstance(name, str))
    return frozenset(EMBEDDING_NAMES.get(last, last) for last in lasts)


def set_pool(configs: Iterable[Mapping[str, Any]]) -> frozenset[str] | None:
    """The modules of sglang's pool started without ``--lora-target-modules``: the union of
    the start-up adapters' ``target_modules`` (`config_names`); None when one is a string
    (``all-linear``: every module of the base) or none names any
    (``LoRAManager.init_lora_shapes``)."""
    union: set[str] = set()
    for config in configs:
        if isinstance(config.get("target_modules"), str):
            return None
        union |= config_names(config) or frozenset()
    return frozenset(union) or None



_SGLANG_RULES = (
    Rule("LG117", "peft_type must be a string whose lower case is 'lora' (an assert): 'lora' "
         "and 'Lora' load the same weights as 'LORA'; 'LORA ' with a space, null or a missing "
         "field fail the load", "sglang/srt/lora/lora.py:LoRAAdapter.__init__",
         uses=("peft-type-any-case",)),
    Rule("LG101", "r at most --max-lora-rank (default: the largest r of --lora-paths); sglang "
         "checks r only: a larger rank_pattern value loads and overflows the pool's rank",
         "sglang/srt/lora/mem_pool.py:LoRAMemoryPool.can_support", engine_refuses=False),
    Rule("LG105", "refuses DoRA, and an added_tokens.json with a token id at or past the "
         "base's vocab_size (ids below it, copied from the base tokenizer, are dropped first)",
         "sglang/srt/lora/lora_config.py:LoRAConfig.__init__; "
         "sglang/srt/lora/lora_manager.py:LoRAManager.validate_new_adapter"),
    Rule("LG105", "ignores bias, lora_bias, modules_to_save (lm_head too), aLoRA, "
         "layer_replication and QALoRA: such adapters load and serve wrongly; bias only where "
         "bias tensors are saved (bias=\"all\" on a base without biases saves none and serves "
         "as trained, measured by the engine tier's equivalence tests)",
         "sglang/srt/lora/lora.py:LoRAAdapter.initialize_weights", engine_refuses=False,
         uses=("bias-by-tensors",)),
    Rule("LG116", "PiSSA, OLoRA, CorDA and LoftQ initialisations are not read: such an "
         "adapter (not converted to plain LoRA) serves on the original base weights it no "
         "longer matches", "sglang/srt/lora/lora_config.py:LoRAConfig.__init__",
         engine_refuses=False),
    Rule("LG104", "the adapter's modules, normalised (q/k/v -> qkv_proj, gate/up -> "
         "gate_up_proj), must be among the pool's: --lora-target-modules, or without it the "
         "union of the start-up adapters' target_modules ('all-linear': every module). A "
         "config naming another module is refused (at start-up: the server does not start); "
         "weights of another module under a config that does not name it ('all-linear', an "
         "edited list) load, are skipped with a warning, and the first batch that uses the "
         "adapter fails (the scheduler stops)",
         "sglang/srt/lora/lora_manager.py:LoRAManager.init_lora_shapes; "
         "sglang/srt/lora/mem_pool.py:LoRAMemoryPool.can_support, "
         "LoRAMemoryPool.load_lora_weight_to_buffer",
         uses=("packed-slices", "target-modules-list", "pool-by-config")),
    Rule("LG104", "LoRA weights of embed_tokens or lm_head are read only when the adapter's "
         "own target_modules names the module (or is 'all' / 'all-linear'): otherwise they "
         "are dropped without a word (a debug log line) and the base module is served, "
         "whatever --lora-target-modules serves", "sglang/srt/lora/lora.py:"
         "LoRAAdapter._process_weight", engine_refuses=False,
         uses=("embeddings-by-config",)),
    Rule("LG202", "target_modules as a string other than 'all' / 'all-linear' (a PEFT regex), "
         "or null fails the load",
         "sglang/srt/lora/utils.py:get_normalized_target_modules; "
         "sglang/srt/lora/lora.py:LoRAAdapter._process_weight"),
    Rule("LG104", "q/k/v are stacked into qkv_proj from q_proj: a layer with LoRA on q_proj "
         "needs v_proj too (k_proj is zero-filled), k_proj or v_proj without q_proj is not "
         "stacked and finds no module; gate/up likewise from gate_proj (up_proj is "
         "zero-filled, never alone): otherwise the load fails",
         "sglang/srt/lora/lora.py:LoRAAdapter.normalize_qkv_proj, "
         "LoRAAdapter.normalize_gate_up_proj; "
         "sglang/srt/lora/utils.py:get_target_module_name", uses=("stacked-from-first",)),
    Rule("LG111", "the parts of one packed module (q/k/v, gate/up) must have one rank: a "
         "rank_pattern that gives them different ranks is refused when the weights are stacked",
         "sglang/srt/lora/lora.py:LoRAAdapter.normalize_qkv_proj",
         uses=("packed-ranks-uniform",)),
    Rule("LG112", "one scaling for the whole adapter, lora_alpha / r: use_rslora and "
         "alpha_pattern load and serve at the wrong strength",
         "sglang/srt/lora/lora.py:LoRAAdapter.__init__", engine_refuses=False,
         uses=("one-scaling",)),
    Rule("LG112", "a rank_pattern rank other than r (below it, or above it within "
         "--max-lora-rank) loads, and the first batch that uses the adapter fails: each "
         "module's slot in the pool is r wide (measured by the engine tier; its scaling, "
         "lora_alpha / r, would be wrong too)",
         "sglang/srt/lora/mem_pool.py:LoRAMemoryPool.load_lora_weight_to_buffer",
         uses=("one-scaling",)),
    Rule("LG106", "no dtype rule: weights are copied into the pool's buffers, in the model's "
         "dtype", "sglang/srt/lora/mem_pool.py:LoRAMemoryPool.load_lora_weight_to_buffer",
         uses=("cast",)),
    Rule("LG110", "more adapters than --max-loaded-loras are refused; --max-loras-per-batch is "
         "per batch, not a limit on the set",
         "sglang/srt/arg_groups/lora_hook.py:check_lora_server_args; "
         "sglang/srt/managers/tokenizer_manager.py", since="0.5.19"),
    Rule("LG110", "more adapters than --max-loaded-loras are refused; --max-loras-per-batch is "
         "per batch, not a limit on the set",
         "sglang/srt/server_args.py:ServerArgs.check_lora_server_args; "
         "sglang/srt/managers/tokenizer_manager.py", until="0.5.19"),
    Rule("LG111", "the experts of one MoE projection must have one rank: each expert's "
         "halves are copied into a pool slice of the adapter's rank, and an expert of another "
         "rank (rank_pattern) fails the copy when the adapter enters the pool",
         "sglang/srt/lora/mem_pool.py:LoRAMemoryPool.load_lora_weight_to_buffer",
         uses=("moe-expert-ranks",)),
    Rule("LG104", "MoE expert LoRA saved by PEFT's target_parameters "
         "(mlp.experts.base_layer.lora_A, mlp.experts.lora_A) is matched to no pool module: "
         "a weight's module is found by a pool module's name inside the weight's name, and "
         "none is in these; the adapter loads, they are skipped with a warning and the first "
         "batch that uses it fails, whatever --lora-target-modules says (measured by the "
         "engine tier)", "sglang/srt/lora/utils.py:get_target_module_name; "
         "sglang/srt/lora/mem_pool.py:LoRAMemoryPool.load_lora_weight_to_buffer",
         uses=("flat-experts-unmatched",)),
    Rule("LG104", "indexed shared-expert weights (shared_experts.<i>) are written over the "
         "routed experts' buffers without a word", "sglang/srt/lora/mem_pool.py:"
         "LoRAMemoryPool.load_lora_weight_to_buffer", until="0.5.23", engine_refuses=False,
         uses=("indexed-shared-overwrites",)),
    Rule("LG104", "indexed shared-expert weights (shared_experts.<i>) are refused",
         "sglang/srt/lora/mem_pool.py:LoRAMemoryPool.load_lora_weight_to_buffer",
         since="0.5.23", uses=("indexed-shared-refused",)),
)


ENGINE = Engine(
    "sglang", ("0.5.23", "0.5.22", "0.5.21", "0.5.20", "0.5.19", "0.5.18", "0.5.17", "0.5.16"),
    _SGLANG_FLAGS, _SGLANG_RULES, _sglang_build, _sglang_validate,
    serve=ServeSpec(programs=(("sglang", "serve"),),
                    modules=("sglang.launch_server", "sglang.srt.entrypoints.http_server"),
                    model_flags=("--model-path", "--model"), adapters="lora_paths",
                    needs_without_adapters=("max_lora_rank", "lora_target_modules")))
"""sglang: every flag and rule with the releases it holds for."""
