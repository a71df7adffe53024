"""The public surface: one list of names, importable, lazily."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import lora_guard as lg

INIT = pathlib.Path(lg.__file__)


def _type_checking_imports() -> dict[str, set[str]]:
    tree = ast.parse(INIT.read_text())
    found: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom)
                found["." + str(stmt.module)] = {alias.name for alias in stmt.names}
    return found


def test_the_three_lists_of_public_names_agree() -> None:
    """Type checkers read the TYPE_CHECKING imports, the runtime reads _PUBLIC, users read
    __all__: they must name the same things from the same modules."""
    assert _type_checking_imports() == {m: set(n) for m, n in lg._PUBLIC.items()}
    assert sorted(lg.__all__) == sorted(lg._HOME)
    assert len(lg.__all__) == len(set(lg.__all__))


def test_every_public_name_resolves_and_is_documented() -> None:
    for name in lg.__all__:
        value = getattr(lg, name)
        assert value is not None
        if callable(value) or isinstance(value, type):
            assert (value.__doc__ or "").strip(), f"lora_guard.{name} has no docstring"


def test_unknown_names_fail_like_a_module() -> None:
    try:
        lg.no_such_guard  # noqa: B018
    except AttributeError as exc:
        assert "no attribute 'no_such_guard'" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def test_errors_are_shown_under_the_package() -> None:
    assert lg.PoolShapeDriftError.__module__ == "lora_guard"
    assert repr(lg.AdapterError("x", code="LG108")).startswith("AdapterError(")


def test_importing_the_package_imports_no_heavy_dependency() -> None:
    code = ("import sys, lora_guard; heavy = {'torch', 'wrapt', 'safetensors', 'peft', "
            "'hypothesis', 'numpy'} & set(sys.modules); print(sorted(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"
