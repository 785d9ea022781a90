"""The manifest of an artifact: what it holds, where it came from, and how it validated."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..fs.digests import file_table

if TYPE_CHECKING:
    from ..context import ExportContext

SCHEMA = "cann-export/manifest/1"
__all__ = ["SCHEMA", "build_manifest", "dumps", "file_table", "summarize_parity", "write_manifest"]


def build_manifest(ctx: ExportContext, root: Path | None) -> dict[str, Any]:
    from ..graph.onnx_helpers import describe_values, op_histogram
    from ..validators.cost import checks_record

    model, reports = ctx.onnx_model, ctx.reports
    parity = reports.parity.to_dict() if reports.parity is not None else None
    reference = {"reference_device": reports.reference.device} if reports.reference.device is not None else {}
    if reports.reference.row_reuse is not None:  # the batch sizes' eager rows shared, or why not (inputs/row_reuse)
        reference["reference_reuse"] = dict(reports.reference.row_reuse)
    manifest = {
        "schema": SCHEMA,
        "format": ctx.options.export_format,
        "model": {
            "file": ctx.onnx_path.name if ctx.onnx_path else None,
            "opset": ctx.capture.opset,
            "opset_requested": ctx.options.opset,
            "exporter": ctx.capture.exporter,
            "inputs": describe_values(model.graph.input),
            "outputs": describe_values(model.graph.output),
            "ops": op_histogram(model),
            **({"static_axes": fixed} if (fixed := static_axes(ctx, describe_values(model.graph.input))) else {}),
        },
        "metadata": dict(ctx.metadata),
        "provenance": dict(ctx.provenance),
        "atc": dict(reports.atc),
        "capture": ctx.capture.to_dict(),
        "optimize": ctx.optimize,
        "parity": {**summarize_parity(parity), **reference,
                   **({"coverage": ctx.options.parity_coverage} if (parity or {}).get("shapes") else {}),
                   **({"checks": checks} if ctx.options.validate  # (not the trace gate's run without validation)
                      and (checks := checks_record(ctx.stage_seconds, ctx.stage_peak_mib)) else {})},
        **({"quantization": reports.quantization.to_dict()} if reports.quantization is not None else {}),
        "lint": dict(reports.lint),
        **({"sandbox": dict(reports.sandbox)} if reports.sandbox is not None else {}),
        "warnings": reports.warnings.to_dict(),
        "stage_seconds": dict(ctx.stage_seconds),
    }
    if root is not None:
        manifest["files"] = file_table(root)
    return manifest


def static_axes(ctx: ExportContext, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The loader's axes kept fixed, and why (hf/image_sides.py), where the written graph has them fixed."""
    shapes = {i["name"]: i["shape"] for i in inputs}
    loaded = getattr(ctx, "loaded", None)
    notes = (loaded.extras.get("static_axes") if loaded is not None else None) or []
    return [note for note in notes if note.get("input") in shapes and all(
        isinstance(shapes[note["input"]][int(a)], int) for a in note.get("axes", {}) if int(a) < len(
            shapes[note["input"]]))]


def write_manifest(ctx: ExportContext, staging: Path) -> dict[str, Any]:
    """Build the manifest of the bundle staged in ``staging`` (its file table lists every file there, so
    write it last) and write it as ``manifest.json``: what ``validate`` and ``inspect`` read. Sets and
    returns ``ctx.manifest``."""
    from ..fs import atomic

    ctx.manifest = build_manifest(ctx, staging)
    atomic.write_text(staging / "manifest.json", dumps(ctx.manifest))
    return ctx.manifest


_FP32_TOL = ("atol", "rtol", "min_cosine")
_INT8_TOL = ("int8_rms_steps", "int8_max_steps", "int8_min_cosine")


def summarize_parity(report: dict[str, Any] | None) -> dict[str, Any]:
    """The parity verdict for --json and the manifest: ``fp32`` (the graph in onnxruntime against the
    reference, with the fp32 tolerance) and, for device formats, ``device`` (the emulated device
    precision, with its own tolerance) kept apart; top-level ``outputs`` / ``tolerance`` are the fp32 ones."""
    if report is None:
        return {"validated": False}
    keep = ("name", "max_abs", "max_rel", "cosine", "max_steps", "rms_steps", "passed", "failed_sets", "reference",
            "reason")

    def rows(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: o[k] for k in keep if k in o} for o in outputs]

    graph = report.get("graph_fp32") or report
    tol = graph.get("tolerance") or report.get("tolerance") or {}
    outputs = graph.get("outputs", [])
    quantized = any("rms_steps" in o for o in outputs)  # a Q/DQ graph: judged in 8-bit steps
    fp32_tol = {k: tol[k] for k in (_INT8_TOL if quantized else _FP32_TOL) if k in tol}
    passed = graph["passed"] if "graph_fp32" in report else bool(outputs) and all(o["passed"] for o in outputs)
    fp32 = {"passed": bool(passed), "tolerance": fp32_tol, "outputs": rows(outputs)}
    summary = {"validated": True, "passed": report["passed"], "reference": report.get("reference"),
               "input_sets": report.get("input_sets"), "tolerance": fp32_tol, "outputs": fp32["outputs"], "fp32": fp32,
               **{k: report[k] for k in ("input_sets_from", "reason", "precision", "first_divergence",
                                         "fixed_by_keep_dtype", "trace_specialized", "failing_sets", "shapes",
                                         "shape_budget", "stored")
                  if report.get(k) is not None},
               **({"probes": {k: report["probes"][k] for k in ("passed", "input_sets")}}
                  if report.get("probes") else {}),
               **({"graph_fp32_passed": report["graph_fp32"]["passed"]} if "graph_fp32" in report else {})}
    device = report.get("device")
    if device is not None:
        precision = report.get("precision") or {}
        summary["device"] = {"passed": bool(device.get("passed")), "mode": precision.get("mode"),
                             **({"device_model": precision["device_model"]} if "device_model" in precision else {}),
                             "tolerance": device.get("tolerance") or {}, "outputs": rows(device.get("outputs", []))}
    return summary


def dumps(data: Any) -> str:
    """Strict JSON (non-finite numbers as null + a ``non_finite`` flag, no ANSI escapes)."""
    from ..fs.jsonio import dump_file_text

    return dump_file_text(data)
