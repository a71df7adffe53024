"""A fleet trained from a few recipes: adapters whose config and header bytes are identical
form one `Recipe`, read and checked once; each adapter still gets its own verdict, and what
is remembered across adapters is bounded and can be forgotten."""

from __future__ import annotations

import json
import pathlib
import shutil
import sys
import threading
from collections import OrderedDict
from typing import Any

import lora_guard as lg
from lora_guard._reading.adapters import Recipe, forget_remembered, read_recipes
from lora_guard._reading.bounded import Bounded, caches
from lora_guard._reading.safetensors import encode_header
from lora_guard._testing.adapter_writer import write_adapter


def _fleet(root: pathlib.Path, copies: int) -> list[pathlib.Path]:
    """``copies`` adapters of each of two recipes (rank 8 and rank 64), as a fleet that
    copies a few trained adapters around."""
    templates = [write_adapter(root / "t8", rank=8), write_adapter(root / "t64", rank=64)]
    folders = []
    for i in range(copies):
        for template in templates:
            folder = root / "fleet" / f"{template.name}-{i}"
            shutil.copytree(template, folder)
            folders.append(folder)
    return folders


def test_adapters_with_the_same_bytes_are_one_recipe_read_once(tmp_path: pathlib.Path) -> None:
    folders = _fleet(tmp_path, 3)
    reads = read_recipes(folders)
    recipes = [read.recipe for read in reads if not isinstance(read, Exception)]
    assert len(recipes) == 6
    assert len(set(recipes)) == 2  # equal by their bytes: two recipes
    assert all(isinstance(recipe, Recipe) for recipe in recipes)
    by_recipe: dict[Recipe, list[lg.AdapterSpec]] = {}
    for read in reads:
        assert not isinstance(read, Exception)
        by_recipe.setdefault(read.recipe, []).append(read.spec)
    for specs in by_recipe.values():  # the members share what the recipe holds
        assert all(spec.modules is specs[0].modules for spec in specs)
        assert all(spec.config is specs[0].config for spec in specs)
        assert len({spec.path for spec in specs}) == 3  # each its own folder


def test_one_byte_of_config_changed_is_another_recipe(tmp_path: pathlib.Path) -> None:
    a = write_adapter(tmp_path / "a", rank=8)
    b = tmp_path / "b"
    shutil.copytree(a, b)
    config = (b / "adapter_config.json").read_text()
    alpha = f'"lora_alpha": {json.loads(config)["lora_alpha"]},'
    assert alpha in config
    (b / "adapter_config.json").write_text(config.replace(alpha, '"lora_alpha": 32,'))
    first, second = read_recipes([a, b])
    assert not isinstance(first, Exception) and not isinstance(second, Exception)
    assert first.recipe != second.recipe
    assert second.spec.config["lora_alpha"] == 32


def test_each_adapter_of_a_recipe_gets_its_own_verdict(tmp_path: pathlib.Path) -> None:
    """The rank-64 recipe breaks max_rank 16: every copy is reported, each under its name,
    exactly as each is reported alone."""
    _fleet(tmp_path, 3)
    limits = lg.ServingLimits(max_rank=16)
    report = lg.check_adapters(tmp_path / "fleet", limits)
    assert report.codes() == ["LG101"] * 3
    names = sorted(v.subject.rsplit("/", 1)[-1].rstrip("'") for v in report.violations)
    assert names == ["t64-0", "t64-1", "t64-2"]
    for violation, name in zip(report.violations, names, strict=True):
        alone = lg.check_adapters(tmp_path / "fleet" / name, limits).violations
        assert [(v.code, v.subject, v.message) for v in alone] == [
            (violation.code, violation.subject, violation.message)]


def test_forget_remembered_empties_every_cache(tmp_path: pathlib.Path) -> None:
    _fleet(tmp_path, 2)
    lg.check_adapters(tmp_path / "fleet", lg.ServingLimits(max_rank=16))
    assert any(len(cache) for cache in caches())  # the run remembered configs and recipes
    forget_remembered()
    assert [cache for cache in caches() if len(cache)] == []
    again = lg.check_adapters(tmp_path / "fleet", lg.ServingLimits(max_rank=16))
    assert again.codes() == ["LG101"] * 2  # read again from the files: the same verdicts


def test_a_cache_keeps_at_most_its_size_least_recently_used_out() -> None:
    cache: Bounded[int, str | None] = Bounded(3, "a test's numbers")
    for n in range(10):
        value = None if n % 2 else str(n)  # None is an entry too
        cache.get_or_make(n, lambda value=value: value)  # type: ignore[misc]
        assert len(cache) <= 3
    assert cache.get_or_make(9, lambda: "made again") is None  # remembered, not made again
    assert cache.get(0) is None and len(cache) == 3


class _PushedOutAfterFound(OrderedDict[Any, Any]):
    """A cache's entries where another thread pushes a key out right after a look-up found
    it (the worst moment a thread switch can come)."""

    def get(self, key: Any, default: Any = None) -> Any:
        value = super().get(key, default)
        if value is not default:
            del self[key]
        return value


class _EmptiedAfterWrite(OrderedDict[Any, Any]):
    """A cache's entries that another thread empties right after a write."""

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self.clear()


def test_an_entry_pushed_out_by_another_thread_mid_call_is_still_answered() -> None:
    """Threads share the reader's memories without a lock: an entry pushed out between a
    look-up's two steps (found, then marked used; written, then the oldest dropped) still
    gives its value, and nothing is raised."""
    cache: Bounded[str, int] = Bounded(2, "a test's numbers")
    cache.put("a", 1)
    cache._entries = _PushedOutAfterFound(cache._entries)
    assert cache.get("a") == 1 and cache.get("a") is None  # found, then gone
    cache.put("b", 2)
    assert cache.get_or_make("b", lambda: 3) == 2
    cache._entries = _EmptiedAfterWrite()
    assert cache.put("c", 4) == 4 and cache.get_or_make("d", lambda: 5) == 5


def test_threads_reading_adapters_while_the_memories_are_emptied_read_them_right(
        tmp_path: pathlib.Path) -> None:
    """Four threads read and check adapters of four recipes while a fifth empties every
    memory over and over (what a full cache does to its oldest entry): each read is right and
    none raises."""
    folders = [write_adapter(tmp_path / f"r{rank}", rank=rank) for rank in (4, 8, 16, 32)]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # a thread switch between any two steps
    failures: list[BaseException] = []
    done = threading.Event()

    def read(folder: pathlib.Path, rank: int) -> None:
        try:
            for _ in range(150):
                assert lg.inspect_adapter(folder).rank == rank
                assert lg.check_adapters([folder], lg.ServingLimits(max_rank=8)).codes() == (
                    ["LG101"] if rank > 8 else [])
        except BaseException as exc:  # reported below, with its thread's
            failures.append(exc)

    def forget() -> None:
        try:
            while not done.is_set():
                forget_remembered()
        except BaseException as exc:  # reported below
            failures.append(exc)

    try:
        readers = [threading.Thread(target=read, args=(f, r))
                   for f, r in zip(folders, (4, 8, 16, 32), strict=True)]
        emptier = threading.Thread(target=forget)
        emptier.start()
        for t in readers:
            t.start()
        for t in readers:
            t.join()
    finally:
        done.set()
        emptier.join()
        sys.setswitchinterval(switch)
    assert failures == []


def test_every_copy_of_an_moe_recipe_keeps_its_experts_rank_findings(
    tmp_path: pathlib.Path,
) -> None:
    """sglang packs each expert's gate/up at one rank (found uniform once per recipe) and
    every expert at the pool's rank: expert 0 trained at rank 16 is reported for each copy,
    not only the first one checked."""
    first = write_adapter(tmp_path / "fleet" / "a", moe_layout="per-expert",
                          targets=("gate_proj", "up_proj", "down_proj"),
                          rank_pattern={f"experts.0.{p}": 16
                                        for p in ("gate_proj", "up_proj", "down_proj")})
    shutil.copytree(first, tmp_path / "fleet" / "b")
    report = lg.check_adapters(tmp_path / "fleet", lg.ServingLimits.for_engine("sglang"))
    experts = {adapter_id.rsplit("/", 1)[-1]: [
        v for v in found if v.code == "LG111" and "the experts of" in v.message]
        for adapter_id, found in report.by_adapter.items()}
    assert len(experts["a"]) == len(experts["b"]) == 6  # 2 layers x gate, up, down


def _with_bias_key(folder: pathlib.Path, *, bias: str, name: str) -> pathlib.Path:
    """``folder``'s adapter trained with PEFT's ``bias`` option: the header also saves the
    base layer's bias of one module; its own name in the config and the header metadata."""
    from lora_guard._reading.safetensors import read_safetensors_header, write_safetensors

    weights = folder / "adapter_model.safetensors"
    tensors, _ = read_safetensors_header(weights)
    entries = [(key, info.dtype, info.shape) for key, info in tensors.items()]
    module = next(iter(tensors)).split(".lora_")[0]
    entries.append((module + ".bias", "float16", (64,)))
    header, size = encode_header(entries, {"name": name})
    write_safetensors(weights, header, size)
    config = json.loads((folder / "adapter_config.json").read_text())
    config.update(bias=bias, revision=name)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def test_adapters_that_differ_only_in_a_field_the_key_grammar_reads_keep_their_verdicts(
        tmp_path: pathlib.Path) -> None:
    # the same tensors, their own names: PEFT's bias option decides what a saved bias is
    none = _with_bias_key(write_adapter(tmp_path / "run" / "none"), bias="none", name="none")
    every = _with_bias_key(write_adapter(tmp_path / "run" / "all"), bias="all", name="all")
    together = sorted((v.subject, v.code, v.message)
                      for v in lg.check_adapters(tmp_path / "run").violations)
    alone = []
    for folder in (every, none):
        forget_remembered()
        alone += [(v.subject, v.code, v.message) for v in lg.check_adapters(folder).violations]
    assert together == sorted(alone)
    by_name = [[c for s, c, _ in together if s.endswith(f"{n}'")] for n in ("none", "all")]
    assert by_name == [["LG104"], ["LG105"]]  # a key no grammar reads; biases not served


def _relabelled(trained: pathlib.Path, folder: pathlib.Path, **fields: object) -> pathlib.Path:
    """``trained``'s weights under another name, its config edited as a hand-fixed config
    is (``fields``): its own bytes, so its own recipe."""
    shutil.copytree(trained, folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    config.update(revision=folder.name, **fields)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def test_adapters_of_the_same_weights_keep_their_own_module_findings(
        tmp_path: pathlib.Path) -> None:
    # one trained adapter, and two copies whose configs were edited by hand: one says r=16
    # over rank-8 weights (LG102 on every module), one sets lora_alpha to 0 (LG121, no
    # module finding). The module pass of equal weights and equal grammar fields is shared;
    # each adapter still gets what it gets alone.
    trained = write_adapter(tmp_path / "run" / "a-trained", rank=8)
    _relabelled(trained, tmp_path / "run" / "b-alpha-zero", lora_alpha=0)
    _relabelled(trained, tmp_path / "run" / "c-rank-16", r=16)
    together = sorted((v.subject, v.code, v.message)
                      for v in lg.check_adapters(tmp_path / "run").violations)
    alone = []
    for folder in sorted((tmp_path / "run").iterdir()):
        forget_remembered()
        alone += [(v.subject, v.code, v.message) for v in lg.check_adapters(folder).violations]
    assert together == sorted(alone)
    by_name = [[c for s, c, _ in together if s.endswith(f"{n}'")]
               for n in ("a-trained", "b-alpha-zero", "c-rank-16")]
    assert by_name == [[], ["LG121"], ["LG102"]]


def test_adapters_that_share_no_bytes_keep_what_the_set_checks_and_the_report_read(
        tmp_path: pathlib.Path) -> None:
    # A fleet trained from one recipe, each adapter saved with its own name (revision):
    # no two configs are byte-identical, so each adapter keeps its own config (held
    # compactly, its strings shared by value). sglang sizes its pool by the largest r of
    # the set (rank-from-set): one adapter's rank_pattern asks for more than that.
    fields: dict[str, object] = {"layers_to_transform": [0, 1], "revision": None}
    folders = []
    for i, rank in enumerate((8, 16, 8)):
        folders.append(write_adapter(
            tmp_path / f"a{i}", rank=rank, rank_pattern={"q_proj": 32} if i == 2 else None,
            config_overrides=dict(fields, revision=f"run-{i}")))
    report = lg.check_adapters(tmp_path, lg.ServingLimits(engine_rules=("rank-from-set",)))
    assert [(v.code, v.subject) for v in report.violations] == [
        ("LG101", f"adapter {str(folders[2])!r}")]
    assert report.violations[0].details["max_rank"] == 16  # the largest r of the set
    for folder, spec in zip(folders, report.adapters, strict=True):
        written = json.loads((folder / "adapter_config.json").read_text())
        assert spec.config == written and dict(spec.config) == written
        assert list(spec.config) == list(written)  # the file's order
        assert type(spec.config["target_modules"]) is list
        assert spec.config["layers_to_transform"] == [0, 1]  # a list of numbers, as it was
    entries = json.loads(report.to_json())["adapters"]
    assert [e["rank"] for e in entries] == [8, 16, 32]  # its q_proj modules: rank 32
    assert "".join(report.json_chunks()) == report.to_json()
