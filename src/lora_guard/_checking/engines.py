"""Engine profiles: what vLLM, sglang and PEFT serve, per release, from their own flags.

A profile is data (the engine's LoRA flags with their names and defaults, as its argument
parser for that release defines them) plus the few rules that are the engine's own. Each rule
cites the release's source file and function. `ServingLimits.for_engine` builds the limits
from a profile; the CLI's ``--engine`` and a pasted serve command go through the same code, so
the checker and the runtime integrations read one profile.

The verdict a profile gives is not "what the engine's loader says": it passes only what the
engine loads *and serves correctly*. Where an engine loads an adapter without a word and then
serves it wrongly, the profile still refuses it; each such rule says ``engine_refuses=False``.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lora_guard._core.catalogue import INVARIANTS
from lora_guard._reading.adapters import FEATURES

if TYPE_CHECKING:
    from lora_guard._checking.limits import ServingLimits

__all__ = [
    "ENGINES",
    "SPECS",
    "Engine",
    "EngineOptionError",
    "EngineProfile",
    "Flag",
    "ReleaseWarning",
    "Rule",
    "ServeCommand",
    "limits_for_engine",
    "parse_serve_command",
    "profile",
    "installed_version",
    "nearest_release",
    "running_limits",
]


class EngineOptionError(ValueError):
    """An engine name, release or LoRA flag that cannot be used (a usage error)."""


class ReleaseWarning(UserWarning):
    """The installed engine release is outside the supported range: the nearest supported
    release's profile is used."""


def _version_key(version: str) -> tuple[int, ...]:
    """``"0.31.0"`` -> (0, 31, 0); a piece that is not a number ends the key (``0.34.0rc1``,
    ``0.5.20.post1`` compare as their release)."""
    key: list[int] = []
    for piece in version.split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        key.append(int(digits.group()))
        if digits.group() != piece:
            break
    return tuple(key)


@dataclass(frozen=True)
class Flag:
    """One LoRA flag of an engine's serve command, as its argument parser defines it."""

    name: str
    """The flag, e.g. ``--max-lora-rank``."""
    dest: str
    """The option's name in Python, e.g. ``max_lora_rank``."""
    kind: str
    """``int``, ``bool``, ``choice`` (one of `choices`), ``list`` or ``adapters``."""
    default: Any
    """The engine's default for that release."""
    help: str
    """What it means for the check."""
    choices: tuple[Any, ...] = ()
    """For ``choice`` (and ``list``): the values the engine's parser accepts."""
    since: str | None = None
    """The first release that has the flag (None: every supported release)."""
    until: str | None = None
    """The first release without it (None: still there)."""

    def applies(self, version: str) -> bool:
        """Whether release ``version`` has this flag."""
        return _in_range(version, self.since, self.until)


@dataclass(frozen=True)
class Rule:
    """One rule of an engine, with the releases it holds for and its source in them."""

    code: str
    """The code lora_guard reports for it."""
    text: str
    """The rule, one sentence."""
    source: str
    """``file:function`` of the release's source it is read from."""
    engine_refuses: bool = True
    """False where the engine loads the adapter without a word and serves it wrongly (the
    profile refuses what the engine does not)."""
    since: str | None = None
    """The first release with this behaviour (None: every supported release)."""
    until: str | None = None
    """The first release without it (None: still there)."""
    uses: tuple[str, ...] = ()
    """The checker's engine rules (`ServingLimits.engine_rules`) this behaviour turns on."""
    checked: bool = True
    """False for a behaviour the check does not model yet (documented, never silent)."""

    def __post_init__(self) -> None:
        if self.code not in INVARIANTS:  # a code of the catalogue, checked as profiles load
            raise ValueError(f"Rule({self.code!r}, {self.text!r}): not a lora_guard code; "
                             "its entry goes in lora_guard/_core/catalogue/")

    def applies(self, version: str) -> bool:
        """Whether release ``version`` behaves so."""
        return _in_range(version, self.since, self.until)

    @property
    def releases(self) -> str:
        """The releases it holds for, for people: ``0.32.0+``, ``< 0.32.0``, ``all``."""
        if self.since and self.until:
            return f"{self.since} to < {self.until}"
        if self.since:
            return f"{self.since}+"
        return f"< {self.until}" if self.until else "all"


def _in_range(version: str, since: str | None, until: str | None) -> bool:
    key = _version_key(version)
    return ((since is None or key >= _version_key(since))
            and (until is None or key < _version_key(until)))


@dataclass(frozen=True)
class EngineProfile:
    """One release of one engine: its LoRA flags and its own rules (those that hold for it)."""

    engine: str
    version: str
    flags: tuple[Flag, ...]
    rules: tuple[Rule, ...]
    build: Callable[[Mapping[str, Any], EngineProfile], dict[str, Any]] = field(
        repr=False, compare=False)
    """Resolved options and the release -> `ServingLimits` keywords."""
    validate: Callable[[Mapping[str, Any]], None] = field(repr=False, compare=False,
                                                        default=lambda options: None)
    """Raises `EngineOptionError` for options the engine itself refuses at start-up."""

    @property
    def label(self) -> str:
        return f"{self.engine}=={self.version}"

    def flag(self, name: str) -> Flag | None:
        name = "--" + name.lstrip("-").replace("_", "-")
        return next((f for f in self.flags if f.name == name), None)

    def uses(self) -> tuple[str, ...]:
        """The checker's engine rules this release's behaviours turn on (in rule order)."""
        return tuple(dict.fromkeys(u for r in self.rules if r.checked for u in r.uses))


@dataclass(frozen=True)
class Engine:
    """One engine: its supported releases, and every flag and rule with the releases it holds
    for. A release's `EngineProfile` is the flags and rules that hold for it (`at`): one rule
    per behaviour, never a copy of a profile per release."""

    name: str
    releases: tuple[str, ...]
    """Supported releases, newest first: exactly those the engine tier can run."""
    flags: tuple[Flag, ...]
    rules: tuple[Rule, ...]
    build: Callable[[Mapping[str, Any], EngineProfile], dict[str, Any]] = field(
        repr=False, compare=False)
    validate: Callable[[Mapping[str, Any]], None] = field(repr=False, compare=False,
                                                        default=lambda options: None)

    def at(self, version: str) -> EngineProfile:
        """The profile of one supported release."""
        return EngineProfile(self.name, version,
                             tuple(f for f in self.flags if f.applies(version)),
                             tuple(r for r in self.rules if r.applies(version)),
                             self.build, self.validate)

    @property
    def supported_range(self) -> str:
        """``0.29.0 to 0.34.0``."""
        return f"{self.releases[-1]} to {self.releases[0]}"


# --- vLLM 0.29.0 to 0.34.0 -----------------------------------------------------------------

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
         engine_refuses=False, checked=False),
    Rule("LG111", "the experts of one MoE layer must have one rank",
         "vllm/lora/lora_weights.py:PackedLoRALayerWeights.pack_moe", since="0.32.0",
         checked=False),
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

# --- sglang 0.5.16 to 0.5.23 ---------------------------------------------------------------

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
         "every supported one); default: the union of the adapters' (LG104)", _SGLANG_TARGETS),
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
         "(checked)"),
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
    rules = list(release.uses())
    if options.get("max_lora_rank") is None:
        rules.append("rank-from-set")
    return {
        "max_rank": options.get("max_lora_rank"),
        "target_modules": None if not targets or "all" in targets else targets,
        "max_loaded": options.get("max_loaded_loras"),
        "engine_rules": rules,
    }


_SGLANG_RULES = (
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
    Rule("LG104", "the adapter's target modules, normalised (q/k/v -> qkv_proj, gate/up -> "
         "gate_up_proj), must be a subset of --lora-target-modules",
         "sglang/srt/lora/utils.py:get_normalized_target_modules; "
         "sglang/srt/lora/lora_manager.py:LoRAManager.init_lora_shapes",
         uses=("packed-slices", "target-modules-list")),
    Rule("LG202", "target_modules as a string other than 'all' / 'all-linear' (a PEFT regex) "
         "fails the load", "sglang/srt/lora/utils.py:get_normalized_target_modules"),
    Rule("LG111", "the parts of one packed module (q/k/v, gate/up) must have one rank: a "
         "rank_pattern that gives them different ranks is refused when the weights are stacked",
         "sglang/srt/lora/lora.py:LoRAAdapter.normalize_qkv_proj",
         uses=("packed-ranks-uniform",)),
    Rule("LG112", "one scaling for the whole adapter, lora_alpha / r: use_rslora, alpha_pattern "
         "and a rank_pattern rank other than r load and serve at the wrong strength",
         "sglang/srt/lora/lora.py:LoRAAdapter.__init__", engine_refuses=False,
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
    Rule("LG104", "indexed shared-expert weights (shared_experts.<i>) are written over the "
         "routed experts' buffers without a word", "sglang/srt/lora/mem_pool.py:"
         "LoRAMemoryPool.load_lora_weight_to_buffer", until="0.5.23", engine_refuses=False,
         checked=False),
    Rule("LG104", "indexed shared-expert weights (shared_experts.<i>) are refused",
         "sglang/srt/lora/mem_pool.py:LoRAMemoryPool.load_lora_weight_to_buffer",
         since="0.5.23", checked=False),
)

# --- PEFT ----------------------------------------------------------------------------------

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
)


def _peft_build(options: Mapping[str, Any], release: EngineProfile) -> dict[str, Any]:
    return {"allow": tuple(FEATURES), "engine_rules": release.uses()}


SPECS: Mapping[str, Engine] = {
    "vllm": Engine("vllm", ("0.34.0", "0.33.0", "0.32.0", "0.31.0", "0.30.0", "0.29.0"),
                   _VLLM_FLAGS, _VLLM_RULES, _vllm_build, _vllm_validate),
    "sglang": Engine("sglang", ("0.5.23", "0.5.22", "0.5.21", "0.5.20", "0.5.19", "0.5.18",
                                "0.5.17", "0.5.16"),
                     _SGLANG_FLAGS, _SGLANG_RULES, _sglang_build, _sglang_validate),
    "peft": Engine("peft", ("0.21",), (), _PEFT_RULES, _peft_build),
}
"""Engine -> its flags and rules, each with the releases it holds for."""

ENGINES: Mapping[str, tuple[EngineProfile, ...]] = {
    name: tuple(spec.at(v) for v in spec.releases) for name, spec in SPECS.items()}
"""Engine -> the profile of each supported release, newest first (views of `SPECS`)."""


def installed_version(engine: str) -> str | None:
    """The installed release of ``engine`` when it can be imported (its distribution's
    metadata, without importing it), else None."""
    if engine not in ("vllm", "sglang", "peft"):
        return None
    try:
        if importlib.util.find_spec(engine) is None:
            return None
        return importlib.metadata.version(engine)
    except (ImportError, ValueError, importlib.metadata.PackageNotFoundError):
        return None


def nearest_release(engine: str, version: str) -> str:
    """The supported release closest to ``version``: the newest for a later one, the oldest
    for an earlier one, else the newest at or below it."""
    releases = SPECS[engine].releases
    key = _version_key(version)
    if key >= _version_key(releases[0]):
        return releases[0]
    return next((r for r in releases if _version_key(r) <= key), releases[-1])


def profile(name: str, version: str | None = None, *, installed: bool = True) -> EngineProfile:
    """The profile of ``name`` (``"vllm"``, ``"vllm==0.31.0"``) at ``version``.

    Without a version: the installed release when the engine can be imported (``installed``
    true) and is supported, the nearest supported release (with a `ReleaseWarning`) when it is
    not, else the newest supported release. A version given that is not a supported release
    (or a prefix of one, ``0.31``) is an `EngineOptionError` listing the range.

    Example:
        >>> from lora_guard._checking.engines import profile
        >>> profile("vllm==0.31.0").label, profile("vllm", "0.33").label
        ('vllm==0.31.0', 'vllm==0.33.0')
        >>> profile("vllm==0.1")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lora_guard._checking.engines.EngineOptionError: vllm 0.1 is not a supported release; ...
    """
    if not isinstance(name, str):
        raise EngineOptionError(f"engine name must be a string such as 'vllm', got {name!r}")
    engine, _, pinned = name.strip().partition("==")
    engine = engine.strip().lower()
    pinned = pinned.strip()
    if pinned and version is not None and pinned != version:
        raise EngineOptionError(f"engine {name!r} and version={version!r} disagree")
    version = version or pinned or None
    spec = SPECS.get(engine)
    if spec is None:
        raise EngineOptionError(
            f"unknown engine {engine!r}; supported: {', '.join(sorted(SPECS))}")
    releases = ENGINES[engine]
    if version is None:
        found = installed_version(engine) if installed and engine != "peft" else None
        if found is None:
            return releases[0]
        near = nearest_release(engine, found)
        if not any(_version_key(found) == _version_key(r) for r in spec.releases):
            warnings.warn(
                f"{engine} {found} is installed, outside the releases lora_guard supports "
                f"({spec.supported_range}): checking with {engine}=={near}, the nearest; "
                f"pin one with --engine {engine}==VERSION", ReleaseWarning, stacklevel=2)
        return spec.at(near)
    for release in releases:
        if version in (release.version, *_prefixes(release.version)):
            return release
    raise EngineOptionError(
        f"{engine} {version} is not a supported release; supported: {spec.supported_range} "
        f"({', '.join(reversed(spec.releases))})")


def _prefixes(version: str) -> list[str]:
    parts = version.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


# --- flags ---------------------------------------------------------------------------------


def _bad(flag: Flag, raw: Any, why: str) -> EngineOptionError:
    return EngineOptionError(f"{flag.name} {raw!r}: {why}")


def _bool_value(flag: Flag, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise _bad(flag, raw, "expected true or false")


def _int_value(flag: Flag, raw: Any) -> int:
    try:
        value = raw if isinstance(raw, int) and not isinstance(raw, bool) else int(str(raw))
    except ValueError:
        raise _bad(flag, raw, "expected an integer") from None
    if value < 1:
        raise _bad(flag, raw, "expected a positive integer")
    if flag.choices and value not in flag.choices:
        raise _bad(flag, raw, f"not one of {', '.join(map(str, flag.choices))}")
    return value


def _choice_value(flag: Flag, raw: Any) -> str:
    if str(raw) not in flag.choices:
        raise _bad(flag, raw, f"not one of {', '.join(map(str, flag.choices))}")
    return str(raw)


def _list_value(flag: Flag, raw: Any) -> list[str]:
    names = [str(i) for i in ([raw] if isinstance(raw, str) else list(raw))]
    if not names:
        raise _bad(flag, raw, "expected one or more names")
    unknown = [n for n in names if flag.choices and n not in flag.choices]
    if unknown:
        raise _bad(flag, raw, f"{unknown[0]!r} is not one of {', '.join(flag.choices)}")
    return names


def _value(flag: Flag, raw: Any) -> Any:
    """``raw`` as the engine's parser reads ``flag``; `EngineOptionError` naming the flag."""
    if flag.kind == "bool":
        return _bool_value(flag, raw)
    if flag.kind == "int" or (flag.kind == "choice" and isinstance(flag.choices[0], int)):
        return _int_value(flag, raw)
    if flag.kind == "choice":
        return _choice_value(flag, raw)
    if flag.kind == "list":
        return _list_value(flag, raw)
    items = [raw] if isinstance(raw, str) else list(raw)
    return [_adapter_item(flag, item) for item in items]


def _adapter_item(flag: Flag, item: Any) -> tuple[str, str]:
    """An adapter of --lora-modules / --lora-paths as (name, path)."""
    if isinstance(item, Mapping):
        data: Mapping[str, Any] = item
    elif isinstance(item, str) and item.lstrip().startswith("{"):
        try:
            data = json.loads(item)
        except json.JSONDecodeError:
            raise EngineOptionError(f"{flag.name}: invalid JSON {item!r}") from None
        if not isinstance(data, Mapping):
            raise EngineOptionError(f"{flag.name}: expected a JSON object, got {item!r}")
    elif isinstance(item, str) and "=" in item and "," not in item:
        name, path = item.split("=", 1)
        return name, path
    elif isinstance(item, str) and flag.dest == "lora_paths":
        return item, item
    else:
        raise EngineOptionError(f"{flag.name}: expected NAME=PATH, got {item!r}")
    name = data.get("name", data.get("lora_name"))
    path = data.get("path", data.get("lora_path"))
    if not isinstance(name, str) or not isinstance(path, str):
        keys = "name/path" if flag.dest == "lora_modules" else "lora_name/lora_path"
        raise EngineOptionError(f"{flag.name}: {item!r} needs a name and a path ({keys})")
    return name, path


def _flag_at(release: EngineProfile, word: str) -> tuple[Flag | None, bool]:
    """The LoRA flag ``word`` names (``--flag`` or ``--flag=value``), and whether it is the
    ``--no-`` form of a boolean flag."""
    name = word.partition("=")[0]
    flag = release.flag(name)
    for off, on in (("--no-", "--"), ("--disable-", "--enable-")):  # BooleanOptionalAction
        if flag is None and name.startswith(off):
            negated = release.flag(on + name[len(off):])
            if negated is not None and negated.kind == "bool":
                return negated, True
    return flag, False


def _flag_value(flag: Flag, word: str, words: Sequence[str], i: int) -> tuple[Any, int]:
    """The value of ``flag`` given as ``word`` (words[i:] follow it), and the next index."""
    _, eq, inline = word.partition("=")
    if flag.kind == "bool":
        return (_value(flag, inline) if eq else True), i
    if flag.kind in ("list", "adapters"):
        values = [inline] if eq else []
        while not eq and i < len(words) and not words[i].startswith("--"):
            values.append(words[i])
            i += 1
        if flag.kind == "list" and not values:
            raise EngineOptionError(f"{flag.name} expects one or more values")
        return _value(flag, values), i
    if eq:
        return _value(flag, inline), i
    if i < len(words):
        return _value(flag, words[i]), i + 1
    raise EngineOptionError(f"{flag.name} expects a value")


def _parse_flags(release: EngineProfile, argv: Sequence[str]) -> tuple[dict[str, Any],
                                                                        list[str]]:
    """The release's LoRA flags found in argv (others ignored) and the positional words."""
    found: dict[str, Any] = {}
    positional: list[str] = []
    words = [str(w) for w in argv]
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("--") or word == "--":
            positional.append(word)
            continue
        flag, negated = _flag_at(release, word)
        if flag is None:  # not a LoRA flag: skip it and its values
            while i < len(words) and not words[i].startswith("-"):
                i += 1
        elif negated:
            found[flag.dest] = False
        else:
            value, i = _flag_value(flag, word, words, i)
            # --lora-modules / --lora-paths may be given more than once: they add up
            found[flag.dest] = [*found.get(flag.dest, []), *value] \
                if flag.kind == "adapters" else value
    return found, positional


def resolve_options(release: EngineProfile, argv: Sequence[str] = (),
                    options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every LoRA flag of the release with its value: from argv, then keywords, else default."""
    found, _ = _parse_flags(release, argv)
    by_dest = {f.dest: f for f in release.flags}
    for key, raw in (options or {}).items():
        flag = by_dest.get(key)
        if flag is None:
            known = ", ".join(by_dest) or "none"
            raise EngineOptionError(
                f"{release.engine} has no LoRA option {key!r}; its options: {known}")
        if raw is not None:
            found[key] = _value(flag, raw)
    resolved = {f.dest: found.get(f.dest, f.default) for f in release.flags}
    release.validate(resolved)
    return resolved


def limits_for_engine(name: str, *argv: str | Sequence[str], version: str | None = None,
                      base_config: Any = None, **options: Any) -> ServingLimits:
    """`ServingLimits.for_engine`: the limits of one engine release from its flags."""
    from lora_guard._checking.limits import ServingLimits

    release = profile(name, version)
    flat: list[str] = []
    for item in argv:
        if isinstance(item, (list, tuple)):
            flat.extend(str(i) for i in item)
        elif isinstance(item, str):
            flat.append(item)
        else:
            raise EngineOptionError(
                f"for_engine takes the engine's flags as strings such as '--max-lora-rank', "
                f"'64', got {item!r}")
    resolved = resolve_options(release, flat, options)
    kwargs = release.build(resolved, release)
    shown = {k: v for k, v in resolved.items() if k not in ("lora_modules", "lora_paths")}
    return ServingLimits(engine=release.label, engine_options=shown, base_config=base_config,
                         **kwargs)


def running_limits(engine: str, installed: str | None, *, base_config: Any = None,
                   narrow: Mapping[str, Any] | None = None, **options: Any) -> ServingLimits:
    """The profile's limits inside a running engine: what the runtime integrations check with.

    ``installed`` is the engine's installed version (its profile; the newest supported one
    for a release lora_guard has no profile of, which `lora-guard doctor` flags); ``options``
    are the server's own options by their Python names (``max_lora_rank=16``), resolved as
    ``lora-guard check --engine`` resolves them, so the guard and the checker apply the same
    rules. ``narrow`` then replaces fields with what the running server knows exactly (the
    modules its model has, in place of ``--lora-target-modules``). A value the engine took
    but its parser would not (a rank outside vLLM's list, set in Python) stays as the server
    has it, in ``narrow``.

    Example:
        >>> from lora_guard._checking.engines import running_limits
        >>> limits = running_limits("sglang", "0.5.23", max_lora_rank=16,
        ...                         narrow={"target_modules": ("q_proj", "v_proj")})
        >>> limits.engine, limits.max_rank, sorted(limits.target_modules)
        ('sglang==0.5.23', 16, ['q_proj', 'v_proj'])
    """
    release = profile(engine, None if installed is None else nearest_release(engine, installed),
                      installed=False)
    given = {k: v for k, v in options.items() if v is not None}
    try:
        limits = limits_for_engine(release.label, base_config=base_config, **given)
    except EngineOptionError:
        limits = limits_for_engine(release.label, base_config=base_config)
    return dataclasses.replace(limits, **narrow) if narrow else limits


# --- a pasted serve command ----------------------------------------------------------------


@dataclass(frozen=True)
class ServeCommand:
    """What a pasted serve command says: the engine, its limits, the adapters, the model."""

    limits: ServingLimits
    adapters: tuple[tuple[str, str], ...]
    """(name, path) of each adapter the command serves."""
    model: str | None
    """MODEL (vLLM) / --model-path (sglang), as given."""
    skipped: tuple[str, ...] = ()
    """Checks that cannot run, each with why: the base-model check when MODEL's config.json
    could not be had (a Hub model not in the cache while offline, a folder without one)."""


def _engine_of(argv: Sequence[str]) -> tuple[str, list[str]] | None:
    words = list(argv)
    for i, word in enumerate(words):
        base = os.path.basename(word)
        if base == "vllm" and i + 1 < len(words) and words[i + 1] == "serve":
            return "vllm", words[i + 2:]
        if word == "-m" and i + 1 < len(words):
            module = words[i + 1]
            if module in ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main"):
                rest = words[i + 2:]
                return "vllm", rest[1:] if rest[:1] == ["serve"] else rest
            if module in ("sglang.launch_server", "sglang.srt.entrypoints.http_server"):
                return "sglang", words[i + 2:]
        if base == "sglang" and i + 1 < len(words) and words[i + 1] == "serve":
            return "sglang", words[i + 2:]
    return None


def is_serve_command(argv: Sequence[str]) -> bool:
    """True when argv is a vLLM or sglang serve command."""
    return _engine_of(argv) is not None


def parse_serve_command(argv: Sequence[str], *, version: str | None = None,
                        base_config: Any = None) -> ServeCommand:
    """Engine, limits, adapters and model of ``vllm serve ...`` / ``python -m
    sglang.launch_server ...``; unless ``base_config`` is given, MODEL's config.json is the
    base config: from MODEL's folder, or for a Hub model id through huggingface_hub (the local
    cache first; only the cache with ``HF_HUB_OFFLINE``; never weights). Where it cannot be
    had, ``skipped`` says the base-model check was skipped and why.

    Example:
        >>> import os, tempfile
        >>> from lora_guard._checking.engines import parse_serve_command
        >>> os.environ["HF_HUB_OFFLINE"], os.environ["HF_HUB_CACHE"] = "1", tempfile.mkdtemp()
        >>> cmd = parse_serve_command(["vllm", "serve", "meta-llama/Llama-3.1-8B",
        ...     "--enable-lora", "--lora-modules", "sql=/a/sql", "--max-lora-rank", "64"])
        >>> cmd.limits.engine, cmd.limits.max_rank, cmd.adapters
        ('vllm==0.34.0', 64, (('sql', '/a/sql'),))
        >>> print(cmd.skipped[0])  # offline, and not in the (empty) cache  # doctest: +ELLIPSIS
        the base-model check was skipped: config.json of Hub model 'meta-llama/...' is not in
        the local cache (...) and HF_HUB_OFFLINE is set; ...
        >>> del os.environ["HF_HUB_OFFLINE"], os.environ["HF_HUB_CACHE"]
    """
    found = _engine_of(argv)
    if found is None:
        raise EngineOptionError(
            "after -- give a serve command (vllm serve MODEL ... or python -m "
            "sglang.launch_server --model-path MODEL ...), or give PATHs and --engine")
    engine, rest = found
    release = profile(engine, version)
    options, positional = _parse_flags(release, rest)
    model: str | None
    if engine == "vllm":
        model = positional[0] if positional else _option(rest, "--model")
    else:
        model = _option(rest, "--model-path") or _option(rest, "--model")
    key = "lora_modules" if engine == "vllm" else "lora_paths"
    adapters = tuple(options.get(key) or ())
    skipped: tuple[str, ...] = ()
    if base_config is None and model:
        base_config, skipped = _model_config(model, _option(rest, "--revision"))
    limits = limits_for_engine(release.label, *rest, base_config=base_config)
    if engine == "sglang" and not adapters and not (
            limits.engine_options.get("max_lora_rank")
            and limits.engine_options.get("lora_target_modules")):
        raise EngineOptionError(
            "sglang without --lora-paths needs --max-lora-rank and --lora-target-modules "
            "(it refuses to start)")
    return ServeCommand(limits=limits, adapters=adapters, model=model, skipped=skipped)


def _model_config(model: str, revision: str | None) -> tuple[str | None, tuple[str, ...]]:
    """MODEL's config.json (a local folder's, or a Hub model's), or why the base-model check
    is skipped."""
    from lora_guard._reading.hub_config import hub_base_config, looks_like_hub_id

    folder = pathlib.Path(model)
    if (folder / "config.json").is_file():
        return str(folder / "config.json"), ()
    if looks_like_hub_id(model):
        found = hub_base_config(model, revision=revision)
        return found.path, (() if found.skipped is None else (found.skipped,))
    why = "has no config.json" if folder.is_dir() else "is neither a local folder nor a Hub id"
    return None, (f"the base-model check was skipped: MODEL {model!r} {why}; pass "
                  "--base-config with the base model's config.json",)


def _option(words: Sequence[str], name: str) -> str | None:
    for i, word in enumerate(words):
        if word == name and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def flag_table(release: EngineProfile) -> list[tuple[str, str, str]]:
    """(flag, default, what it means) of each LoRA flag, for the docs."""
    return [(f.name, repr(f.default), f.help) for f in release.flags]


def rule_table(release: EngineProfile) -> Iterable[Rule]:
    """The release's rules, for the docs."""
    return release.rules
