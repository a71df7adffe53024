"""Release drift, found by a tool: fingerprints of the engine code lora_guard cites.

Every engine function a profile rule cites (`lora_guard._checking.engines.SPECS`, each rule's
``source``) and every function an integration hooks (`INTEGRATION.patches`) is fingerprinted
per release: a hash of its syntax tree (comments and formatting do not count), and for hooks
their parameters. The LoRA flags are fingerprinted too: each field of the engine's LoRA
config class with its type (choices) and default. The fingerprints of each supported release
are kept in tests/engines/fingerprints/ENGINE-VERSION.json.

    python tools/fingerprints.py record WHEEL...        # store the fingerprints of releases
    python tools/fingerprints.py diff WHEEL [--against VERSION]
        # what changed from the stored release (default: the newest stored one before it):
        # cited functions changed, added or gone; LoRA flags whose names, types or defaults
        # changed; hooks whose targets moved or whose parameters changed. Exit 1 when any.
    python tools/fingerprints.py installed ENGINE       # the installed release against its
        # stored fingerprints (exit 1 when they differ; tests/engines/test_fingerprints.py)

A wheel is read as a zip (nothing is installed or imported): ``pip download --no-deps
vllm==0.35.0`` and diff it to see what a new release changes before writing its profile.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.metadata
import importlib.util
import json
import pathlib
import re
import sys
import zipfile
from collections.abc import Callable
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
STORE = ROOT / "tests" / "engines" / "fingerprints"
sys.path.insert(0, str(ROOT / "src"))

from lora_guard._checking.engines import SPECS, version_key  # noqa: E402

# The class that holds each engine's LoRA flags (its fields are the flags' dests), by the
# files that have held it: the first one found in a release is read.
FLAG_CLASSES = {
    "vllm": [("vllm/config/lora.py", "LoRAConfig")],
    "sglang": [("sglang/srt/arg_groups/fields/lora.py", "Lora"),
               ("sglang/srt/server_args.py", "ServerArgs")],
}
FLAG_FIELDS = re.compile(r"lora|^max_loras|^target_modules$")

Reader = Callable[[str], "str | None"]


def wheel_reader(wheel: pathlib.Path) -> tuple[str, str, Reader]:
    """(engine, version, read(path) -> text or None) of a wheel file."""
    name, version = wheel.name.split("-")[:2]
    archive = zipfile.ZipFile(wheel)
    names = set(archive.namelist())

    def read(path: str) -> str | None:
        return archive.read(path).decode() if path in names else None
    return name, version, read


def installed_reader(engine: str) -> tuple[str, str, Reader]:
    """The installed release of ``engine``, read from its files (not imported)."""
    spec = importlib.util.find_spec(engine)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{engine} is not installed")
    site = pathlib.Path(next(iter(spec.submodule_search_locations))).parent

    def read(path: str) -> str | None:
        file = site / path
        return file.read_text() if file.is_file() else None
    return engine, importlib.metadata.version(engine), read


def _cited(engine: str) -> list[str]:
    """Every ``file:Qualified.name`` (or ``file``) a rule of any release cites."""
    found: dict[str, None] = {}
    for rule in SPECS[engine].rules:
        for source in rule.source.split("; "):
            file, _, names = source.partition(":")
            for name in names.split(", ") if names else [""]:
                found[f"{file}:{name}" if name else file] = None
    return sorted(found)


def _hooks(engine: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """``module:path`` -> (file, params) of each hook of the engine's integration."""
    from lora_guard.integrations import get

    integration = get(engine)
    return {f"{p.module}:{p.path}": (p.module.replace(".", "/") + ".py", tuple(p.params))
            for p in integration.patches}  # type: ignore[attr-defined]


def _node(tree: ast.Module, qualname: str) -> ast.AST | None:
    body: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(
            n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part), None)
        if node is None:
            node = next((n for n in body if isinstance(n, (ast.Assign, ast.AnnAssign)) and part
                         in [t.id for t in (n.targets if isinstance(n, ast.Assign) else
                                            [n.target]) if isinstance(t, ast.Name)]), None)
            return node
        body = getattr(node, "body", [])
    return node


def _digest(node: ast.AST) -> str:
    return hashlib.sha256(ast.dump(node, include_attributes=False).encode()).hexdigest()[:16]


def _params(node: ast.AST | None) -> list[str] | None:
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    args = node.args
    return [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]


def _flag_type(annotation: ast.expr) -> str:
    """A field's type and parser choices: ``A[T, "help", Arg(choices=...), NS(...)]`` (sglang)
    -> ``T choices=... action=...``; the help text and namespace do not count."""
    if not (isinstance(annotation, ast.Subscript) and isinstance(annotation.value, ast.Name)
            and annotation.value.id in ("A", "Annotated")
            and isinstance(annotation.slice, ast.Tuple)):
        return ast.unparse(annotation)
    first, *rest = annotation.slice.elts
    parts = [ast.unparse(first)]
    for extra in rest:
        if isinstance(extra, ast.Call) and isinstance(extra.func, ast.Name) and \
                extra.func.id == "Arg":
            parts += [f"{k.arg}={ast.unparse(k.value)}" for k in extra.keywords
                      if k.arg in ("choices", "action", "nargs", "type")]
    return " ".join(parts)


def _flags(engine: str, read: Reader) -> dict[str, dict[str, str]]:
    for file, cls in FLAG_CLASSES[engine]:
        text = read(file)
        if text is None:
            continue
        tree = ast.parse(text)
        node = _node(tree, cls)
        if not isinstance(node, ast.ClassDef):
            continue
        aliases = {t.id: ast.unparse(n.value) for n in tree.body if isinstance(n, ast.Assign)
                   for t in n.targets if isinstance(t, ast.Name)}
        flags = {}
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and \
                    FLAG_FIELDS.search(item.target.id):
                kind = _flag_type(item.annotation)
                for alias, value in aliases.items():
                    kind = re.sub(rf"\b{alias}\b", value, kind)
                flags[item.target.id] = {
                    "type": kind, "default": ast.unparse(item.value) if item.value else ""}
        return {"source": f"{file}:{cls}", **flags}  # type: ignore[dict-item]
    return {}


def fingerprint(engine: str, version: str, read: Reader) -> dict[str, Any]:
    trees: dict[str, ast.Module | None] = {}

    def tree(file: str) -> ast.Module | None:
        if file not in trees:
            text = read(file)
            trees[file] = None if text is None else ast.parse(text)
        return trees[file]

    functions: dict[str, str | None] = {}
    for cited in _cited(engine):
        file, _, name = cited.partition(":")
        parsed = tree(file)
        node = parsed if parsed is not None and not name else (
            None if parsed is None else _node(parsed, name))
        functions[cited] = None if node is None else _digest(node)
    hooks: dict[str, dict[str, Any]] = {}
    for key, (file, wanted) in _hooks(engine).items():
        parsed = tree(file)
        node = None if parsed is None else _node(parsed, key.split(":", 1)[1])
        params = _params(node)
        hooks[key] = {"params": params, "digest": None if node is None else _digest(node),
                      "attaches": params is not None and tuple(params[:len(wanted)]) == wanted}
    return {"engine": engine, "version": version, "functions": functions, "hooks": hooks,
            "flags": _flags(engine, read)}


def stored(engine: str, version: str) -> dict[str, Any] | None:
    path = STORE / f"{engine}-{version}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _previous(engine: str, version: str) -> str | None:
    versions = sorted((p.stem.split("-", 1)[1] for p in STORE.glob(f"{engine}-*.json")),
                      key=version_key)
    before = [v for v in versions if version_key(v) < version_key(version)]
    return before[-1] if before else (versions[-1] if versions else None)


def diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What changed from ``old`` to ``new``, one line each."""
    return [*_function_lines(old, new), *_flag_lines(old["flags"], new["flags"]),
            *_hook_lines(old, new)]


def _function_lines(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    lines = []
    for key in sorted(set(old["functions"]) | set(new["functions"])):
        a, b = old["functions"].get(key), new["functions"].get(key)
        if a != b:
            what = "gone" if b is None else "added" if a is None else "changed"
            lines.append(f"cited function {what}: {key}")
    return lines


def _flag_lines(oldf: dict[str, Any], newf: dict[str, Any]) -> list[str]:
    lines = []
    if oldf.get("source") != newf.get("source"):
        lines.append(f"LoRA flags moved: {oldf.get('source')} -> {newf.get('source')}")
    for name in sorted((set(oldf) | set(newf)) - {"source"}):
        a, b = oldf.get(name), newf.get(name)
        if a is None or b is None:
            lines.append(f"LoRA flag {'added' if a is None else 'removed'}: {name}")
            continue
        lines += [f"LoRA flag {name}: {part} {a[part]} -> {b[part]}"
                  for part in ("type", "default") if a[part] != b[part]]
    return lines


def _hook_lines(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    lines = []
    for key in sorted(set(old["hooks"]) & set(new["hooks"])):  # not hooks lora_guard changed
        a, b = old["hooks"][key], new["hooks"][key]
        if b["attaches"] and not a["attaches"]:
            lines.append(f"hook target appeared: {key}")
        elif not b["attaches"] and a["attaches"]:
            lines.append(f"hook target moved or its parameters changed: {key} "
                         f"(params {a['params']} -> {b['params']})")
        elif a["digest"] != b["digest"]:
            lines.append(f"hook target changed: {key}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    record = sub.add_parser("record", help="store the fingerprints of the given wheels")
    record.add_argument("wheels", nargs="+", type=pathlib.Path)
    change = sub.add_parser("diff", help="what a wheel changes against a stored release")
    change.add_argument("wheel", type=pathlib.Path)
    change.add_argument("--against", help="stored release (default: the one before)")
    here = sub.add_parser("installed", help="the installed release against its stored one")
    here.add_argument("engine", choices=sorted(FLAG_CLASSES))
    args = parser.parse_args(argv)
    if args.command == "record":
        STORE.mkdir(parents=True, exist_ok=True)
        for wheel in args.wheels:
            engine, version, read = wheel_reader(wheel)
            data = fingerprint(engine, version, read)
            (STORE / f"{engine}-{version}.json").write_text(json.dumps(data, indent=1) + "\n")
            print(f"recorded {engine} {version}")
        return 0
    if args.command == "diff":
        engine, version, read = wheel_reader(args.wheel)
        against = args.against or _previous(engine, version)
        old = None if against is None else stored(engine, against)
        if old is None:
            raise SystemExit(f"no stored fingerprints of {engine} {against}")
        lines = diff(old, fingerprint(engine, version, read))
        print(f"{engine} {against} -> {version}: {len(lines)} change(s)")
        print("\n".join(f"  {line}" for line in lines))
        return 1 if lines else 0
    engine, version, read = installed_reader(args.engine)
    old = stored(engine, version)
    if old is None:
        print(f"no stored fingerprints of {engine} {version}: record them from its wheel")
        return 1
    lines = diff(old, fingerprint(engine, version, read))
    print(f"{engine} {version} installed vs stored: {len(lines)} difference(s)")
    print("\n".join(f"  {line}" for line in lines))
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
