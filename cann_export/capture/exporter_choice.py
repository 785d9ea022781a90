"""Which exporters the capture stage tries, in what order, and whether a traced graph that warned is kept.

Order: ``--exporter NAME`` tries that one only. ``auto`` follows ``Decisions.exporter_order`` (the format's declared
``exporter_order``, else the loader's ``LoadedModel.extras["exporter_order"]``; the Hugging Face loader asks for
TorchScript first, as Optimum traces), each named exporter first and the rest by priority; where the gate below could
not check a trace (a graph past the large-graph threshold, a quantized export) the priority order stays, so no trace
is run only to be thrown away.

Gate: under ``auto`` a traced graph that emitted TracerWarnings is checked against the eager reference before it is
kept: onnxruntime runs it on the input sets the prepare stage built (at the example's shape all of them: the example,
the random variants; at each dynamic axis' range ends and middle the first set of that shape, ``chosen_sets``) and on
sign-flipped / scaled copies of the example, judged by parity's own rule (parity_report); parity judges every set
again on the written graph. When a checkable trace comes first (``Decisions.trace_first``), prepare builds those
copies itself as its specialisation probes, in place of the heavy-tailed random draws (laplace, wide_normal: x4 / x-4
reach further off the example's range), so the gate and parity judge them on the one reference and add no forward. All
agree: kept, the specialisation recorded as checked (a warning naming the sets). Any differ, or it cannot be checked
(a quantized export): rejected, the next exporter runs, and the attempt names why. Under --no-validate, when a
checkable trace comes first, the sets the gate checks (the example, the realistic random draws, the probes, one set
at each dynamic axis' range ends and middle) are built once a trace warned at more than input checks
(inputs/stage.py ``add_gate_sets``; a multi-graph component's shape sets in prepare, as its later graphs' inputs come
from them) and the gate judges every verdict set at the least floor (nothing measured), so skipping parity keeps a
checked trace (dynamo was
slower: ViT-small 19-25 s against 16 s validated; GPT-2 small's two graphs 62 s against 55 s). When the stages run
validate after capture (an export's usual run) the check waits until the graph is written
(trace_judged_by_parity.py): validating, parity judges the same sets on the written graph; under --no-validate the
validate stage runs the gate alone on it (``check_file``); a failure either way sends the stages back to capture with
the trace rejected, so onnxruntime runs the sets once, not twice, and never beside the raw trace.
``--exporter torchscript`` keeps the old rule: a specialised trace fails parity unless
``--accept-trace-specialization``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..judging import GraphJudge


def ordered(ctx: Any, exporters: list[Any]) -> list[Any]:
    """The exporters to try, in order (``exporters`` come in descending priority)."""
    if ctx.options.exporter != "auto":
        return [e for e in exporters if e.name == ctx.options.exporter]
    wanted = ctx.decisions.exporter_order
    if not wanted or ctx.decisions.large_graph or (gated(ctx) and unchecked(ctx)):
        return exporters
    rank = {name: i for i, name in enumerate(wanted)}
    return sorted(exporters, key=lambda e: rank.get(e.name, len(rank)))  # stable: the rest keep their priority


def gated(ctx: Any) -> bool:
    """Whether a traced graph that warned must pass the check to be kept (``auto``, not accepted by the user)."""
    return ctx.decisions.trace_gated


def _prepared(ctx: Any) -> bool:
    """Whether the gate has sets beyond the example (under --no-validate only when the trace comes first:
    ``Decisions.trace_first``; prepare leaves them to ``inputs.stage.add_gate_sets``, which the ``path_references``
    of ``gate_sets`` runs once a trace warned; a trace tried after another exporter failed finds the example
    alone)."""
    return ctx.gate_sets_pending is not None or any(label.get("source") in ("random", "shape", "trace_path")
                                                    for label in ctx.input_set_labels)


def unchecked(ctx: Any) -> str | None:
    """Why the gate cannot check a trace in this export (then a preferred trace would only be thrown away)."""
    if ctx.options.quantize or ctx.quant_table:
        return "not checked: a quantized export"
    if ctx.decisions.large_graph:
        return "not checked: a large graph"
    return None


def check(ctx: Any, model: Any, judge: GraphJudge, path_references: Callable[[Any], None]) -> dict[str, Any]:
    """The traced ``model`` against the reference on every prepared input set and the path variants:
    ``{"passed", "input_sets", "shapes", "path_variants", "ran"?, "reason"?}``. The path variants and their reference
    (``path_references``, handed to capture) stay in the context for parity (which judges the written graph on them
    again)."""
    why = unchecked(ctx)
    if not why and not checkable_unvalidated(ctx):
        why = "not checked: validation is off (--no-validate) and the trace was not the first exporter tried"
    if why:
        return {"passed": False, "reason": why}
    import tempfile
    from pathlib import Path

    from ..graph.onnx_helpers import save_model

    with tempfile.TemporaryDirectory(prefix="cann-export-trace-") as tmp:
        path = Path(tmp) / "traced.onnx"
        save_model(model, path)  # streamed: no serialised copy of the graph beside it (GPT-2 small: 500 MB)
        return check_file(ctx, path, judge, path_references)


def checkable_unvalidated(ctx: Any) -> bool:
    """Whether the gate has sets to check a trace on: always when validating; under --no-validate only when
    prepare built them (the trace came first)."""
    return bool(ctx.options.validate) or _prepared(ctx)


def check_file(ctx: Any, path: Any, judge: GraphJudge, path_references: Callable[[Any], None]) -> dict[str, Any]:
    """The gate's check (``check``) of the graph at ``path``: the raw trace, or under --no-validate the graph the
    write stage wrote (capture/trace_judged_by_parity.py:gate_after_write)."""
    sets, labels, reference = gate_sets(ctx, path_references)
    chosen = chosen_sets(labels)
    done = coverage(labels, chosen)
    try:
        report = _judged(ctx, path, judge, chosen, sets, labels, reference)
    except Exception as e:  # noqa: BLE001 - a graph that fails at another shape is a disagreement
        return {**done, "passed": False, "reason": f"the traced graph fails on an input set: {type(e).__name__}: "
                                                   f"{' '.join(str(e).split())[:200]}"}
    done["ran"] = True  # onnxruntime loaded and ran the graph (the capture's check need not load it again)
    if report.get("passed"):
        return {**done, "passed": True}
    return {**done, "passed": False, "reason": f"the traced graph differs from the model: {report.get('reason')}"}


def coverage(labels: list[dict[str, Any]], chosen: list[int]) -> dict[str, Any]:
    """What a check of the ``chosen`` sets covers: their count, the path variants among the sets, the shapes."""
    shapes = [label["shape"] for label in labels if label.get("shape")]
    return {"input_sets": len(chosen), "path_variants": sum(1 for label in labels if label["source"] == "trace_path"),
            "shapes": [dict(s) for i, s in enumerate(shapes) if s not in shapes[:i]]}


def gate_sets(ctx: Any, path_references: Callable[[Any], None]
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[list[Any]]]:
    """The prepared input sets with their labels and reference (no new forward), plus the path variants and
    theirs unless prepare built them among its sets (``Decisions.trace_first``); else ``path_references`` runs one
    forward each, for float inputs only, kept in the context for parity."""
    from ..inputs.path_probes import PATH_SCALES
    from ..inputs.tensors import set_label

    path_references(ctx)  # under --no-validate also the sets prepare left for a trace that warned
    count = len(ctx.input_sets)
    labels = [dict(label) for label in ctx.input_set_labels[:count]]
    labels += [set_label("trace_path", f"example x {scale:g}", 0, probe=True)
               for scale in PATH_SCALES[:len(ctx.path_input_sets)]]
    for index, label in enumerate(labels):
        label["index"] = index
    return ([*ctx.input_sets, *ctx.path_input_sets], labels, [*ctx.reference_outputs, *ctx.path_reference_outputs])


def chosen_sets(labels: list[dict[str, Any]]) -> list[int]:
    """The sets the gate runs: every set at the example's shape (the example, the random draws, the probes) and
    the first set at each other shape (its example-like draw). A trace fixed to the example's size differs at
    every other size, so one set there shows it; the other draws cost the trace what dynamo would (GPT-2 small's
    prefill: 28 s of onnxruntime CPU for all, before parity runs them all on the written graph anyway)."""
    example = labels[0].get("shape") if labels else None
    seen: list[Any] = []
    chosen = []
    for i, label in enumerate(labels):
        shape = label.get("shape")
        if not shape or shape == example or shape not in seen:
            chosen.append(i)
        if shape and shape not in seen:
            seen.append(shape)
    return chosen


def _judged(ctx: Any, path: Any, judge: GraphJudge, chosen: list[int], sets: list, labels: list,
            reference: list) -> dict[str, Any]:
    """``judge``'s parity report on the graph at ``path`` for the ``chosen`` sets, at the verdict rule's floor when
    the reference's noise was deferred (a disagreement there rejects the trace: dynamo is the safe side)."""
    count = len(ctx.input_sets)
    noise = list(ctx.reference_noise) if len(ctx.reference_noise) == count else None
    if not ctx.options.validate:  # nothing measured: the verdict rule's least floor on every verdict set
        outputs = len(reference[0]) if reference else 0
        noise = [[0.0] * outputs if label.get("role") == "verdict" else None for label in labels]
    elif noise is None and ctx.reference_noise_deferred:
        from ..inputs import float_noise

        noise = float_noise.least_floor(ctx)
    noise = [*noise, *[None] * (len(sets) - len(noise))] if noise is not None else None
    feeds = [{n: t.detach().cpu().numpy() for n, t in sets[i].items()} for i in chosen]
    return judge.graph_report(path, feeds, [reference[i] for i in chosen], ctx.options.tolerance,
                              "the model on the prepared input sets (trace check)", [labels[i] for i in chosen],
                              [noise[i] for i in chosen] if noise is not None else None)


def note(result: dict[str, Any]) -> str:
    """The capture attempt's note for a trace the gate rejected."""
    return f"traced graph not kept (tracing warned): {result.get('reason')}"

