"""What export and inspect say about --fix-precision on a multi-graph bundle: per component, the ops and modules it
kept in fp32, their share of that component's FLOPs and the files holding the set (the top-level manifest's
``precision_fix``, bundle/multi_precision.py), or why it could not fix it; and, for a pipeline, the end-to-end
device check with the fix against the same loop without it. Every line is escaped for the terminal."""
from __future__ import annotations

from typing import Any

from ..safe_text import terminal


def component_fix_line(fix: dict[str, Any]) -> str:
    """One component's ``precision_fix`` entry as a line."""
    if not fix.get("fixed"):
        return f"--fix-precision cannot fix it: {terminal(str(fix.get('reason')))}"
    modules = ", ".join(map(terminal, fix.get("modules") or [])) or "single nodes (no whole module)"
    files = " + ".join(terminal(str(fix[k])) for k in ("keep_dtype", "customize_dtypes") if fix.get(k))
    return (f"--fix-precision kept {fix['kept_ops']} of {fix['graph_ops']} ops in fp32 "
            f"({fix['kept_flops_share']:.1%} of its FLOPs): {modules} ({files})")


def fix_rerun_line(e2e: Any) -> str | None:
    """The end-to-end device check rerun with --fix-precision's keep sets, against the loop without them; None
    when the fix kept nothing (or the bundle is no pipeline)."""
    device = e2e.get("device") if isinstance(e2e, dict) else None
    before = device.get("before_fix") if isinstance(device, dict) else None
    if not isinstance(before, dict):
        return None
    fixed = ", ".join(map(terminal, before.get("fixed_components") or []))
    return (f"end-to-end check on the device emulation: with --fix-precision {_device_said(device)}; without its "
            f"keep sets ({fixed}) {_device_said(before)}")


def _device_said(entry: dict[str, Any]) -> str:
    bad = {k: v for k, v in (entry.get("nonfinite") or {}).items() if v}
    nan = f", NaN/Inf in {', '.join(f'{terminal(k)} ({v})' for k, v in bad.items())}" if bad else ""
    verdict = "passed" if entry.get("passed") else "FAILED"
    distance = entry.get("cosine_distance")
    return f"{verdict} (cosine distance {'n/a' if distance is None else format(distance, '.3g')}{nan})"
