"""The strip and optimize stages: module passes, graph passes and onnxsim (kept only when outputs match)."""
from __future__ import annotations

from typing import Any

from .. import errors
from ..capture import large_graph as large_model
from ..hooks import manager as plugins
from ..context import ExportContext


def strip(ctx: ExportContext) -> str | None:
    passes = plugins.registry().passes()
    ran = []
    for p in passes:
        if hasattr(p, "apply_module"):
            ctx.model = p.apply_module(ctx.model, ctx)
            ran.append(p.name)
    ctx.reports.strip.module_passes = ran
    return ", ".join(ran)


def optimize(ctx: ExportContext) -> str | None:
    """Graph passes, then onnxsim; the simplified graph is kept only if it loads and matches."""
    from ..capture.onnx_utils import weights_bytes

    for p in plugins.registry().passes():
        if hasattr(p, "apply_graph"):
            ctx.onnx_model = p.apply_graph(ctx.onnx_model, ctx)
    if large_model.state(ctx) is not None:  # the graph's weights are on disk: no copy of them in memory
        ctx.optimize["onnxsim"] = large_model.optimize_note(ctx.large_graph)
        _final_graph_passes(ctx)
        return "onnxsim skipped (external data)"
    if not ctx.options.simplify:
        ctx.optimize["onnxsim"] = "disabled"
        _final_graph_passes(ctx)
        return "onnxsim disabled"
    if weights_bytes(ctx.onnx_model) > 1_900_000_000:
        ctx.optimize["onnxsim"] = "skipped: graph past the 2 GB protobuf limit"
        _final_graph_passes(ctx)
        return "onnxsim skipped (> 2 GB)"
    verdict, simplified = _simplify(ctx)
    ctx.optimize["onnxsim"] = verdict
    if simplified is not None:
        ctx.onnx_model = simplified
    _final_graph_passes(ctx)
    return "simplified" if simplified is not None else f"kept unsimplified graph ({verdict})"


def _final_graph_passes(ctx: ExportContext) -> None:
    """Passes that must see the simplified graph (onnxsim would fold their work away), e.g. Q/DQ lowering."""
    for p in plugins.registry().passes():
        if hasattr(p, "apply_final_graph"):
            ctx.onnx_model = p.apply_final_graph(ctx.onnx_model, ctx)


def _simplify(ctx: ExportContext) -> tuple[str, Any]:
    import numpy as np
    import onnxsim

    from ..capture.onnx_utils import session
    from ..validators.metrics import all_pass

    try:
        simplified, ok = onnxsim.simplify(ctx.onnx_model)
    except Exception as e:  # noqa: BLE001
        return f"failed: {type(e).__name__}: {_gist(e, 200)}", None
    if not ok:
        return "failed: onnxsim's own check did not pass", None
    feed = {n: t.detach().cpu().numpy() for n, t in ctx.example_inputs.items()}
    tol = ctx.options.tolerance

    def run(m: Any) -> list[Any]:
        sess = session(m)
        return [np.asarray(o) for o in sess.run(None, {i.name: feed[i.name] for i in sess.get_inputs()})]

    try:
        after = run(simplified)
        if all_pass(after, ctx.reference_outputs[0], tol):  # the usual case: the original graph is never run
            return "applied", simplified
        if all_pass(after, run(ctx.onnx_model), tol):  # simplification did not change what the graph computes
            return "applied (outputs equal to the unsimplified graph)", simplified
    except Exception as e:  # noqa: BLE001
        return f"failed: simplified graph does not run ({type(e).__name__}: {_gist(e, 200)})", None
    return "rejected: simplified graph changed outputs beyond tolerance", None


def _gist(e: BaseException, limit: int = 400) -> str:
    return errors.gist(e, limit)
