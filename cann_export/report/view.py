"""What report.html shows, as one JSON-safe dict built from a manifest (the bundle's own record), the
per-layer curve and the graph (for the source line of every node a finding names)."""
from __future__ import annotations

import json
import shlex
from typing import Any

from ..graph import module_paths


def node_places(model: Any) -> dict[str, dict[str, str | None]]:
    """``{node name: {"module", "source"}}`` from the stamps the capture stage left in the graph."""
    out = {}
    for node in model.graph.node:
        props = {p.key: p.value for p in node.metadata_props}
        if node.name:
            out[node.name] = {"module": props.get(module_paths.KEY), "source": props.get(module_paths.SOURCE)}
    return out


def build(manifest: dict[str, Any], layers: dict[str, Any] | None, places: dict[str, dict[str, str | None]],
          title: str, model_name: str | None = None, component: str | None = None) -> dict[str, Any]:
    """The view; ``model_name``: the model the page names (default ``title``), ``component``: the graph of a
    multi-graph bundle it shows (None for a single graph)."""
    parity = manifest.get("parity") or {}
    device = parity.get("device") or {}
    fp32 = parity.get("fp32") or {}
    device_rows = {o["name"]: o for o in device.get("outputs", [])}
    outputs = [{"name": o["name"], "fp32": _metrics(o), "device": _metrics(device_rows.get(o["name"]))}
               for o in fp32.get("outputs", parity.get("outputs", []))]
    atc = manifest.get("atc") or {}
    command = atc.get("command")
    first = parity.get("first_divergence")
    lint = []
    for name, report in sorted((manifest.get("lint") or {}).items()):
        for f in report.get("findings") or []:
            place = places.get(f.get("node") or "", {})
            lint.append({"validator": name, "severity": f.get("severity"), "rule": f.get("rule"),
                         "node": f.get("node"), "op_type": f.get("op_type"),
                         "module": f.get("module") or place.get("module"), "source": place.get("source"),
                         "message": f.get("message")})
    precision = parity.get("precision") or {}
    return {
        "title": title,
        "model_name": model_name or title,
        "component": component,
        "format": manifest.get("format"),
        "verdict": {"validated": bool(parity.get("validated")), "passed": bool(parity.get("passed")),
                    "fp32": fp32.get("passed"), "device": device.get("passed") if device else None,
                    "reason": parity.get("reason")},
        "outputs": outputs,
        "shapes": _shape_rows(parity),
        "precision": {"mode": precision.get("mode"), "keep_dtype": precision.get("keep_dtype") or [],
                      "device_model": precision.get("device_model") or {}, "emulated": precision.get("emulated")},
        "first_divergence": first,
        "layers": layers,
        "lint": lint,
        "atc_command": shlex.join(str(c) for c in command) if isinstance(command, list) else None,
        "capture": (manifest.get("capture") or {}).get("attempts") or [],
        "warnings": manifest.get("warnings") or {},
        "model": {k: (manifest.get("model") or {}).get(k) for k in ("inputs", "outputs", "opset", "exporter")},
    }


def _shape_rows(parity: dict[str, Any]) -> list[dict[str, Any]]:
    """Each judged shape, and whether the bundle stores its input sets (``--stored-parity-mib`` leaves the
    largest out: their row is the export's verdict, which validate and ``cann-export report`` cannot re-derive)."""
    stored = parity.get("stored") if isinstance(parity.get("stored"), dict) else {}
    left = {json.dumps(g.get("shape"), sort_keys=True) for g in stored.get("left_out") or []
            if isinstance(g, dict) and not g.get("partial")}
    return [{"shape": r.get("shape"), "fp32": r.get("fp32"), "device": r.get("device"), "passed": r.get("passed"),
             "stored": json.dumps(r.get("shape"), sort_keys=True) not in left}
            for r in parity.get("shapes") or [] if isinstance(r, dict)]


def _metrics(row: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {k: row.get(k) for k in ("max_abs", "max_rel", "cosine", "passed", "reason") if k in row}
