"""The strip and optimize stages: module passes, graph passes and onnxsim (kept only when outputs match)."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from .. import errors
from ..capture import large_graph
from ..context import ExportContext
from ..hooks.contracts import Pass, optional
from ..hooks.manager import registry

# onnxsim passes that fuse into onnxruntime contrib ops (com.microsoft::Attention, GroupQueryAttention)
ONNXSIM_CONTRIB_FUSIONS = ("fuse_attention", "fuse_gqa")


def _apply(ctx: ExportContext, method: str, model: Any) -> tuple[Any, list[str]]:
    """Every registered pass that implements ``method`` (apply_module / apply_graph / apply_final_graph), in
    order, on ``model``; the result and the names of the passes that ran."""
    ran = []
    for p in registry().passes():
        apply = optional(p, Pass, method)
        if apply is not None:
            model = apply(model, ctx)
            ran.append(p.name)
    return model, ran


def strip(ctx: ExportContext) -> str | None:
    from ..bundle.torch_program import unstripped_copy

    ctx.trainable_model = unstripped_copy(ctx)
    ctx.model, ran = _apply(ctx, "apply_module", ctx.model)
    ctx.reports.strip.module_passes = ran
    return ", ".join(ran)


def optimize(ctx: ExportContext) -> str | None:
    """Graph passes, then onnxsim; the simplified graph is kept only if it loads and matches. A graph bound
    for ATC leaves with no op ATC refuses that it did not come in with (internal error otherwise)."""
    from ..atc.lint import graph_refused_ops, require_standard

    if not getattr(ctx.format, "lint", False):
        return _optimize(ctx)
    before = graph_refused_ops(ctx.onnx_model)
    summary = _optimize(ctx)
    require_standard(before, graph_refused_ops(ctx.onnx_model), "the optimize stage's graph passes")
    return summary


def _optimize(ctx: ExportContext) -> str | None:
    from ..graph.onnx_helpers import weights_bytes

    ctx.onnx_model, _ = _apply(ctx, "apply_graph", ctx.onnx_model)
    if large_graph.state(ctx) is not None:  # the graph's weights are on disk: no copy of them in memory
        ctx.optimize["onnxsim"] = large_graph.optimize_note(ctx.large_graph)
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
    ctx.onnx_model, _ = _apply(ctx, "apply_final_graph", ctx.onnx_model)


def _simplify(ctx: ExportContext) -> tuple[str, Any]:
    """onnxsim from a file to a file, the graph's in-memory copy let go meanwhile (onnxsim's own round trip
    of a ModelProto holds it, its bytes and the C++ copies at once: the export's peak RSS); the captured graph
    is read back from the file only when the simplified one is not kept. Weights onnxsim must not fold
    (``_hidden``) are graph inputs of the file it reads and stay in the captured graph, which then takes the
    simplified graph's nodes around them (``dedupe.graft``)."""
    import tempfile
    from pathlib import Path

    from ..graph.onnx_stream import load
    from ..graph.onnx_helpers import save_model
    from .dedupe import graft, without

    from ..capture.dynamic_dims import input_dim_names, restore_input_dims

    refused, named = _refused_before(ctx), input_dim_names(ctx.onnx_model)
    hidden = _hidden(ctx)
    base = ctx.onnx_model if hidden else None
    with tempfile.TemporaryDirectory(prefix="cann-export-onnxsim-") as tmp:
        original, simplified_path = Path(tmp) / "captured.onnx", Path(tmp) / "simplified.onnx"
        save_model(without(base, hidden) if hidden else ctx.onnx_model, original)  # streamed: no serialised copy
        ctx.onnx_model = simplified = None
        try:
            verdict, simplified = _simplified(ctx, original, simplified_path, refused, base, hidden)
        finally:
            if simplified is None:  # kept unsimplified (or onnxsim raised): the captured graph as it was
                ctx.onnx_model = base if hidden else load(original)
    if simplified is not None and hidden:
        simplified = graft(base, simplified, hidden)
    if simplified is not None:  # onnxsim's shape inference may rename an input's dim (GPT-2 decode's unk__0)
        restore_input_dims(simplified, named)
    return verdict, simplified


def _hidden(ctx: ExportContext) -> list[str]:
    """The initializers onnxsim runs without (graph inputs of the file it reads, put back after): a tied weight a
    Transpose reads (the LM head's embedding: folded, the Transpose would be a second copy of it) and every weight
    no constant-foldable node reads (onnxsim simplifies around them with their shapes alone; GPT-2 small's
    prefill: the same 588 nodes, onnxsim 6.3 -> 0.2 s; the graph onnxsim reads holds none of their bytes)."""
    from .dedupe import shared_transposed, unfoldable_weights

    return sorted(set(shared_transposed(ctx.onnx_model)) | set(unfoldable_weights(ctx.onnx_model)))


def _simplified(ctx: ExportContext, original: Any, target: Any, refused: set | None, base: Any,
                hidden: list[str]) -> tuple[str, Any]:
    import numpy as np
    import onnxsim

    from ..graph.onnx_stream import load
    from ..graph.onnx_helpers import session
    from ..parity_metrics import all_pass
    from .dedupe import feeds

    try:  # onnxsim's onnxruntime fusions (com.microsoft::Attention ...) are no ONNX: ATC could not parse them
        with _native_output_dropped():
            simplified, ok = onnxsim.simplify(str(original), skipped_optimizers=list(ONNXSIM_CONTRIB_FUSIONS),
                                              output_path=str(target))
    except Exception as e:  # noqa: BLE001
        return f"failed: {type(e).__name__}: {_gist(e, 200)}", None
    if not ok:
        return "failed: onnxsim's own check did not pass", None
    added = _refused_by_atc(refused, simplified)
    if added:  # a fusion this list does not know yet: the unsimplified graph is standard ONNX
        return f"rejected: simplified graph holds op(s) ATC does not parse ({', '.join(added)})", None
    del simplified  # what is kept is the file the checks below run, read back once they pass
    from ..heap_release import give_back

    give_back()  # onnxsim's working set, before onnxruntime's
    feed = {n: t.detach().cpu().numpy() for n, t in ctx.example_inputs.items()}
    tol = ctx.options.tolerance

    def run(path: Any) -> list[Any]:
        sess = session(path)
        return [np.asarray(o) for o in sess.run(None, {i.name: feed[i.name] for i in sess.get_inputs()})]

    try:  # the hidden weights are fed, copies dropped with ``feed``
        feed.update(feeds(base, hidden) if hidden else {})
        after = run(target)
        if all_pass(after, ctx.reference_outputs[0], tol):  # the usual case: the original graph is never run
            return "applied", load(target)
        if all_pass(after, run(original), tol):  # simplification did not change what the graph computes
            return "applied (outputs equal to the unsimplified graph)", load(target)
    except Exception as e:  # noqa: BLE001
        return f"failed: simplified graph does not run ({type(e).__name__}: {_gist(e, 200)})", None
    return "rejected: simplified graph changed outputs beyond tolerance", None


@contextlib.contextmanager
def _native_output_dropped() -> Iterator[None]:
    """onnxsim's C++ writes to the process's stderr past Python (a CLIP's causal mask: "WARNING: failed to run
    "Where" op ... skip", twice a layer) what its own result already says; dropped, as the load sandbox's child drops
    its native output, so an in-process export (the Python API, an in-memory model) prints only what we print."""
    import sys
    import tempfile

    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    try:
        saved = [os.dup(1), os.dup(2)]
    except OSError:  # a process without a stdout / stderr: nothing to keep quiet
        yield
        return
    try:
        with tempfile.TemporaryFile() as sink:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def _refused_before(ctx: ExportContext) -> set | None:
    """Ops ATC refuses in the captured graph, for a format bound to ATC (None for other formats)."""
    from ..atc.lint import graph_refused_ops

    return graph_refused_ops(ctx.onnx_model) if getattr(ctx.format, "lint", False) else None


def _refused_by_atc(before: set | None, simplified: Any) -> list[str]:
    """Ops ATC refuses that onnxsim wrote into a graph bound for ATC (none for other formats)."""
    from ..atc.lint import graph_refused_ops

    if before is None:
        return []
    added = graph_refused_ops(simplified) - before
    return sorted(f"{d}::{o}" if d else o for d, o in added)


def _gist(e: BaseException, limit: int = 400) -> str:
    return errors.gist(e, limit)
