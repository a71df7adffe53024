"""One invariant, one unit: an entry and its check, defined together, reach every reader.

The made-up invariant below (LG199, a dropout the adapter was trained with that is too high to
trust) is defined in this one module, entry and check in one decorator. Nothing else is
edited, and it shows in `lg.INVARIANTS`, `lora-guard codes` and `explain`, the docs
reference, and in the checker's report on a real PEFT adapter.
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib
from collections.abc import Iterator
from types import ModuleType

import pytest

import lora_guard as lg
from conftest_adapters import peft_adapter
from lora_guard._checking.registry import adapter_invariant, remove_invariant
from lora_guard._checking.rules.context import AdapterContext
from lora_guard._core.codes import check_codes
from lora_guard._core.errors import Violation, make_violation
from lora_guard._frontends.cli import main
from lora_guard.testing import write_adapter

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _define_lg199() -> None:
    """The whole invariant: what a contributor writes in one module."""

    @adapter_invariant(
        code="LG199",
        slug="dropout-too-high",
        title="The adapter was trained with a dropout above 0.5",
        summary="A LoRA dropout above 0.5 trains an adapter that is mostly noise at inference.",
        triggers=("`lora_dropout` above 0.5 in adapter_config.json.",),
        fixes=("Retrain the adapter with lora_dropout at or below 0.5 (0.05-0.1 is usual).",),
        error="AdapterError",
        messages={"high": "{subject}: lora_dropout is {dropout}, above 0.5."},
        raised_by=("lg.check_adapters",),
    )
    def dropout_too_high(ctx: AdapterContext) -> Iterator[Violation]:
        dropout = ctx.spec.config.get("lora_dropout", 0.0)
        if isinstance(dropout, (int, float)) and dropout > 0.5:
            yield make_violation("LG199", "high", ctx.subject, dropout=dropout)


@pytest.fixture
def lg199() -> Iterator[None]:
    _define_lg199()
    try:
        yield
    finally:
        remove_invariant("LG199")


def _docs_hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "lora_guard_docs_hook_registry", ROOT / "docs" / "hooks" / "lora_guard_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.usefixtures("lg199")
def test_a_new_invariant_defined_in_one_module_reaches_every_reader(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str],
) -> None:
    # the catalogue, in code order, still read-only
    assert "LG199" in lg.INVARIANTS
    assert list(lg.INVARIANTS) == sorted(lg.INVARIANTS)
    with pytest.raises(TypeError):
        lg.INVARIANTS["LG199"] = lg.INVARIANTS["LG101"]  # type: ignore[index]
    # lora-guard codes and explain
    assert main(["codes"]) == 0
    assert "LG199  dropout-too-high" in capsys.readouterr().out.replace("   ", "  ")
    assert main(["explain", "LG199"]) == 0
    assert "lora_dropout is {dropout}, above 0.5" in capsys.readouterr().out
    # the docs reference
    page = _docs_hook().render_invariants()
    assert "## LG199 dropout-too-high: The adapter was trained with a dropout above 0.5 " \
        "{ #lg199 }" in page
    # the checker, on real PEFT adapters: the noisy one is reported, the usual one is not
    noisy = peft_adapter(tmp_path / "noisy", r=4, target_modules=["q_proj"], lora_dropout=0.9)
    usual = peft_adapter(tmp_path / "usual", r=4, target_modules=["q_proj"], lora_dropout=0.05)
    report = lg.check_adapters([noisy, usual])
    assert [(v.code, v.message) for v in report.violations] == [
        ("LG199", f"adapter {str(noisy)!r}: lora_dropout is 0.9, above 0.5.")]
    assert report.violations[0].hint.startswith("Retrain the adapter with lora_dropout")
    # the public per-adapter check too, and it can be skipped by code
    spec = lg.inspect_adapter(noisy)
    assert lg.check_adapter(spec).codes() == ["LG199"]
    assert lg.check_adapter(spec, skip="LG199").ok
    # and it raises like any adapter error
    with pytest.raises(lg.AdapterError, match="LG199"):
        report.enforce()


@pytest.mark.usefixtures("lg199")
def test_a_code_or_slug_taken_is_refused_and_nothing_changes() -> None:
    before = dict(lg.INVARIANTS)
    with pytest.raises(ValueError, match="taken by 'dropout-too-high'"):
        _define_lg199()
    with pytest.raises(ValueError, match="slug 'rank-exceeds-limit' is taken by LG101"):
        adapter_invariant(code="LG198", slug="rank-exceeds-limit", title="t", summary="s",
                          triggers=("t",), fixes=("f",), error="AdapterError",
                          messages={"m": "{subject}"})(lambda ctx: [])
    with pytest.raises(ValueError, match="one of AdapterError"):
        adapter_invariant(code="LG198", slug="made-up", title="t", summary="s",
                          triggers=("t",), fixes=("f",), error="NoSuchError",
                          messages={"m": "{subject}"})
    with pytest.raises(ValueError, match="built-in"):
        remove_invariant("LG101")
    assert dict(lg.INVARIANTS) == before


def test_removing_the_made_up_invariant_leaves_the_catalogue_as_shipped() -> None:
    shipped = list(lg.INVARIANTS)
    _define_lg199()
    remove_invariant("LG199")
    assert list(lg.INVARIANTS) == shipped
    with pytest.raises(ValueError, match="'LG199' is not a lora_guard code"):
        check_codes("LG199", where="allow")


def test_a_registered_code_is_skipped_alike_by_every_entry_point(
        lg199: None, tmp_path: pathlib.Path) -> None:
    """The integrations call `spec_violations`, users `check_adapter`: both take the codes of
    one registry (a registered code was refused by the first and accepted by the second)."""
    from lora_guard._checking.check_adapters import spec_violations

    spec = lg.inspect_adapter(write_adapter(tmp_path / "a", config_overrides={
        "lora_dropout": 0.9}))
    assert [v.code for v in spec_violations(spec)] == ["LG199"]
    assert spec_violations(spec, skip=("LG199",)) == []
    assert lg.check_adapter(spec, skip="LG199").ok
    with pytest.raises(ValueError, match="LG198"):
        spec_violations(spec, skip=("LG198",))


# --- the built-in codes: one module per code and layer, no list of codes ----------------------

SRC = ROOT / "src" / "lora_guard"
WORDS = SRC / "_core" / "catalogue"
CHECKS_DIR = SRC / "_checking" / "invariants"


def _code_modules(folder: pathlib.Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("lg[0-9][0-9][0-9]_*.py"))


def test_each_code_is_a_module_named_for_it_and_each_check_sits_beside_its_words() -> None:
    from lora_guard._checking.invariants import CHECKS

    words = _code_modules(WORDS)
    assert [name[:5].upper() for name in words] == list(lg.INVARIANTS)  # every code, once
    for name in words:
        inv = lg.INVARIANTS[name[:5].upper()]
        assert name == f"{inv.code.lower()}_{inv.slug.replace('-', '_')}"
    checks = _code_modules(CHECKS_DIR)
    assert set(checks) <= set(words)  # a check has its words, under the same name
    assert sorted(c.code for c in CHECKS) == [name[:5].upper() for name in checks]
    positions = [c.position for c in CHECKS]
    assert positions == sorted(set(positions))  # the report order: each check's own place


def test_a_codes_tests_are_one_file_named_for_its_modules() -> None:
    """CONTRIBUTING ("Where a test goes"): a code's tests are tests/test_lgNNN_<slug>.py, the
    name of its modules (a seed, a field bug reproduced, is named for its situation)."""
    named: dict[str, str] = {}
    for path in sorted(pathlib.Path(__file__).parent.glob("test_lg*.py")):
        code = path.name[5:10].upper()
        assert code in lg.INVARIANTS, f"{path.name}: {code} is not a code of the catalogue"
        assert code not in named, f"{named.get(code)} and {path.name}: one file per code"
        named[code] = path.name
        module = f"{code.lower()}_{lg.INVARIANTS[code].slug.replace('-', '_')}"
        seed = (ast.get_docstring(ast.parse(path.read_text("utf-8"))) or "").startswith("Seed ")
        assert seed or path.stem == f"test_{module}", f"{path.name}: name it test_{module}.py"
    assert {"LG101", "LG104", "LG109"} <= set(named)


@pytest.mark.parametrize(("planted", "where", "says"), [
    ("lg150_base_model_unnamed.py", "_core/catalogue",
     "holds LG150 other-slug: name the module lg150_other_slug"),
    ("lg151_dropout_too_high.py", "_checking/invariants",
     "lg151_dropout_too_high: no catalogue entry of that name"),
])
def test_a_code_module_not_named_for_its_entry_is_refused_at_import(
        tmp_path: pathlib.Path, planted: str, where: str, says: str) -> None:
    import shutil
    import subprocess
    import sys

    shutil.copytree(SRC, tmp_path / "lora_guard",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "lora_guard" / where / planted).write_text(
        (WORDS / "lg107_empty_tensor.py").read_text()
        .replace('"LG107"', '"LG150"').replace('"empty-tensor"', '"other-slug"'))
    done = subprocess.run(
        [sys.executable, "-c", "import lora_guard.testing, lora_guard._checking.run_checks"],
        cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1
    assert says in done.stderr


def test_every_code_an_engine_rule_names_is_a_code_of_the_catalogue() -> None:
    from lora_guard._checking.engines import SPECS, Rule

    named = {rule.code for engine in SPECS.values() for rule in engine.rules}
    assert named and named <= set(lg.INVARIANTS)
    with pytest.raises(ValueError, match="'LG199'.*not a lora_guard code"):
        Rule("LG199", "a made-up rule", "engine/lora.py:load")


def test_the_codes_an_integration_settles_are_codes_of_one_adapter() -> None:
    import lora_guard.integrations.peft as peft
    import lora_guard.integrations.sglang as sglang
    import lora_guard.integrations.vllm as vllm
    from lora_guard._checking.invariants import adapter_codes, settled_codes

    settled = [value for module in (peft, sglang, vllm) for name, value in vars(module).items()
               if name.endswith(("SETTLES", "SETTLED_BY_PEFT", "SETTLED_ELSEWHERE"))]
    assert len(settled) == 3  # PEFT's two, sglang's; vLLM's profile decides LG106 itself
    assert all(set(codes) <= set(adapter_codes()) for codes in settled)
    with pytest.raises(ValueError, match="LG108 is no code of one adapter's checks"):
        settled_codes("LG106", "LG108")  # the reader's code: no check of one adapter has it


def test_no_module_of_the_package_keeps_a_list_of_codes() -> None:
    """Code order, code lists and report order come from the registry: a module-level tuple,
    list or set of codes written by hand is the drift this layout removed."""
    import ast
    import re

    code = re.compile(r"LG\d{3}")
    lists = []
    for path in SRC.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, (ast.Tuple, ast.List, ast.Set)) and len(value.elts) > 1 and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str)
                    and code.fullmatch(e.value) for e in value.elts):
                lists.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert lists == []


def test_a_built_in_code_is_its_two_modules_and_nothing_else(tmp_path: pathlib.Path) -> None:
    """CONTRIBUTING's LG150 as a shipped code: its words and its check dropped into a copy of
    the package, no other file edited, and the checker, `codes` and `skip=` all know it."""
    import shutil
    import subprocess
    import sys

    shutil.copytree(SRC, tmp_path / "lora_guard",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "lora_guard" / "_core" / "catalogue" / "lg150_base_model_unnamed.py").write_text(
        'from lora_guard._core.catalogue._invariant import entry\n\n'
        'ENTRY = entry(code="LG150", slug="base-model-unnamed", title="No base model named",\n'
        '              summary="s", triggers=("t",), fixes=("Save base_model_name_or_path.",),\n'
        '              error="AdapterError",\n'
        '              messages={"unnamed": "{subject}: names no base model (r is {rank})."})\n')
    (tmp_path / "lora_guard" / "_checking" / "invariants" / "lg150_base_model_unnamed.py"
     ).write_text(
        "from lora_guard._checking.registry import adapter_check\n"
        "from lora_guard._core.errors import make_violation\n\n\n"
        '@adapter_check("LG150", position=170)\n'
        "def base_model_unnamed(ctx):\n"
        '    if ctx.spec.config.get("base_model_name_or_path"):\n'
        "        return []\n"
        '    return [make_violation("LG150", "unnamed", ctx.subject, rank=ctx.spec.config["r"])]\n')
    folder = write_adapter(tmp_path / "old-export", rank=8, base_model=None)
    script = (
        "import lora_guard as lg\n"
        f"report = lg.check_adapters({str(folder)!r}, lg.ServingLimits(max_rank=4))\n"
        "print([(v.code, v.message.split(': ')[-1]) for v in report.violations])\n"
        "print(lg.check_adapter(lg.inspect_adapter(report.ids[0]), lg.ServingLimits(max_rank=4),"
        " skip='LG150').codes())\n"
        "print('LG150' in lg.INVARIANTS)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "[('LG101', 'rank 8 of model.layers.0.self_attn.q_proj is above the served max rank 4.'), "
        "('LG150', 'names no base model (r is 8).')]",
        "['LG101']", "True"]
