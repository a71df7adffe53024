"""`AdapterContext`: what every check of one adapter reads (the adapter, the limits) and the
facts several checks share, each computed once per adapter (or once per recipe, with the
recipe's `RecipeOutcome`): the zero-size tensors, and the one pass over the adapter's LoRA
modules, whose rules read a `ModuleContext` (so the pass is shared by every adapter of equal
parts in a run: `PartsOutcome`)."""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, NamedTuple

from lora_guard._checking.limits import ServingLimits
from lora_guard._checking.registry import ModuleRule, module_rules
from lora_guard._checking.rules.recipe_outcome import ModuleOutcome, PartsOutcome, RecipeOutcome
from lora_guard._checking.rules.shared import Expected, Grouped, more
from lora_guard._core.errors import Violation, make_violation
from lora_guard._core.frozen import builder
from lora_guard._reading.adapters import AdapterSpec, FrozenConfig, LoRAModuleSpec
from lora_guard._reading.basemodel import BaseModelDims
from lora_guard._reading.bounded import Bounded, ValueKey
from lora_guard._reading.grammar import PARTS_FIELDS

__all__ = ["AdapterContext", "ModuleContext", "ModulePass", "grouped_violations"]


class ModulePass(NamedTuple):
    """What the module rules found in one pass over an adapter's modules."""

    grouped: Grouped
    """Findings by kind (first module, count, details); each code reads its own."""
    found: list[Violation]
    """Findings that name the adapter (LG102 between A and B), in module order."""
    ranks: dict[int, str]
    """Each rank of a module with both halves non-empty -> the first module with it."""


class ModuleContext(NamedTuple):
    """What a module rule reads besides the module: the config's `PARTS_FIELDS` and the
    limits a module is held to, all of it the same for the adapters of equal parts
    (`AdapterSpec.parts_key`: the tensor entries and those fields) checked against the same
    limits, which is why their module pass is found once (`PartsOutcome`). A rule that
    needs more of the adapter or of the limits is a check of its own (`adapter_check`), not
    a rule."""

    subject: str
    """Names the adapter, for a finding in ``found`` (an outcome with one is never shared)."""
    config: Mapping[str, Any]
    """The config's `PARTS_FIELDS` alone (``r``, ``rank_pattern``...), read-only."""
    target_modules: frozenset[str] | None
    """`ServingLimits.target_modules`: the module types the server applies LoRA to."""
    engine_rules: frozenset[str]
    """`ServingLimits.engine_rules`."""
    base: BaseModelDims | None
    """`ServingLimits.base`: the base model's dims from its config."""
    vocab_size: int | None
    module_dims: Mapping[str, tuple[Expected, Expected]] | None


def _held_to(limits: ServingLimits) -> tuple[frozenset[str] | None, frozenset[str],
                                               BaseModelDims | None]:
    """What of the limits a module is held to: `ModuleContext`'s ``target_modules``,
    ``engine_rules`` and ``base``."""
    return limits.target_modules, limits.engine_rules, limits.base  # type: ignore[return-value]


_NO_KEYS: tuple[tuple[str, ...], frozenset[str]] = ((), frozenset())


class AdapterContext:
    """One adapter as its checks see it.

    ``subject`` names it in messages; ``vocab_size`` and ``module_dims`` are what a guard
    knows of the live base model (`spec_violations`); ``shared`` is what the checks of the
    adapter's recipe found before it about what its adapters share (`check_adapters`)."""

    __slots__ = ("_empty", "_modules", "limits", "module_dims", "shared", "spec", "subject",
                 "vocab_size")

    def __init__(self, subject: str, spec: AdapterSpec, limits: ServingLimits, *,
                 vocab_size: int | None = None,
                 module_dims: Mapping[str, tuple[Expected, Expected]] | None = None,
                 shared: RecipeOutcome | None = None) -> None:
        self.subject = subject
        self.spec = spec
        self.limits = limits
        self.vocab_size = vocab_size
        self.module_dims = module_dims
        self.shared = shared
        self._empty: tuple[tuple[str, ...], frozenset[str]] | None = None
        self._modules: ModulePass | None = None

    @property
    def vocab(self) -> int | None:
        """The base model's vocab: from its config when the limits have one, else the
        guard's ``vocab_size``."""
        return self.limits.base.vocab_size if self.limits.base is not None else self.vocab_size

    @property
    def empty(self) -> tuple[tuple[str, ...], frozenset[str]]:
        """The keys of the zero-size tensors, in the header's order and as a set."""
        if self._empty is None:
            self._empty = _empty_tensors(self.spec.tensors, self.shared)
        return self._empty

    @property
    def modules(self) -> ModulePass:
        """The one pass over the adapter's modules, running every module rule."""
        if self._modules is None:
            self._modules = self._module_pass()
        return self._modules

    def _module_pass(self) -> ModulePass:
        """Once per parts and limits: the modules' outcome is the same for every adapter of
        equal parts (`AdapterSpec.parts_key`) held to the same limits (the rules read a
        `ModuleContext`): in a set check, the run's `PartsOutcome`; for a guard's adapter
        (`spec_violations`), the one remembered for its parts and the values its
        `ModuleContext` holds (`_GUARDED`). Computed each time: a ``rank_pattern`` or
        ``use_bdlora`` (they change what each module is compared with), an outcome that names
        the adapter (LG102 between A and B), a spec the reader did not make, and for a guard
        that knows the live model's dims."""
        shared, spec, limits = self.shared, self.spec, self.limits
        config = spec.config
        if self.module_dims is not None or spec.parts_key is None or (
                config.get("use_bdlora") is not None or config.get("rank_pattern")):
            return self._run_rules()
        if shared is not None and self.vocab_size is None:
            parts = shared.parts
        else:
            key = ValueKey((spec.parts_key, *_held_to(limits), self.vocab_size))
            parts = _GUARDED.get(key) or _GUARDED.put(key, PartsOutcome())
        hit = parts.modules
        if hit is not None:
            grouped = Grouped()
            for group, name, count, details in hit.grouped:
                grouped.items[group] = [name, count, details]
            return ModulePass(grouped, [], dict(hit.ranks))
        outcome = self._run_rules()
        if not outcome.found:
            parts.modules = _module_outcome(
                tuple([(group, name, count, details) for group, (
                    name, count, details) in outcome.grouped.items.items()]),
                tuple(outcome.ranks.items()))
        return outcome

    def _run_rules(self) -> ModulePass:
        config = self.spec.config
        ctx = ModuleContext(
            self.subject, types.MappingProxyType(
                config.fields(PARTS_FIELDS) if type(config) is FrozenConfig else
                {name: config[name] for name in PARTS_FIELDS if name in config}),
            *_held_to(self.limits), self.vocab_size, self.module_dims)
        grouped, found, ranks = Grouped(), list[Violation](), dict[int, str]()
        bd = self.spec.config.get("use_bdlora")
        empty = self.empty[1]
        # The rules read of a module's path what a model's layers share (`ModuleRule`): the
        # same module of several layers (the reader's `modules_same_as`) is checked once, but
        # where a module is matched by its whole path: BD-LoRA's blocks, a rank_pattern
        # (LG102), served modules named by a path suffix (LG104), the live model's dims
        # (LG109), and a spec the reader did not make.
        same_as = self.spec.modules_same_as
        if bd is not None or self.module_dims is not None or ctx.config.get("rank_pattern") or (
                any("." in name for name in ctx.target_modules or ())):
            same_as = None
        shapes: dict[tuple[Any, ...], _SharedFindings | None] = {}
        layers = ctx.base.num_layers if ctx.base is not None else None
        rules = _rules()
        for position, module in enumerate(self.spec.modules.values()):
            if bd is not None:
                module = _block_diagonal(bd, module)
            skips = bool(empty) and (module.a_key in empty or module.b_key in empty)
            if same_as is None:
                _apply_rules(rules, ctx, module, skips, grouped, found)
            else:
                # its layer index only past the base's layers, where LG109 names it
                layer = module.layer
                shape = (same_as[position], layer if layers is not None and layer is not None
                         and layer >= layers else None, skips)
                shared = shapes.get(shape, _UNSEEN)
                if shared is _UNSEEN:
                    shapes[shape] = _first_of_shape(rules, ctx, module, skips, grouped, found)
                elif shared is None:
                    _apply_rules(rules, ctx, module, skips, grouped, found)
                else:
                    for group, name, count, details in shared:
                        grouped.add(group, getattr(module, name), details, count)
            if module.rank and not skips:
                ranks.setdefault(module.rank, module.module)
        return ModulePass(grouped, found, ranks)


_Rules = tuple[tuple[ModuleRule, ...], tuple[ModuleRule, ...]]
"""The module rules that see every module, and those that skip a zero-size half."""


def _apply_rules(rules: _Rules, ctx: ModuleContext, module: LoRAModuleSpec, skips: bool,
                 grouped: Grouped, found: list[Violation]) -> None:
    """Every module rule (`_rules`) on one module; those that skip a zero-size half not when
    ``skips``."""
    every, full = rules
    for rule in every:
        rule(ctx, module, grouped, found)
    if not skips:
        for rule in full:
            rule(ctx, module, grouped, found)


_SharedFindings = tuple[tuple[tuple[Any, ...], str, int, dict[str, Any]], ...]
"""A module's findings (group, which of its names, count, details) said so that any module of
its shape says them with its own name (``"module"``, ``"a_key"`` or ``"b_key"``)."""

_UNSEEN: Any = object()
"""A shape not met yet in this pass (None: met, its findings not shareable)."""


def _first_of_shape(rules: _Rules, ctx: ModuleContext, module: LoRAModuleSpec, skips: bool,
                    grouped: Grouped, found: list[Violation]) -> _SharedFindings | None:
    """The rules on the first module of its shape, their findings added to ``grouped`` and
    ``found``, and returned for the modules of its shape; None where they cannot be said of
    another module (a finding in ``found`` names the adapter; a finding named by none of the
    module's names, or whose details or group hold one of them)."""
    own, own_found = Grouped(), list[Violation]()
    _apply_rules(rules, ctx, module, skips, own, own_found)
    if not own.items and not own_found:
        return ()  # nearly every module: nothing found, nothing to say of the others
    for group, (name, count, details) in own.items.items():
        grouped.add(group, name, details, count)
    found.extend(own_found)
    given = [(n, f) for n, f in ((module.module, "module"), (module.a_key, "a_key"),
                                 (module.b_key, "b_key")) if n is not None]
    names = dict(given)
    if own_found or len(names) < len(given):
        return None
    shared = []
    for group, (name, count, details) in own.items.items():
        which = names.get(name)
        if which is None or any(isinstance(value, str) and value in names
                                for value in (*group, *details.values())):
            return None
        shared.append((group, which, count, details))
    return tuple(shared)


_module_outcome = builder(ModuleOutcome)
"""``ModuleOutcome`` of its fields in order (made from a pass that just ran)."""

_GUARDED: Bounded[ValueKey, PartsOutcome] = Bounded(
    256, "the module pass of the adapters a guard checks (`spec_violations`), by their parts "
    "and the limits their modules are held to: the adapters of one recipe, loaded by a "
    "server in turn, share it")


_RULES: list[_Rules] = []


def _rules() -> _Rules:
    """The module rules that see every module, and those that skip a zero-size half (read
    once: they are registered when the checks' modules are imported)."""
    if not _RULES:
        rules = module_rules()
        _RULES.append((tuple(r for _, r, empty in rules if empty),
                       tuple(r for _, r, empty in rules if not empty)))
    return _RULES[0]


def grouped_violations(ctx: AdapterContext, code: str, target: str,
                       grouped: Grouped | None = None) -> list[Violation]:
    """One violation of ``code`` per kind of finding of the module pass (or of ``grouped``):
    the first ``target`` (module or key) it was found in, and how many."""
    items = (grouped or ctx.modules.grouped).items
    if not items:
        return []
    return [make_violation(code, variant, ctx.subject, **{**details, target: more(name, count)})
            for (group_code, variant, *_), (name, count, details) in items.items()
            if group_code == code]


def _empty_tensors(tensors: Mapping[str, Any],
                   shared: RecipeOutcome | None) -> tuple[tuple[str, ...], frozenset[str]]:
    if shared is not None and shared.empty is not None:
        return shared.empty
    ordered = tuple([key for key, info in tensors.items() if 0 in info.shape])
    empty = (ordered, frozenset(ordered)) if ordered else _NO_KEYS
    if shared is not None:
        shared.empty = empty
    return empty


def _block_diagonal(bd: object, module: LoRAModuleSpec) -> LoRAModuleSpec:
    """The dense factors a BD-LoRA module (PEFT's ``use_bdlora``, given as ``bd``) stands for.

    A block-diagonal factor is saved as its ``nblocks`` blocks side by side: A ``(r, in / n)``
    for the modules of ``target_modules_bd_a``, B ``(out, r / n)`` for ``target_modules_bd_b``
    (matched as PEFT matches them: the pattern is a substring of the module name). The checks
    compare the dense shapes with the config and the base model.
    """
    if not isinstance(bd, dict):
        return module
    n = bd.get("nblocks", 1)
    if not isinstance(n, int) or isinstance(n, bool) or n <= 1:
        return module

    def listed(key: str) -> bool:
        patterns = bd.get(key) or []
        return isinstance(patterns, list) and any(
            isinstance(p, str) and p in module.module for p in patterns)

    a, b = module.a_shape, module.b_shape
    if a is not None and len(a) == 2 and listed("target_modules_bd_a"):
        a = (a[0], a[1] * n)
    if b is not None and len(b) == 2 and listed("target_modules_bd_b"):
        b = (b[0], b[1] * n)
    if (a, b) == (module.a_shape, module.b_shape):
        return module
    return replace(module, a_shape=a, b_shape=b)
