"""The capture stage: exporters tried in priority order until one writes a valid graph at the asked opset."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import errors
from ..context import CaptureAttempt, CaptureReport, ExportContext
from ..graph import module_paths
from ..hooks import manager
from ..judging import GraphJudge
from . import attempt_scratch, large_graph
from .trace_warnings import guards, path_dependent


@dataclass
class CaptureRun:
    """One run of the capture stage: what it tried and learned, private to the stage (the context gets the chosen
    graph and its report)."""

    judge: GraphJudge  # parity's rules, as the stage table hands them (the trace check, the opset check)
    # prepare's forward on the trace's path probes (inputs/path_probes.py), as the stage table hands it: the model's
    # outputs on them into the context, unless prepare built them among its sets
    path_references: Callable[[Any], None]
    attempts: list[CaptureAttempt] = field(default_factory=list)
    traced: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # exporter -> its graph's TracerWarnings
    checked: dict[str, dict[str, Any]] = field(default_factory=dict)  # exporter -> the trace gate's check
    probes: dict[str, bool] = field(default_factory=dict)  # exporter -> its trace needs the path probes


def capture(ctx: ExportContext, judge: GraphJudge, path_references: Callable[[Any], None]) -> str | None:
    """Try the exporters in priority order; the first valid graph at the requested opset wins. Without
    --strict-opset a valid graph at another opset the format accepts (ExportOptions.accepts_opset) is the
    last resort, with a warning; with it, no other opset is ever written (CaptureError, exit 3). ``judge``:
    parity's rules, for the trace check and the opset conversion's check; ``path_references``: the model's
    reference on the trace's path probes, for the trace check and parity (capture runs no forward of its own)."""
    from . import exporter_choice, trace_judged_by_parity

    large_graph.state(ctx)  # a large graph's work directory, or a graph past protobuf's limit refused
    exporters = exporter_choice.ordered(ctx, manager.registry().exporters())
    run = CaptureRun(judge, path_references)
    ctx.trace_deferred = None
    set_aside = [e for e in exporters if e.name in ctx.traces_rejected]  # traces validate rejected: last resort
    chosen = _first_graph(ctx, exporters, run, {e.name for e in set_aside})
    if chosen is None and set_aside:
        chosen = _first_graph(ctx, set_aside, run, set())
    if chosen is None:
        raise _no_graph(ctx, run.attempts)
    name, ctx.onnx_model = chosen
    if ctx.trace_deferred and ctx.trace_deferred["exporter"] != name:
        ctx.trace_deferred = None
    if why := trace_judged_by_parity.fixed(ctx, name):  # known now: no need to wait for validate
        ctx.traces_rejected[name] = why
        return capture(ctx, judge, path_references)
    from .dynamic_dims import name_dims
    from .unused_inputs import restore_unused_inputs

    restore_unused_inputs(ctx)  # the graph takes every task input, as its callers and the program do
    name_dims(ctx)  # the symbolic dims named after the axes; an axis the graph fixed is a warning
    return _record(ctx, name, run)


def _first_graph(ctx: ExportContext, exporters: list[Any], run: CaptureRun, skip: set[str]) -> tuple[str, Any] | None:
    """(exporter, graph) of the first of ``exporters`` whose graph is at the requested opset, else the first at
    an opset the format accepts, else the first the trace gate rejected; None when none wrote a graph. Those in
    ``skip`` (traces validate rejected) are recorded as set aside, not run."""
    from . import exporter_choice

    attempts, checked = run.attempts, run.checked
    fallback = rejected = None
    for i, exporter in enumerate(exporters):
        if exporter.name in skip:
            attempts.append(CaptureAttempt(exporter.name, note=exporter_choice.note({"reason": ctx.traces_rejected[
                exporter.name]})))
            continue
        later = any(e.name not in skip and e.supports(ctx.model) for e in exporters[i + 1:])  # a trace is deferred
        # only with a fallback left
        model = _attempt(exporter, ctx, run, later)
        if model is None:
            continue
        if exporter.name in checked and not checked[exporter.name]["passed"]:  # the next exporter; this graph
            attempts[-1].note = exporter_choice.note(checked.pop(exporter.name))  # only if none gives one
            rejected = rejected or (exporter.name, model)
            continue
        if attempts[-1].opset == ctx.options.opset:
            return exporter.name, model
        if fallback is None and ctx.options.accepts_opset(attempts[-1].opset, ctx.format):
            fallback = (exporter.name, model)
    return fallback or rejected


def _attempt(exporter: Any, ctx: ExportContext, run: CaptureRun, deferrable: bool) -> Any:
    """One exporter's try, recorded in ``run.attempts``: its valid graph, or None. A trace that warned goes through
    the trace gate first (``run.checked``), whose onnxruntime run spares the check a second load of the graph."""
    from ..backend.eval_mode import to_eval
    from ..graph.onnx_helpers import check_graph, opset_of
    from . import exporter_choice, trace_judged_by_parity

    attempts = run.attempts
    if not exporter.supports(ctx.model):
        attempts.append(CaptureAttempt(exporter.name, error="does not support this model type"))
        return None
    notes: list[str] = []
    ctx.trace_probes = True
    try:
        ctx.trace_warnings = []
        with attempt_scratch.attempt(run.judge) as scratch:
            notes = scratch.notes
            model = exporter.export(ctx.model, ctx)
        run.traced[exporter.name] = ctx.trace_warnings
        loaded, checked_file = model is scratch.loaded, model is scratch.checked
        scratch.loaded = scratch.checked = None  # the graphs it held are not kept past the check
        dependent = bool(path_dependent(ctx.trace_warnings))
        ctx.trace_probes = run.probes[exporter.name] = _probes_needed(ctx.trace_warnings, model)
        # judged by parity, else by the gate now; a trace that warned at input checks only needs no gate (nor the
        # path probes), but when parity follows it is deferred too: parity's onnxruntime load stands in for
        # capture's (rejected: rewound)
        if ctx.trace_warnings and exporter_choice.gated(ctx):
            references = run.path_references if dependent else _no_references
            deferred = deferrable and (dependent or ctx.options.validate) \
                and trace_judged_by_parity.defer(ctx, exporter.name, references)
            if deferred or dependent:  # not deferred, a guard-only trace is checked below as any graph is
                check = deferred or exporter_choice.check(ctx, model, run.judge, run.path_references)
                run.checked[exporter.name] = check
                loaded = loaded or bool(check.get("ran") or check.get("deferred"))  # deferred: parity loads it
        if large_graph.state(ctx):
            large_graph.check(model, ctx)
        elif not (checked_file and loaded):  # else both halves of the check are done
            check_graph(model, loaded=loaded, checked=checked_file)
    except Exception as e:  # noqa: BLE001 - each failure is recorded, the next exporter tried
        attempts.append(CaptureAttempt(exporter.name, error=f"{type(e).__name__}: {_gist(e, 300)}"))
        return None
    finally:
        to_eval(ctx.model, ctx.loaded.kind)  # exporters may restore a training flag on the way out
    opset = opset_of(model)
    attempts.append(CaptureAttempt(exporter.name, opset=opset))
    if opset != ctx.options.opset:
        why = " ".join(("; ".join(notes) or "the exporter wrote another opset").split())
        attempts[-1].note = f"wrote opset {opset}, asked {ctx.options.opset} ({why[:300]})"
    return model


def _probes_needed(findings: list[dict[str, Any]], model: Any) -> bool:
    """Whether the trace's warnings need the path probes: one may depend on input values, or a size in the graph may
    (capture/shape_tests.py); a trace that warned only at tests of sizes is checked at the ranges' sizes alone."""
    from .shape_tests import sizes_from_shapes_only
    from .trace_warnings import value_dependent

    dependent = [f for f in findings if not f.get("guard")]
    try:
        return not dependent or value_dependent(dependent) or not sizes_from_shapes_only(model)
    except Exception:  # noqa: BLE001 - a graph the check cannot read: probed, as before
        return True


def _no_references(ctx: ExportContext) -> None:
    """The path references of a trace that warned at input checks only: none (its check needs no probes)."""


def _record(ctx: ExportContext, name: str, run: CaptureRun) -> str:
    """The chosen graph's module paths, opset, attempts and trace warnings into the context; the status."""
    from ..graph.onnx_helpers import opset_of

    attempts, traced, checked = run.attempts, run.traced, run.checked.get(name)
    ctx.module_paths = module_paths.collect(ctx.onnx_model)
    ctx.module_origins = module_paths.collect_origins(ctx.onnx_model)
    opset = opset_of(ctx.onnx_model)
    ctx.capture = CaptureReport(name, opset, ctx.options.opset, attempts)
    found = traced.get(name, [])
    ctx.trace_warnings = path_dependent(found)
    ctx.trace_probes = run.probes.get(name, True)  # the chosen graph's (a later attempt may have set another)
    ctx.capture.guards = guards(found) or None
    if ctx.trace_warnings:
        _specialised(ctx, checked, run.path_references)
    else:  # a rejected trace's path variants: the chosen graph took no path the example decided
        ctx.path_input_sets, ctx.path_reference_outputs = [], []
    if opset != ctx.options.opset:
        notes = "; ".join(a.note for a in attempts if a.note is not None)
        ctx.capture.warning = (f"the {name} exporter wrote opset {opset} instead of {ctx.options.opset} "
                               f"({notes}); pass --strict-opset to refuse any other opset")
        return f"{name}, opset {opset} (asked {ctx.options.opset})"
    return f"{name}, opset {opset}"


def _no_graph(ctx: ExportContext, attempts: list[CaptureAttempt]) -> errors.CaptureError:
    """Why no exporter's graph was kept: each attempt's error, or the opset it wrote instead."""
    detail = "; ".join(f"{a.exporter}: {a.error or a.note}" for a in attempts)
    if any(a.opset is not None for a in attempts):
        return errors.CaptureError(f"no exporter wrote opset {ctx.options.opset} and --strict-opset refuses "
                                   f"another ({detail}); pass another --opset, or drop --strict-opset",
                                   path=ctx.loaded.source_path)
    return errors.CaptureError(f"no exporter produced a valid ONNX graph ({detail}){_cache_hint(ctx, detail)}",
                               path=ctx.loaded.source_path)


def _cache_hint(ctx: ExportContext, detail: str) -> str:
    """What to do when a transformers model with its cache on returned a Cache object neither exporter takes (a
    decoder exported through the Python API with its own example inputs and no past)."""
    config = getattr(ctx.model, "config", None)
    if not getattr(config, "use_cache", False) or "Cache" not in detail:
        return ""
    return ("; the model's config has use_cache on, so its outputs hold its cache object: set "
            "model.config.use_cache = False for one graph without it, or export the prefill and decode graphs with "
            "cann_export.export_multi(model, ...)")


def _specialised(ctx: ExportContext, checked: dict[str, Any] | None,
                 path_references: Callable[[Any], None]) -> None:
    """A traced graph that warned: record it (``checked``: the trace gate's passed check), and the reference on
    inputs that may take other paths (from the stripped module, which is what was traced) unless the gate made it."""
    from . import trace_warnings

    trace_warnings.record(ctx, ctx.trace_warnings, checked)
    if ctx.options.validate and not ctx.quant_table:  # parity judges them (among the prepared sets, when there)
        path_references(ctx)


def _gist(e: BaseException, limit: int = 400) -> str:
    return errors.gist(e, limit)
