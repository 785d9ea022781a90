"""The manifest of an artifact: what it holds, where it came from, and how it validated."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .digests import file_table

SCHEMA = "cann-export/manifest/1"
__all__ = ["SCHEMA", "build_manifest", "dumps", "file_table", "summarize_parity"]


def build_manifest(ctx: Any, root: Path | None) -> dict[str, Any]:
    from .onnx_utils import describe_values, op_histogram

    model = ctx.onnx_model
    parity = ctx.reports.get("parity")
    manifest = {
        "schema": SCHEMA,
        "format": ctx.options.export_format,
        "model": {
            "file": ctx.onnx_path.name if ctx.onnx_path else None,
            "opset": ctx.capture.get("opset"),
            "opset_requested": ctx.options.opset,
            "exporter": ctx.capture.get("exporter"),
            "inputs": describe_values(model.graph.input),
            "outputs": describe_values(model.graph.output),
            "ops": op_histogram(model),
        },
        "metadata": dict(ctx.metadata),
        "provenance": dict(ctx.provenance),
        "atc": dict(ctx.reports.get("atc", {})),
        "capture": ctx.capture,
        "optimize": ctx.optimize,
        "parity": {**summarize_parity(parity), **({"reference_device": ctx.reports["reference"]["device"]}
                                                   if "reference" in ctx.reports else {})},
        **({"quantization": ctx.reports["quantization"]} if "quantization" in ctx.reports else {}),
        "lint": {name: r for name, r in ctx.reports.items() if name in ctx.lint_reports},
        "warnings": dict(ctx.reports.get("warnings", {})),
        "stage_seconds": dict(ctx.stage_seconds),
    }
    if root is not None:
        manifest["files"] = file_table(root)
    return manifest


def summarize_parity(report: dict[str, Any] | None) -> dict[str, Any]:
    if report is None:
        return {"validated": False}
    keep = ("name", "max_abs", "max_rel", "cosine", "passed")
    return {"validated": True, "passed": report["passed"], "reference": report.get("reference"),
            "tolerance": report.get("tolerance"), "input_sets": report.get("input_sets"),
            "outputs": [{k: o[k] for k in keep if k in o} for o in report.get("outputs", [])],
            **{k: report[k] for k in ("reason", "precision", "first_divergence", "fixed_by_keep_dtype")
               if report.get(k) is not None},
            **({"graph_fp32_passed": report["graph_fp32"]["passed"]} if "graph_fp32" in report else {})}


def dumps(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False, default=str, allow_nan=True) + "\n"
