"""Numeric parity: the written graph in onnxruntime against the PyTorch eager fp32 reference.

The reference is the original (unstripped) model in eval mode, run on the example inputs and on
``num_random_inputs`` seeded variants of the same shapes; every output of every run is compared.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..context import ParityReport, PrecisionFix, Reports


def run_onnx(path: Path, input_sets: list[dict[str, Any]],
             quantized: bool = False) -> tuple[list[str], list[list[Any]]]:
    """Run every input set through onnxruntime (CPU); returns output names and outputs per set.

    A Q/DQ graph runs with basic optimisations only: onnxruntime's extended level fuses Q/DQ into u8s8
    int8 kernels, which saturate on AVX2 CPUs without VNNI (onnxruntime's quantization docs), an artifact
    of this runtime that the Q/DQ semantics, and ATC, do not have."""
    import onnxruntime as ort

    from ..capture.large_graph import parity_session

    session = parity_session(Path(path))  # a large export's graph: weights not held twice
    if session is None:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if quantized:
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    wanted = [i.name for i in session.get_inputs()]
    missing = [n for n in wanted if n not in input_sets[0]]
    if missing:
        raise ValueError(f"the graph needs inputs {missing} that the parity data does not have")
    names = [o.name for o in session.get_outputs()]
    return names, [session.run(None, {n: feed[n] for n in wanted}) for feed in input_sets]


def parity_report(path: Path, input_sets: list[dict[str, Any]], expected: list[list[Any]],
                  tolerance: Any, reference: str = "pytorch eager fp32 (eval mode)",
                  quantized: bool = False) -> dict[str, Any]:
    """Compare the graph's outputs with ``expected`` per output, worst case over all input sets."""
    import numpy as np

    from .metrics import compare, compare_quantized, merge, reference_problem

    names, actual = run_onnx(path, input_sets, quantized)
    report: dict[str, Any] = {"reference": reference, "runtime": "onnxruntime CPUExecutionProvider",
                              "input_sets": len(input_sets), "tolerance": tolerance.to_dict(), "outputs": []}
    if len(names) != len(expected[0]):
        report.update(passed=False, reason=f"the graph has {len(names)} outputs, the reference {len(expected[0])}")
        return report
    for k, name in enumerate(names):
        per_set = [compare_quantized(np.asarray(actual[s][k]), expected[s][k]) if quantized
                   else compare(np.asarray(actual[s][k]), expected[s][k], tolerance) for s in range(len(input_sets))]
        entry = {"name": name, "shape": list(expected[0][k].shape), **merge(per_set)}
        problem = reference_problem([expected[s][k] for s in range(len(input_sets))])
        if problem:  # a meaningless reference is a failed check with its own message, never a pass
            entry.update(problem, passed=False)
        report["outputs"].append(entry)
    report["passed"] = all(o["passed"] for o in report["outputs"])
    bad = [o for o in report["outputs"] if o.get("reference")]
    if bad and "reason" not in report:
        report["reason"] = f"{bad[0]['name']}: {bad[0]['reason']}"
    return report


class ParityValidator:
    """fp32 parity of the written graph; for atc_ready / om also device-precision parity (the graph
    computed as the NPU will under the precision mode), with localisation and --fix-precision."""

    name = "parity"
    stage = "validate"
    formats = "*"

    def check(self, ctx: Any) -> ParityReport:
        from ..capture.trace_check import apply_verdict

        report = self.check_graph(ctx)
        report["input_sets_from"] = dict(ctx.reports.reference.input_sets)
        other = None
        if ctx.path_input_sets and ctx.path_reference_outputs:  # a traced graph: inputs that take other paths
            feeds = [{n: to_numpy(t) for n, t in s.items()} for s in ctx.path_input_sets]
            other = parity_report(ctx.onnx_path, feeds, ctx.path_reference_outputs, ctx.options.tolerance,
                                  "the stripped module (the traced one) on sign-flipped / scaled examples")
        return ParityReport.from_dict(apply_verdict(report, ctx, other))

    def check_graph(self, ctx: Any) -> dict[str, Any]:
        feeds = [{n: to_numpy(t) for n, t in s.items()} for s in ctx.input_sets]
        # our QAT's lowering, or a graph that arrived quantized (torch.ao / torchao PT2E QAT exported as Q/DQ)
        quantized = bool(ctx.quant_table) or any(n.op_type == "QuantizeLinear" for n in ctx.onnx_model.graph.node)
        reference = "pytorch fake-quant model (eval mode)" if quantized else "pytorch eager fp32 (eval mode)"
        from ..capture.large_graph import sharing

        with sharing(ctx):
            report = parity_report(ctx.onnx_path, feeds, ctx.reference_outputs, ctx.options.tolerance, reference,
                                   quantized=quantized)
        if quantized and ctx.float_reference_outputs:  # the accuracy cost of int8, reported apart from parity
            cost = parity_report(ctx.onnx_path, feeds, ctx.float_reference_outputs, ctx.options.tolerance,
                                 "pytorch float model (eval mode)", quantized=True)
            ctx.reports.quantization_report().int8_vs_float = {
                "outputs": [{k: o[k] for k in ("name", "max_abs", "cosine")} for o in cost.get("outputs", [])]}
        if not ctx.format.device_parity or "outputs" not in report or not report["outputs"]:
            return report
        if ctx.large_graph is not None:
            from ..capture.large_graph import device_parity_note

            return device_parity_note(report, ctx)
        import onnx

        from ..atc.hints import effective_precision

        keep = ctx.reports.atc.get("keep_dtype", {}).get("nodes", [])
        model = onnx.load(str(ctx.onnx_path))
        return with_device_parity(report, model, effective_precision(ctx.options), keep, feeds,
                                  ctx.reference_outputs, ctx.options.tolerance, ctx.module_paths,
                                  fix=ctx.options.fix_precision, reports=ctx.reports, soc=ctx.options.soc_version)


def with_device_parity(report: dict[str, Any], model: Any, mode: str, keep: list[str], feeds: list, expected: list,
                       tolerance: Any, paths: dict[str, str], fix: bool = False,
                       reports: Reports | None = None, soc: str | None = None,
                       overflow: str | None = None) -> dict[str, Any]:
    """Add the device-precision run to an fp32 parity report; the verdict needs both. ``soc``: the target SoC,
    whose overflow mode the emulation follows (``overflow`` replaces it: what an older bundle recorded)."""
    from ..options import ExportOptions, soc_model
    from .device_parity import device_report, fix_precision
    from .precision import emulation_for

    model_of_soc = soc_model(soc or ExportOptions.soc_version)
    device_model = {**model_of_soc.to_dict(), "overflow_mode": overflow or model_of_soc.overflow}
    if emulation_for(mode).reduces == "none":
        report["precision"] = {"mode": mode, "emulated": emulation_for(mode).description, "keep_dtype": keep,
                               "device_model": device_model}
        return report
    names = [o["name"] for o in report["outputs"]]
    args = (feeds, expected, names, tolerance.device_policy(), paths)
    if fix:
        device, kept = fix_precision(model, mode, keep, *args, overflow=device_model["overflow_mode"])
        if reports is not None:
            fixed = device["precision"]["fix"]
            reports.precision_fix = PrecisionFix(list(fixed["kept"]), bool(fixed["fixed"]), bool(device["passed"]))
        device["fixed_by_keep_dtype"] = kept
    else:
        device = device_report(model, mode, keep, *args, overflow=device_model["overflow_mode"])
    device["precision"]["device_model"] = device_model
    graph = {k: report[k] for k in ("passed", "outputs", "tolerance")}
    report.update(outputs=device["outputs"], precision=device["precision"], graph_fp32=graph,
                  device={"passed": device["passed"], "tolerance": device.get("tolerance"),
                          "outputs": device["outputs"]},
                  passed=bool(graph["passed"] and device["passed"]))
    for key in ("first_divergence", "fixed_by_keep_dtype"):
        if key in device:
            report[key] = device[key]
    return report


def to_numpy(t: Any) -> Any:
    return t.detach().cpu().numpy()
