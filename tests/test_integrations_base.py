"""The integration machinery: hooks, exact restoration, version checks, entry points."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import lora_guard as lg
from lora_guard import integrations
from lora_guard.integrations import Integration, IntegrationWarning
from lora_guard.integrations._base import HeardList, Patch
from lora_guard.testing import write_adapter

LIBRARY = """
__version__ = "{version}"

class Server:
    def load(self, path, name=None):
        return ("loaded", path)

def swap(model, path):
    return ("swapped", path)
"""


@pytest.fixture
def fakelib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., str]]:
    """Write a tiny library to disk; ``make(version, source)`` and import it under a new name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    made: list[str] = []

    def make(name: str, version: str = "1.2.0", source: str = LIBRARY) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source.format(version=version)))
        made.append(name)
        return name

    yield make
    for name in made:
        sys.modules.pop(name, None)


def refuse_all(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> Any:
    lg.assert_slot_maps_consistent({"a": 0}, [None])   # always an LG201 in raise mode
    return wrapped(*args, **kwargs)


def integration(module: str, **overrides: Any) -> Integration:
    return Integration(
        name="fake", distribution=module, min_version=overrides.pop("min_version", "1.0"),
        max_version=overrides.pop("max_version", None),
        patches=overrides.pop("patches", (
            Patch(module, "Server.load", ("self", "path"), refuse_all),
            Patch(module, "swap", ("model", "path"), refuse_all),
        )),
    )


def test_instrument_before_import_patches_when_the_library_is_imported(
        fakelib: Callable[..., str]) -> None:
    name = fakelib("fake_before")
    guard = integration(name)
    guard.instrument()
    assert name not in sys.modules
    module = __import__(name)
    with pytest.raises(lg.RegistryError):
        module.Server().load("p")
    guard.uninstrument()
    assert module.Server().load("p") == ("loaded", "p")


def test_instrument_after_import_patches_at_once_and_restores_identity(
        fakelib: Callable[..., str]) -> None:
    module = __import__(fakelib("fake_after"))
    load, swap = vars(module.Server)["load"], module.swap
    guard = integration(module.__name__)
    guard.instrument()
    guard.instrument()
    with pytest.raises(lg.RegistryError):
        module.swap(None, "p")
    guard.uninstrument()
    assert vars(module.Server)["load"] is load and module.swap is swap


def test_a_hook_that_fires_after_uninstrument_does_nothing(fakelib: Callable[..., str]) -> None:
    name = fakelib("fake_late")
    guard = integration(name)
    guard.instrument()
    guard.uninstrument()
    module = __import__(name)
    assert module.swap(None, "p") == ("swapped", "p")
    assert guard.patched == []


def test_reinstrumenting_after_a_reimport_patches_the_new_module(
        fakelib: Callable[..., str]) -> None:
    name = fakelib("fake_again")
    guard = integration(name)
    guard.instrument()
    __import__(name)
    guard.uninstrument()
    del sys.modules[name]
    guard.instrument()
    module = __import__(name)
    try:
        with pytest.raises(lg.RegistryError):
            module.swap(None, "p")
    finally:
        guard.uninstrument()


def test_unknown_signatures_are_not_patched_but_named_in_a_warning(
        fakelib: Callable[..., str]) -> None:
    source = LIBRARY.replace("def swap(model, path)", "def swap(model, adapter_path)")
    module = __import__(fakelib("fake_changed", version="1.9.0", source=source))
    guard = integration(module.__name__)
    with pytest.warns(IntegrationWarning) as warned:
        guard.instrument()
    message = str(warned[0].message)
    assert "1.9.0 is not patched" in message
    assert "swap: parameters (model, adapter_path) differ from the known (model, path" in message
    assert guard.patched == []
    assert module.Server().load("p") == ("loaded", "p")   # all or nothing per module
    guard.uninstrument()


def test_a_release_older_than_known_is_not_patched(fakelib: Callable[..., str]) -> None:
    module = __import__(fakelib("fake_old", version="0.9.1"))
    guard = integration(module.__name__)
    with pytest.warns(IntegrationWarning, match=r"0\.9\.1 is older than 1\.0"):
        guard.instrument()
    assert module.swap(None, "p") == ("swapped", "p")
    guard.uninstrument()


def test_an_optional_target_missing_from_a_release_is_a_warning_naming_it(
        fakelib: Callable[..., str]) -> None:
    module = __import__(fakelib("fake_optional"))
    guard = integration(module.__name__, patches=(
        Patch(module.__name__, "swap", ("model", "path"), refuse_all),
        Patch(module.__name__, "Server.unload", ("self",), refuse_all, optional=True),
    ))
    with pytest.warns(IntegrationWarning, match=r"fake_optional 1\.2\.0 has no "
                      r"fake_optional\.Server\.unload \(missing unload\)"):
        report = guard.instrument()
    assert guard.patched == [f"{module.__name__}:swap"]
    assert report.attached == (f"{module.__name__}:swap",)
    assert report.missing == {f"{module.__name__}:Server.unload": "missing unload"}
    assert report.supported is True and report.pending == ()
    guard.uninstrument()


def test_the_report_lists_hooks_of_a_module_not_imported_yet_as_pending(
        fakelib: Callable[..., str]) -> None:
    name = fakelib("fake_later")
    guard = integration(name)
    report = guard.instrument()
    assert report.pending == (name,) and report.attached == ()
    __import__(name)
    assert guard.report().attached == (f"{name}:Server.load", f"{name}:swap")
    guard.uninstrument()


def test_a_release_newer_than_the_tested_range_is_patched_with_a_warning(
        fakelib: Callable[..., str]) -> None:
    module = __import__(fakelib("fake_new", version="2.0.0"))
    guard = integration(module.__name__, min_version="1.0", max_version="1.1")
    with pytest.warns(IntegrationWarning, match=r"2\.0\.0 is newer than .*>=1\.0,<1\.1"):
        report = guard.instrument()
    assert report.supported is False and len(report.attached) == 2
    guard.uninstrument()


def test_a_wrapper_patched_over_by_someone_else_is_left_in_place(
        fakelib: Callable[..., str], monkeypatch: pytest.MonkeyPatch) -> None:
    module = __import__(fakelib("fake_layered"))
    guard = integration(module.__name__)
    guard.instrument()
    theirs = module.swap

    def other_tracer(*args: Any) -> Any:
        return theirs(*args)

    monkeypatch.setattr(module, "swap", other_tracer)
    with pytest.warns(IntegrationWarning, match="patched again by someone else"):
        guard.uninstrument()
    assert module.swap is other_tracer
    assert module.swap(None, "p") == ("swapped", "p")   # our layer is a pass-through now


def test_off_mode_makes_every_guard_a_pass_through(fakelib: Callable[..., str]) -> None:
    module = __import__(fakelib("fake_off"))
    guard = integration(module.__name__)
    guard.instrument()
    lg.configure(mode="off")
    try:
        assert module.swap(None, "p") == ("swapped", "p")
    finally:
        lg.configure(mode="raise")
        guard.uninstrument()


# --- the registry and the entry-point group ------------------------------------------------

def test_the_builtin_integrations_are_available_by_name() -> None:
    assert {"peft", "sglang", "vllm"} <= set(integrations.available())
    for name in ("peft", "sglang", "vllm", " PEFT "):
        found = integrations.get(name)
        assert found.name == name.strip().lower()
        assert callable(found.instrument) and callable(found.uninstrument)


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError) as caught:
        integrations.get("tgi")
    assert "no integration 'tgi'; known: lmdeploy, peft, sglang, vllm" in str(caught.value)
    assert "lora_guard.integrations" in str(caught.value)


def fake_entry_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str,
                      source: str) -> None:
    (tmp_path / "thirdparty_guard.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("thirdparty_guard", None)
    entry = importlib.metadata.EntryPoint(
        name="tgi", value=value, group=integrations.ENTRY_POINT_GROUP)

    def entry_points(**select: Any) -> importlib.metadata.EntryPoints:
        assert select == {"group": integrations.ENTRY_POINT_GROUP}
        return importlib.metadata.EntryPoints([entry])

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


def test_a_third_party_integration_ships_through_the_entry_point_group(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_entry_points(tmp_path, monkeypatch, "thirdparty_guard", """
        name = "tgi"
        calls = []
        def instrument(): calls.append("instrument")
        def uninstrument(): calls.append("uninstrument")
    """)
    assert "tgi" in integrations.available()
    done = integrations.instrument("peft,tgi")
    assert [(d.name, d.instrumented) for d in done] == [("peft", True), ("tgi", True)]
    assert integrations.get("tgi").instrumented  # the same state on every lookup
    integrations.uninstrument(["tgi", "peft"])
    assert [(d.name, d.instrumented) for d in done] == [("peft", False), ("tgi", False)]
    assert sys.modules["thirdparty_guard"].calls == ["instrument", "uninstrument"]


def test_a_plain_module_without_a_name_is_named_after_its_entry_point(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_entry_points(tmp_path, monkeypatch, "thirdparty_guard", """
        calls = []
        def instrument(): calls.append("instrument")
        def uninstrument(): calls.append("uninstrument")
    """)
    found = integrations.get("TGI")
    assert isinstance(found, integrations.IntegrationLike)
    assert (found.name, found.instrumented) == ("tgi", False)
    found.instrument()
    assert integrations.get("tgi").instrumented
    assert sys.modules["thirdparty_guard"].calls == ["instrument"]
    found.uninstrument()


def test_an_entry_point_without_instrument_is_refused_clearly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_entry_points(tmp_path, monkeypatch, "thirdparty_guard:thing", "thing = 42\n")
    with pytest.raises(TypeError, match="lacks instrument"):
        integrations.get("tgi")


def test_instrument_by_names_checks_every_name_before_patching_any() -> None:
    peft = integrations.get("peft")
    was = peft.instrumented  # on when the suite runs with --lora-guard-instrument=peft
    if was:
        peft.uninstrument()
    try:
        with pytest.raises(ValueError, match="no integration 'nope'"):
            integrations.instrument(["peft", "nope"])
        assert not peft.instrumented
    finally:
        if was:
            peft.instrument()


def test_no_test_depends_on_a_replica() -> None:
    # the integrations are tested on the real engines (tests/engines/), never on copies
    assert not (Path(__file__).parent / "replicas").exists()
    for name in ("sglang", "vllm"):
        assert name not in sys.modules or "replicas" not in str(sys.modules[name].__file__)


@pytest.mark.skipif(any(importlib.util.find_spec(n) for n in ("vllm", "sglang")),
                    reason="the engine tier checks doctor where the engines are installed")
def test_doctor_without_the_engines_says_so_and_passes(
        capsys: pytest.CaptureFixture[str]) -> None:
    import peft

    from lora_guard._frontends.cli import main
    from lora_guard.integrations import peft as peft_guard

    assert main(["doctor"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:4] == ["vllm: not installed", "sglang: not installed",
                         "lmdeploy: not installed",
                         f"peft {peft.__version__}: supported; tested: peft "
                         f"{peft_guard.INTEGRATION.supported_range}; guards check with the "
                         "peft==0.21 profile"]
    assert sorted(lines[4:]) == sorted(
        f"  attached  {p.module}:{p.path} (peft {peft.__version__})"
        for p in peft_guard.INTEGRATION.patches)
    assert main(["doctor", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True and data["engines"]["vllm"] is None
    assert data["engines"]["peft"]["version"] == peft.__version__
    assert data["engines"]["peft"]["missing"] == {}


def test_doctor_says_an_import_error_once_not_as_each_hook_missing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # an installed library whose guarded modules need a package this environment lacks, as
    # sglang's LoRA modules need torchvision
    from lora_guard._frontends.doctor import _text
    from lora_guard.integrations._base import Integration, Patch

    root = tmp_path / "site"
    (root / "needsvision").mkdir(parents=True)
    (root / "needsvision" / "__init__.py").write_text("__version__ = '1.0'\n")
    (root / "needsvision-1.0.dist-info").mkdir()
    (root / "needsvision-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: needsvision\nVersion: 1.0\n")
    for module in ("manager", "pool"):
        (root / "needsvision" / f"{module}.py").write_text(
            "import torchvision_absent_here\nclass C:\n    def f(self, x): ...\n")
    monkeypatch.syspath_prepend(str(root))
    guard = Integration(name="needsvision", distribution="needsvision", min_version="1.0",
                        patches=tuple(Patch(f"needsvision.{m}", "C.f", ("self", "x"),
                                            lambda w, i, a, k: w(*a, **k))
                                      for m in ("manager", "pool")))
    report = guard.diagnose()
    assert report is not None
    assert report.import_errors == {
        m: "ModuleNotFoundError: No module named 'torchvision_absent_here'"
        for m in ("needsvision.manager", "needsvision.pool")}
    lines = _text({"engines": {"needsvision": {**report.as_dict(), "profile": None}}})
    assert lines[1:3] == [
        "  DOES NOT IMPORT  needsvision.manager, needsvision.pool: ModuleNotFoundError: No "
        "module named 'torchvision_absent_here'",
        "    so 2 hooks cannot be checked on needsvision 1.0: install torchvision_absent_here "
        "into this environment, then run lora-guard doctor again"]
    assert not any(line.startswith("  MISSING") for line in lines)
    assert lines[-1].startswith("lora-guard doctor: needsvision supported but missing hooks")


def test_a_fast_path_calls_the_original_itself_and_hands_every_other_call_to_the_guard(
        fakelib: Callable[..., str]) -> None:
    # a per-step method: the fast path knows when there is nothing new to check
    name = fakelib("fake_fast")
    module = __import__(name)
    original = vars(module.Server)["load"]

    def fast(wrapped: Callable[..., Any], guarded: Callable[..., Any]) -> Callable[..., Any]:
        def load(self: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
            if path == "resident":  # as last verified: the original at once
                return wrapped(self, path, *args, **kwargs)
            return guarded(self, path, *args, **kwargs)
        return load

    guard = integration(name, patches=(
        Patch(name, "Server.load", ("self", "path"), refuse_all, fast=fast),))
    guard.instrument()
    try:
        assert module.Server().load("resident") == ("loaded", "resident")
        with pytest.raises(lg.RegistryError, match="LG201"):
            module.Server().load("new")
        assert module.Server.load.__wrapped__ is original
    finally:
        guard.uninstrument()
    assert vars(module.Server)["load"] is original
    assert module.Server().load("new") == ("loaded", "new")


def test_a_fast_path_on_a_classmethod_gets_the_class_and_uninstrument_puts_it_back(
        fakelib: Callable[..., str]) -> None:
    # a loader's classmethod (vLLM's PEFTHelper.from_dict) whose hook only notes what the
    # library was given: one function in its place, called with the class
    name = fakelib("fake_fast_cls", source=LIBRARY + """
class Helper:
    @classmethod
    def from_dict(cls, config):
        helper = cls()
        helper.r = config["r"]
        return helper
""")
    module = __import__(name)
    original = vars(module.Helper)["from_dict"]
    noted: list[tuple[Any, Any]] = []

    def fast(wrapped: Callable[..., Any], guarded: Callable[..., Any]) -> Callable[..., Any]:
        def from_dict(cls: Any, config: Any) -> Any:
            helper = wrapped(cls, config)
            noted.append((cls, config))
            return helper
        return from_dict

    guard = integration(name, patches=(
        Patch(name, "Helper.from_dict", ("cls", "config"), refuse_all, fast=fast),))
    guard.instrument()
    try:
        helper = module.Helper.from_dict({"r": 8})
        assert (type(helper), helper.r) == (module.Helper, 8)
        assert noted == [(module.Helper, {"r": 8})]
        assert isinstance(vars(module.Helper)["from_dict"], classmethod)
        assert module.Helper.from_dict.__wrapped__ is original.__func__
    finally:
        guard.uninstrument()
    assert vars(module.Helper)["from_dict"] is original
    module.Helper.from_dict({"r": 16})
    assert len(noted) == 1


# --- an adapter the engine has read already ------------------------------------------------


def _as_read_by_an_engine(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The config and tensors an engine's loader holds after reading ``folder``."""
    import torch
    from safetensors.torch import load_file

    config = json.loads((folder / "adapter_config.json").read_text())
    tensors: dict[str, torch.Tensor] = load_file(str(folder / "adapter_model.safetensors"))
    return config, tensors


def test_an_adapter_the_engine_read_is_checked_without_reading_it_again(tmp_path: Path) -> None:
    from lora_guard.integrations._base import loaded_adapter

    folder = write_adapter(tmp_path / "good", rank=8)
    config, tensors = _as_read_by_an_engine(folder)
    spec, found = loaded_adapter(folder, config, tensors, "adapter 'good'")
    assert found == [] and spec is not None and spec.rank == 8


def test_adapters_the_engine_read_share_what_the_grammar_read_only_when_every_tensor_matches(
    tmp_path: Path,
) -> None:
    # A server loads a recipe's adapters in turn: tensors equal in name, shape and dtype share
    # the modules read from them; one tensor of another rank or dtype is read anew.
    import torch

    from lora_guard.integrations._base import loaded_adapter

    folder = write_adapter(tmp_path / "a", rank=8)
    config, tensors = _as_read_by_an_engine(folder)
    first, _ = loaded_adapter(folder, config, tensors, "adapter 'a'")
    again, _ = loaded_adapter(folder, config, {k: t.clone() for k, t in tensors.items()},
                              "adapter 'a'")
    assert first is not None and again is not None
    assert again.parts_key == first.parts_key and again.modules is first.modules

    a_key = next(k for k in tensors if k.endswith("q_proj.lora_A.weight"))
    b_key = a_key.replace("lora_A", "lora_B")
    wider = dict(tensors)
    wider[a_key] = torch.zeros(16, tensors[a_key].shape[1], dtype=torch.float16)
    wider[b_key] = torch.zeros(tensors[b_key].shape[0], 16, dtype=torch.float16)
    widened, _ = loaded_adapter(folder, config, wider, "adapter 'a'")
    assert widened is not None and widened.parts_key != first.parts_key
    module = a_key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
    assert widened.modules[module].rank == 16 and first.modules[module].rank == 8

    cast = {**tensors, a_key: tensors[a_key].float()}
    recast, _ = loaded_adapter(folder, config, cast, "adapter 'a'")
    assert recast is not None and recast.dtypes == ("float16", "float32")
    assert first.dtypes == ("float16",)


def test_a_weights_file_symlinked_out_of_the_folder_is_refused_though_the_engine_read_it(
    tmp_path: Path,
) -> None:
    # An uploaded folder whose weights are a link to a file elsewhere on the server: the
    # engine follows it and loads; the checks on what it read refuse it, as the reader does.
    from lora_guard.integrations._base import engine_files_clean, loaded_adapter

    elsewhere = write_adapter(tmp_path / "elsewhere", rank=8)
    folder = write_adapter(tmp_path / "uploaded", rank=8)
    (folder / "adapter_model.safetensors").unlink()
    (folder / "adapter_model.safetensors").symlink_to(elsewhere / "adapter_model.safetensors")
    config, tensors = _as_read_by_an_engine(folder)  # the engine followed the link

    spec, found = loaded_adapter(folder, config, tensors, "adapter 'uploaded'")
    assert spec is None and [v.code for v in found] == ["LG108"]
    assert "leads outside the adapter folder" in found[0].message
    assert not engine_files_clean(folder)
    assert engine_files_clean(elsewhere)


def _deployed(folder: Path) -> Path:
    """``folder`` as a server finds an adapter deployed earlier: unchanged for longer than a
    file system's coarsest clock (until then its stamp is not kept, every load looks in full)."""
    import time

    from lora_guard.integrations._base import _SETTLED_NS

    wait = _SETTLED_NS - (time.time_ns() - os.stat(folder).st_ctime_ns)
    if wait > 0:
        time.sleep(wait / 1e9 + 0.05)
    return folder


def _counted(real: Any, name: str, calls: list[tuple[str, str]]) -> Any:
    """``os.<name>`` that also writes down each call's path."""
    def call(path: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append((name, os.fspath(path)))
        return real(path, *args, **kwargs)
    return call


def _remembered(folder: Path) -> tuple[Any, Any, Any]:
    """A verdict kept for what an engine read from ``folder``, and the folder looked at once
    (as the first load found clean, then a second, leave it)."""
    from lora_guard.integrations._base import CleanVerdicts, read_key

    verdicts, limits = CleanVerdicts("a test's loads"), lg.ServingLimits(max_rank=16)
    key = read_key(*_as_read_by_an_engine(folder))
    verdicts.remember(key, limits)
    assert verdicts.clean(key, limits, folder)
    return verdicts, key, limits


def test_a_remembered_clean_load_costs_one_stat_of_its_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # an adapter loaded again and again (a recipe's adapters, LRU evictions): the file rules
    # and the added_tokens.json look cost one stat of the folder, no look at each file
    folder = _deployed(write_adapter(tmp_path / "a", rank=8))
    verdicts, key, limits = _remembered(folder)
    calls: list[tuple[str, str]] = []
    for name in ("stat", "lstat", "access", "open"):
        monkeypatch.setattr(os, name, _counted(getattr(os, name), name, calls))

    assert verdicts.clean(key, limits, folder)
    assert calls == [("stat", str(folder))]


def test_a_remembered_clean_load_is_refused_once_added_tokens_json_appears_in_its_folder(
        tmp_path: Path) -> None:
    folder = _deployed(write_adapter(tmp_path / "a", rank=8))
    verdicts, key, limits = _remembered(folder)
    assert verdicts.clean(key, limits, folder)

    (folder / "added_tokens.json").write_text('{"<sql>": 32000}')

    assert not verdicts.clean(key, limits, folder)


def test_a_remembered_clean_load_is_refused_once_its_weights_link_out_of_the_folder(
        tmp_path: Path) -> None:
    elsewhere = write_adapter(tmp_path / "elsewhere", rank=8)
    folder = _deployed(write_adapter(tmp_path / "a", rank=8))
    verdicts, key, limits = _remembered(folder)
    assert verdicts.clean(key, limits, folder)

    (folder / "adapter_model.safetensors").unlink()
    (folder / "adapter_model.safetensors").symlink_to(elsewhere / "adapter_model.safetensors")

    assert not verdicts.clean(key, limits, folder)


def test_a_remembered_clean_load_is_refused_once_its_folder_is_swapped_for_another(
        tmp_path: Path) -> None:
    # a redeploy by rename: the path now names another folder, deployed as long ago, whose
    # weights link out of it
    elsewhere = write_adapter(tmp_path / "elsewhere", rank=8)
    folder = write_adapter(tmp_path / "a", rank=8)
    staged = write_adapter(tmp_path / "staged", rank=8)
    (staged / "adapter_model.safetensors").unlink()
    (staged / "adapter_model.safetensors").symlink_to(elsewhere / "adapter_model.safetensors")
    _deployed(staged), _deployed(folder)
    verdicts, key, limits = _remembered(folder)
    assert verdicts.clean(key, limits, folder)

    folder.rename(tmp_path / "old")
    staged.rename(folder)

    assert not verdicts.clean(key, limits, folder)


def test_equal_limits_share_remembered_verdicts_and_other_limits_do_not(
        tmp_path: Path) -> None:
    # a server restarted with the same flags (its limits made anew) keeps what it found
    # clean; one with another rank, or whose base model's config.json changed, checks again
    from lora_guard.integrations._base import CleanVerdicts, read_key

    base = tmp_path / "base" / "config.json"
    base.parent.mkdir()
    dims = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}
    base.write_text(json.dumps(dims))
    verdicts = CleanVerdicts("a test's loads")
    key = read_key(*_as_read_by_an_engine(write_adapter(tmp_path / "a", rank=8)))
    first = lg.ServingLimits.for_engine("vllm", max_lora_rank=16, base_config=base)
    verdicts.remember(key, first)

    again = lg.ServingLimits.for_engine("vllm", max_lora_rank=16, base_config=base)
    other_rank = lg.ServingLimits.for_engine("vllm", max_lora_rank=32, base_config=base)
    base.write_text(json.dumps({**dims, "hidden_size": 128}))
    other_base = lg.ServingLimits.for_engine("vllm", max_lora_rank=16, base_config=base)

    assert again is not first and verdicts.clean(key, again)
    assert not verdicts.clean(key, other_rank)
    assert other_base == first  # the same path: equal as given, yet other dims were read
    assert not verdicts.clean(key, other_base)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="gives a file to another user (needs root)")
def test_a_file_another_user_owns_is_looked_at_every_load_and_refused_once_hard_linked(
        tmp_path: Path) -> None:
    # the weights belong to another account: that account can give the file a second name
    # outside the folder without touching the folder, so no stamp stands for it
    folder = _deployed(write_adapter(tmp_path / "a", rank=8))
    weights = folder / "adapter_model.safetensors"
    os.chown(weights, 4242, 4242)
    verdicts, key, limits = _remembered(folder)
    assert verdicts.clean(key, limits, folder)

    os.link(weights, tmp_path / "their-copy.safetensors")  # the other account's second name

    assert not verdicts.clean(key, limits, folder)


@pytest.mark.parametrize("write", [
    lambda t: t.__setitem__(1, "c"), lambda t: t.__delitem__(0), lambda t: t.append("c"),
    lambda t: t.extend(["c"]), lambda t: t.insert(0, "c"), lambda t: t.pop(),
    lambda t: t.remove("a"), lambda t: t.clear(), lambda t: t.sort(), lambda t: t.reverse(),
    lambda t: t.__iadd__(["c"]), lambda t: t.__imul__(2),
])
def test_a_slot_table_in_the_guards_list_forgets_its_verification_at_any_write(
        write: Callable[[list[Any]], Any]) -> None:
    # vLLM's lora_index_to_id and sglang's buffer_id_to_uid, once verified: a step that
    # writes nothing keeps the verification; any write (the engine's, or one behind its
    # back) drops it, and uninstrument gives the engine its own list object back
    import copy
    import pickle

    engine_list = ["b", "a"]
    table = HeardList(engine_list, frozenset({"a", "b"}))
    assert table == ["b", "a"] and table[1] == "a" and "a" in table  # reads as the list
    assert table.verified == frozenset({"a", "b"})
    assert type(copy.copy(table)) is list and type(pickle.loads(pickle.dumps(table))) is list

    write(table)
    assert table.verified is None
    current = list(table)
    assert table.give_back() is engine_list and engine_list == current
