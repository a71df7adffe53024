"""The profiles against the engines' own code: each supported release's fingerprints
(tests/engines/fingerprints/, recorded from its wheel by tools/fingerprints.py) hold every
function that release's rules cite, and every hook lora_guard attaches."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys
from typing import Any

import pytest

from lora_guard._checking.engines import SPECS
from lora_guard.integrations import get

ROOT = pathlib.Path(__file__).resolve().parents[1]
STORE = ROOT / "tests" / "engines" / "fingerprints"
RELEASES = [(engine, v) for engine in ("vllm", "sglang") for v in SPECS[engine].releases]


def _load_tool() -> Any:
    spec = importlib.util.spec_from_file_location("fingerprints", ROOT / "tools" /
                                                  "fingerprints.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fingerprints"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("engine", "version"), RELEASES)
def test_each_release_has_every_function_its_rules_cite(engine: str, version: str) -> None:
    stored = json.loads((STORE / f"{engine}-{version}.json").read_text())
    for rule in SPECS[engine].at(version).rules:
        for source in rule.source.split("; "):
            file, _, names = source.partition(":")
            for name in names.split(", ") if names else [""]:
                key = f"{file}:{name}" if name else file
                assert stored["functions"].get(key), (version, rule.code, key)


@pytest.mark.parametrize(("engine", "version"), RELEASES)
def test_each_hook_attaches_on_each_release(engine: str, version: str) -> None:
    stored = json.loads((STORE / f"{engine}-{version}.json").read_text())
    for patch in get(engine).patches:  # type: ignore[attr-defined]
        hook = stored["hooks"][f"{patch.module}:{patch.path}"]
        assert hook["attaches"] or patch.optional, (version, patch.module, patch.path)


def test_a_rule_bounded_by_a_release_cites_what_that_release_lacks_or_changed() -> None:
    # the bounds are where the code changed: a rule that ends at a release cites a function
    # that is gone there or changed between the release before and it
    tool = _load_tool()
    for engine in ("vllm", "sglang"):
        spec = SPECS[engine]
        for rule in spec.rules:
            for bound in (rule.since, rule.until):
                if bound is None or bound == spec.releases[-1]:
                    continue
                before = spec.releases[spec.releases.index(bound) + 1]
                old = json.loads((STORE / f"{engine}-{before}.json").read_text())
                new = json.loads((STORE / f"{engine}-{bound}.json").read_text())
                cited = [line for line in tool.diff(old, new) if line.startswith("cited")]
                keys = [s.split(":")[0] for s in rule.source.split("; ")]
                assert any(k in line for k in keys for line in cited), (engine, rule)
