"""`ServingLimits`: what a server serves, validated when made."""

from __future__ import annotations

import dataclasses
import os
import types
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lora_guard._checking.engines import (
    EngineOptionError,
    EngineSettings,
    engine_settings,
    nearest_release,
    profile,
)
from lora_guard._reading.adapters import FEATURES
from lora_guard._reading.basemodel import BaseModelDims, load_base_config
from lora_guard._reading.bounded import ValueKey
from lora_guard._reading.safetensors import DTYPE_NAMES, safetensors_code

__all__ = ["ENGINE_RULES", "ServingLimits", "engine_limits", "limits_argument",
           "limits_for_engine", "names", "positive_int", "running_limits"]

ENGINE_RULES = ("packed-slices", "packed-ranks-uniform", "one-scaling", "rank-from-set",
                "init-rerun", "cast", "packed-names-native", "heads-need-pooling",
                "target-modules-list", "plain-embeddings-refused", "one-scaling-rslora",
                "bias-by-tensors", "moe-expert-ranks", "moe-rslora-alpha-r",
                "indexed-shared-overwrites", "indexed-shared-refused", "peft-0.14-config",
                "target-modules-by-name", "saved-embeddings-refused", "slots-in-every-layer",
                "embeddings-by-architecture", "stacked-from-first", "peft-selects-modules",
                "peft-type-any-case", "peft-type-unread", "targets-from-set",
                "embeddings-by-config", "pool-by-config", "flat-experts-unmatched")


def positive_int(owner: str, name: str, value: object) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{owner}({name}=...) must be a positive int or None, got {value!r}")


def names(owner: str, name: str, value: object, example: str) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ValueError(
            f"{owner}({name}=...) takes a collection of names such as {example}, got {value!r}"
        )
    items = list(value)
    if not items or not all(isinstance(v, str) and v for v in items):
        raise ValueError(
            f"{owner}({name}=...) takes a non-empty collection of names such as {example}, "
            f"got {items!r}"
        )
    return frozenset(items)


def _ranks(value: object) -> frozenset[int] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(
            f"ServingLimits(allowed_ranks=...) takes a collection of ranks such as (8, 16), "
            f"got {value!r}"
        )
    listed = list(value)
    if not listed or not all(
            isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in listed):
        raise ValueError(
            "ServingLimits(allowed_ranks=...) takes a non-empty collection of positive ints "
            f"such as (8, 16), got {listed!r}"
        )
    return frozenset(listed)


_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _dtypes(value: object) -> frozenset[str] | None:
    dtypes = names("ServingLimits", "dtypes", value, "('bfloat16', 'float16')")
    if dtypes is None:
        return None
    normal = set()
    for d in dtypes:
        try:
            normal.add(DTYPE_NAMES[safetensors_code(_DTYPE_ALIASES.get(d, d))])
        except ValueError:
            raise ValueError(
                f"ServingLimits(dtypes=...) got unknown dtype {d!r}; use names such as "
                "'bfloat16', 'float16', 'float32'"
            ) from None
    return frozenset(normal)


def _known(owner: str, name: str, value: object, known: Iterable[str],
           what: str) -> frozenset[str]:
    """An optional set of names, each one of ``known`` (``allow``, ``engine_rules``)."""
    if not value:
        return frozenset()
    example = f"({next(iter(known))!r},)"
    given = names(owner, name, value, example) or frozenset()
    unknown = sorted(given - set(known))
    if unknown:
        raise ValueError(
            f"{owner}({name}=...) got unknown {what}(s) {unknown}; known {what}s: "
            f"{', '.join(known)}"
        )
    return given


@dataclass(frozen=True)
class ServingLimits:
    """What a server serves: max rank, ranks, slots, modules, dtypes, base model, features.

    Every option is optional and validated when the limits are made. ``base_config`` is the
    base model's Hugging Face ``config.json`` (a path, a folder holding it, or a dict).
    ``allow`` names config features the server does implement (``dora``, ``lora_bias``,
    ``bias``, ``modules_to_save``, ``trainable_tokens``, ``peft_type``, ``alora``,
    ``layer_replication``, ``qalora``, ``bdlora``, ``added_tokens``); any other feature in
    use is LG105.

    Example:
        >>> import lora_guard as lg
        >>> limits = lg.ServingLimits(max_rank=16, target_modules=("q_proj", "v_proj"),
        ...                           dtypes=("bf16", "float16"))
        >>> sorted(limits.dtypes)
        ['bfloat16', 'float16']
        >>> lg.ServingLimits(max_rank=0)
        Traceback (most recent call last):
        ...
        ValueError: ServingLimits(max_rank=...) must be a positive int or None, got 0
    """

    max_rank: int | None = None
    """Largest rank the server's pool holds (vLLM ``max_lora_rank``)."""
    allowed_ranks: Collection[int] | None = None
    """Ranks the server serves, when it serves only some."""
    max_loras: int | None = None
    """Adapter slots (vLLM ``max_loras``, sglang ``max_loras_per_batch``)."""
    target_modules: Collection[str] | None = None
    """Module types (or module path suffixes) the server applies LoRA to."""
    dtypes: Collection[str] | None = None
    """Allowed dtypes, as torch-style names."""
    base_config: str | os.PathLike[str] | Mapping[str, Any] | None = None
    """The base model's config.json (path, folder or dict), as given."""
    allow: Collection[str] = frozenset()
    """Features the server implements (names as above)."""
    engine: str | None = None
    """The engine release these limits are of (``"vllm==0.34.0"``), set by `for_engine`."""
    engine_options: Mapping[str, Any] = field(default_factory=dict)
    """The engine's LoRA flags as it resolves them (its defaults filled in), by `for_engine`."""
    served_heads: Collection[str] | None = None
    """``modules_to_save`` heads the server serves although it refuses others (vLLM
    ``classifier``, ``score``)."""
    max_loaded: int | None = None
    """Adapters the engine holds loaded at once and refuses to load past (sglang
    ``--max-loaded-loras``): more adapters than that in the set is LG110."""
    engine_rules: Collection[str] = frozenset()
    """The engine's own rules, by name: ``packed-slices`` (a packed module and its parts
    match each other), ``packed-ranks-uniform`` (LG111), ``one-scaling`` (LG112),
    ``one-scaling-rslora`` (the same, the one scaling rsLoRA-aware: vLLM before 0.32),
    ``bias-by-tensors`` (``bias`` refused only where bias tensors are saved: the flag alone
    changes nothing the engine serves, sglang),
    ``rank-from-set`` (no max rank given: the largest ``r`` of the set is the pool's),
    ``cast`` (every weight is cast to the engine's dtype: mixed dtypes serve, LG106 only for
    ``dtypes`` given), ``init-rerun`` (PEFT: loading a PiSSA/OLoRA adapter redoes its
    deterministic init on the base, so it serves as trained), ``packed-names-native`` (a
    weight named by a packed module, ``qkv_proj``, loads only on a base that has that module:
    vLLM), ``heads-need-pooling`` (`served_heads` only on a base that is not a generative
    ``*ForCausalLM``: vLLM's generate runner has no classifier), ``target-modules-list``
    (``target_modules`` as a string other than ``all``/``all-linear`` is refused: sglang,
    LG202), ``target-modules-by-name`` (any string, and two entries naming one module that
    is not packed, are refused: lmdeploy, LG202), ``peft-0.14-config`` (a config key PEFT 0.14
    does not know is refused: lmdeploy reads configs with its pinned peft, LG202),
    ``saved-embeddings-refused`` (full embedding weights saved with the adapter are refused in
    either form: lmdeploy, LG104), ``slots-in-every-layer`` (a ``target_modules`` name gets a
    slot in every layer of the base: a layer without its weights serves uninitialised memory,
    lmdeploy, LG103), ``embeddings-by-architecture`` (LoRA on ``embed_tokens`` / ``lm_head``
    only where the base's model class serves it, by ``architectures``: vLLM, LG104),
    ``stacked-from-first`` (q/k/v stacked from q_proj, which needs v_proj; gate/up from
    gate_proj: k_proj, v_proj or up_proj without it are refused, sglang, LG104),
    ``peft-type-any-case`` (``peft_type`` LoRA's in any case, ``lora``: sglang, LG117),
    ``peft-type-unread`` (``peft_type`` not read: any spelling of LoRA's serves, vLLM; without
    either, only ``LORA`` as PEFT writes it), ``targets-from-set`` (no ``target_modules``
    given: the server's modules are the union of the set's configs' ``target_modules``, a
    string such as ``all-linear`` every module: sglang without ``--lora-target-modules``,
    LG104), ``embeddings-by-config`` (LoRA on ``embed_tokens`` / ``lm_head`` is read only
    where the adapter's own ``target_modules`` names the module: sglang, LG104),
    ``pool-by-config`` (a weight outside ``target_modules`` is refused at load when the
    adapter's config names such a module, else skipped and the first batch fails: sglang,
    LG104's message says which), ``flat-experts-unmatched`` (MoE expert LoRA in PEFT's
    ``target_parameters`` layout is matched to no module and fails the first batch: sglang,
    LG104)."""
    base: BaseModelDims | None = field(default=None, init=False, repr=False, compare=False)
    """The dims read from ``base_config``."""

    if TYPE_CHECKING:  # typed as users pass them (any iterable), kept as frozensets
        def __init__(
            self, max_rank: int | None = None, allowed_ranks: Iterable[int] | None = None,
            max_loras: int | None = None, target_modules: Iterable[str] | None = None,
            dtypes: Iterable[str] | None = None,
            base_config: str | os.PathLike[str] | Mapping[str, Any] | None = None,
            allow: Iterable[str] = (), engine: str | None = None,
            engine_options: Mapping[str, Any] = types.MappingProxyType({}),
            served_heads: Iterable[str] | None = None, max_loaded: int | None = None,
            engine_rules: Iterable[str] = (),
        ) -> None: ...

    def __post_init__(self) -> None:
        owner = "ServingLimits"
        positive_int(owner, "max_rank", self.max_rank)
        positive_int(owner, "max_loras", self.max_loras)
        positive_int(owner, "max_loaded", self.max_loaded)
        self._set("allowed_ranks", _ranks(self.allowed_ranks))
        self._set("target_modules", names(
            owner, "target_modules", self.target_modules, "('q_proj', 'v_proj')"))
        self._set("dtypes", _dtypes(self.dtypes))
        self._set("allow", _known(owner, "allow", self.allow, FEATURES, "feature"))
        self._set("served_heads", names(owner, "served_heads", self.served_heads,
                                         "('score',)"))
        self._set("engine_rules", _known(owner, "engine_rules", self.engine_rules,
                                         ENGINE_RULES, "rule"))
        if not isinstance(self.engine_options, Mapping):
            raise ValueError("ServingLimits(engine_options=...) takes a mapping of option "
                             f"names to values, got {type(self.engine_options).__name__}")
        self._set("engine_options", types.MappingProxyType(dict(self.engine_options)))
        if self.base_config is not None:
            if not isinstance(self.base_config, (str, os.PathLike, Mapping)):
                raise ValueError(
                    "ServingLimits(base_config=...) takes a config.json path or a dict, got "
                    f"{type(self.base_config).__name__}"
                )
            self._set("base", load_base_config(self.base_config))

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)

    def value_key(self) -> Hashable:
        """These limits as one hashable value, made and hashed once: equal for limits equal
        in every field (exact in type: ``8`` is not ``8.0``) and in the base model's dims
        read from ``base_config``, so a memo of verdicts keyed by it is shared by equal
        limits and by no others (the limits themselves hold mappings: no hash).

        Example:
            >>> import lora_guard as lg
            >>> a, b = lg.ServingLimits(max_rank=16), lg.ServingLimits(max_rank=16)
            >>> a.value_key() == b.value_key(), a.value_key() == lg.ServingLimits().value_key()
            (True, False)
        """
        key = self.__dict__.get("_value_key")
        if key is None:
            key = ValueKey((tuple(_frozen(getattr(self, f.name))
                                  for f in dataclasses.fields(self) if f.compare), self.base))
            object.__setattr__(self, "_value_key", key)
        return key

    @classmethod
    def for_engine(cls, name: str, *argv: str | Sequence[str], version: str | None = None,
                   **engine_options: Any) -> ServingLimits:
        """The limits of one engine release, from its own serve flags and defaults.

        ``name`` is ``"vllm"``, ``"sglang"`` or ``"peft"``, optionally pinned
        (``"vllm==0.31.0"``, any release of docs/engines/; ``version=`` does the same);
        without a version the installed release when the engine can be imported (outside the
        supported range: the nearest, with a ``ReleaseWarning``), else the newest supported
        release. ``argv`` are the engine's flags as on its command line
        (``"--max-lora-rank", "64"``, or one list of them; flags that do not bear on LoRA are
        ignored);
        ``engine_options`` the same by their Python names (``max_lora_rank=64``), plus
        ``base_config=``. The engine's defaults fill in the rest (vLLM ``max_lora_rank`` 16).
        An unknown engine or release, a LoRA flag that cannot be parsed or a combination the
        engine refuses to start with raises ``ValueError`` naming it.

        The profile is the engine's rules with their sources (``docs/engines/``): it passes
        what the engine loads *and* serves correctly.

        Example:
            >>> import lora_guard as lg
            >>> limits = lg.ServingLimits.for_engine("vllm", max_lora_rank=64)
            >>> limits.engine, limits.max_rank, limits.max_loras
            ('vllm==0.34.0', 64, None)
            >>> lg.ServingLimits.for_engine("sglang", "--max-loaded-loras", "16").max_loaded
            16
            >>> try:  # a value the engine's own parser refuses is a ValueError
            ...     lg.ServingLimits.for_engine("vllm", "--max-lora-rank", "24")
            ... except ValueError as err:
            ...     print(err)  # doctest: +ELLIPSIS
            --max-lora-rank '24': not one of ...
        """
        return limits_for_engine(name, *argv, version=version, **engine_options)

    def to_dict(self) -> dict[str, Any]:
        """The limits as JSON-ready values (sets as sorted lists)."""
        def listed(v: Collection[Any] | None) -> list[Any] | None:
            return None if v is None else sorted(v)

        base = self.base_config
        return {
            "max_rank": self.max_rank,
            "allowed_ranks": listed(self.allowed_ranks),
            "max_loras": self.max_loras,
            "target_modules": listed(self.target_modules),
            "dtypes": listed(self.dtypes),
            "base_config": None if base is None else
            ("<dict>" if isinstance(base, Mapping) else os.fspath(base)),
            "allow": sorted(self.allow),
            **({} if self.engine is None else {
                "engine": self.engine,
                "engine_options": {k: sorted(v) if isinstance(v, (set, frozenset)) else v
                                   for k, v in self.engine_options.items()},
                "max_loaded": self.max_loaded,
            }),
        }


def _frozen(value: object) -> Hashable:
    """``value`` as a hashable value, exact in type; a leaf with no hash is a key of its own
    (limits holding one share nothing: a miss, never a wrong match)."""
    if isinstance(value, Mapping):
        return Mapping, frozenset((_frozen(k), _frozen(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value), tuple(_frozen(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return frozenset, frozenset(_frozen(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return object()
    return type(value), value


def limits_argument(owner: str, limits: object) -> ServingLimits:
    """``limits`` as given to ``owner``: a `ServingLimits`, or the default ones for None."""
    if limits is None:
        return ServingLimits()
    if not isinstance(limits, ServingLimits):
        raise TypeError(
            f"{owner}(limits=...) takes an lg.ServingLimits, got {type(limits).__name__}"
        )
    return limits


def engine_limits(settings: EngineSettings, *, base_config: Any = None) -> ServingLimits:
    """The limits of an engine release's settings (`engine_settings`, a pasted serve
    command's), checked against ``base_config``."""
    return ServingLimits(engine=settings.release.label, engine_options=dict(settings.options),
                         base_config=base_config, **settings.fields)


def limits_for_engine(name: str, *argv: str | Sequence[str], version: str | None = None,
                      base_config: Any = None, **options: Any) -> ServingLimits:
    """`ServingLimits.for_engine`: the limits of one engine release from its flags."""
    return engine_limits(engine_settings(name, *argv, version=version, **options),
                         base_config=base_config)


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
        >>> from lora_guard._checking.limits import running_limits
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
