"""--fix-precision across a multi-graph bundle: the top-level manifest's ``precision_fix``, one entry per component
whose own device parity needed a keep set (or could not be fixed), taken from that component's manifest
(``parity.precision.fix``: what validators/fix_precision.py found): whether it is fixed, how many of its ops stay
fp32 and their share of its FLOPs, the modules kept whole (named ``COMPONENT.path``, the form a pipeline's
``atc_hints`` take) and the files that hold the set (``keep_dtype.cfg``, which convert.sh uses, and
``customize_dtypes.fix.cfg``, the same set in Huawei's customize_dtypes form). Absent when no component ran the
fix; ``{}`` when it ran and no component needed it. validate re-derives it from the components' manifests."""
from __future__ import annotations

from typing import Any

from ..atc.precision_cfg import FIX_CUSTOMIZE

COMPONENTS_DIR = "components"  # multi_write.COMPONENTS_DIR (not imported: multi_write imports this module)
GRAPH_ROOT = "model"  # the attribute a component's graph wrapper holds its module under (diffusion/graphs.py)


def qualified(component: str, path: str) -> str:
    """A module path inside a component's graph (``model.encoder.block.0``) as ``text_encoder_3.encoder.block.0``."""
    if path == GRAPH_ROOT:
        return component
    inner = path[len(GRAPH_ROOT) + 1:] if path.startswith(GRAPH_ROOT + ".") else path
    return f"{component}.{inner}"


def component_fix(name: str, own: dict[str, Any]) -> dict[str, Any] | None:
    """The ``precision_fix`` entry of component ``name`` from its manifest ``own``; None when its fix kept nothing
    and it passes, or when the fix did not run on it."""
    parity = own.get("parity") if isinstance(own.get("parity"), dict) else {}
    precision = parity.get("precision") if isinstance(parity.get("precision"), dict) else {}
    fix = precision.get("fix")
    if not isinstance(fix, dict) or (fix.get("fixed") is True and not fix.get("kept")):
        return None
    files = own.get("files") if isinstance(own.get("files"), dict) else {}
    entry: dict[str, Any] = {"fixed": fix.get("fixed") is True, "kept_ops": fix.get("kept_ops"),
                             "graph_ops": fix.get("graph_ops"), "kept_flops_share": fix.get("kept_flops_share"),
                             "modules": [qualified(name, str(p)) for p in fix.get("kept_modules") or []]}
    for key, rel in (("keep_dtype", "atc/keep_dtype.cfg"), ("customize_dtypes", f"atc/{FIX_CUSTOMIZE}")):
        if rel in files:
            entry[key] = f"{COMPONENTS_DIR}/{name}/{rel}"
    if fix.get("reason"):
        entry["reason"] = str(fix["reason"])
    return entry


def precision_fixes(owns: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """``{component: entry}`` over the components' manifests ``owns`` (in bundle order), or None when none ran the
    fix (exported without --fix-precision, or with --no-validate)."""
    ran = False
    out: dict[str, Any] = {}
    for name, own in owns.items():
        precision = ((own.get("parity") or {}).get("precision") or {}) if isinstance(own.get("parity"), dict) else {}
        ran = ran or isinstance(precision.get("fix"), dict)
        entry = component_fix(name, own)
        if entry is not None:
            out[name] = entry
    return out if ran else None


def fix_problems(manifest: dict[str, Any], owns: dict[str, dict[str, Any]]) -> list[str]:
    """``precision_fix`` against the one the components' manifests give (every component readable)."""
    expected = precision_fixes({c["name"]: owns[c["name"]] for c in manifest["components"]})
    if manifest.get("precision_fix") == expected:
        return []
    if expected is None:
        return ["manifest.json precision_fix: recorded, but no component's manifest records a --fix-precision run"]
    return ["manifest.json precision_fix: not what the components' manifests record of --fix-precision "
            "(parity.precision.fix of each)"]
