"""``lora-guard doctor``: for each installed engine (vLLM, sglang, lmdeploy, PEFT), the
release found, whether lora_guard supports it, the profile its guards check with, and each hook
attached or missing; a module that does not import is said once, with its error, not as N
missing hooks.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

DOCTOR_ENGINES = ("vllm", "sglang", "lmdeploy", "peft")
"""The integrations doctor reports on, in order."""


def _profile_label(engine: str, version: str | None) -> str | None:
    """The profile the integration's guards use for the installed ``version``."""
    from lora_guard._checking.engines import SPECS, nearest_release

    if version is None or engine not in SPECS:
        return None
    return f"{engine}=={nearest_release(engine, version)}"


def _import_groups(errors: Mapping[str, str]) -> dict[str, list[str]]:
    """Error text -> the modules it stops from importing (one cause said once)."""
    groups: dict[str, list[str]] = {}
    for module, error in errors.items():
        groups.setdefault(error, []).append(module)
    return groups


def _hint(error: str) -> str:
    if error.startswith("ModuleNotFoundError: No module named "):
        name = error.rsplit(" ", 1)[-1].strip("'\"").split(".")[0]
        return f"install {name} into this environment, then run lora-guard doctor again"
    return "fix that import error, then run lora-guard doctor again"


def diagnose() -> dict[str, Any]:
    """Each engine's report, as `lora-guard doctor --format json` prints it.

    Example:
        >>> from lora_guard._frontends.doctor import diagnose
        >>> data = diagnose()
        >>> sorted(data), sorted(data["engines"])
        (['engines', 'ok'], ['lmdeploy', 'peft', 'sglang', 'vllm'])
    """
    from lora_guard.integrations import get

    engines: dict[str, Any] = {}
    failing = []
    for name in DOCTOR_ENGINES:
        integration = get(name)
        report = integration.diagnose()  # type: ignore[attr-defined]
        if report is None:
            engines[name] = None
            continue
        data = report.as_dict()
        data["profile"] = _profile_label(name, report.version)
        # an optional hook whose target this release does not have (sglang's Inkling V2 sink
        # before 0.5.23) is not a failure: said apart, not as missing
        optional = {f"{p.module}:{p.path}" for p in integration.patches  # type: ignore[attr-defined]
                    if p.optional and p.module not in report.import_errors}
        data["absent"] = [hook for hook in data["missing"] if hook in optional]
        data["missing"] = {h: why for h, why in data["missing"].items() if h not in optional}
        engines[name] = data
        if report.supported and (data["missing"] or report.pending or report.import_errors):
            failing.append(name)
    return {"engines": engines, "ok": not failing}


def _text(data: Mapping[str, Any]) -> list[str]:
    lines: list[str] = []
    for name, r in data["engines"].items():
        if r is None:
            lines.append(f"{name}: not installed")
            continue
        release = f"{name} {r['version']}"
        state = "supported" if r["supported"] else \
            "NOT supported (hooks attach only where the signatures match)"
        profile = f"; guards check with the {r['profile']} profile" if r["profile"] else ""
        lines.append(f"{release}: {state}; tested: {name} {r['supported_range']}{profile}")
        lines += [f"  attached  {hook} ({release})" for hook in r["attached"]]
        hidden = set(r["import_errors"])
        for error, modules in _import_groups(r["import_errors"]).items():
            hooks = [h for h in r["missing"] if h.split(":", 1)[0] in modules]
            lines.append(f"  DOES NOT IMPORT  {', '.join(modules)}: {error}")
            lines.append(f"    so {len(hooks)} hook{'s' * (len(hooks) != 1)} cannot be "
                         f"checked on {release}: {_hint(error)}")
        lines += [f"  MISSING   {hook} ({release}): {why}" for hook, why in r["missing"].items()
                  if hook.split(":", 1)[0] not in hidden]
        lines += [f"  absent    {hook} (optional: not in {release})"
                  for hook in r.get("absent", ())]
        lines += [f"  pending   {module} (not imported)" for module in r["pending"]]
    failing = [n for n, r in data["engines"].items() if r is not None and r["supported"] and (
        r["missing"] or r["pending"] or r["import_errors"])]
    if failing:
        lines.append(f"lora-guard doctor: {', '.join(failing)} supported but missing hooks: "
                     "lora_guard does not guard those paths; report it with this output.")
    return lines


def run(output: str) -> int:
    """Print the report (``text`` or ``json``); 1 when a supported engine misses a hook."""
    data = diagnose()
    if output == "json":
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        sys.stdout.write("\n".join(_text(data)) + "\n")
    return 0 if data["ok"] else 1
