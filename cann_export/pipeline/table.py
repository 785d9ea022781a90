"""The stage table: every export stage in the order it runs, with its error class and its condition."""
from __future__ import annotations

from .. import errors
from ..bundle import annotate
from ..capture import stage as capture
from ..context import ExportContext
from ..inputs import stage as inputs
from ..inputs.graph_fit import fit_sets_to_graph
from ..load import stage as load
from ..model_zoo import stage as zoo
from ..options import ExportOptions
from ..passes import stage as passes
from ..qat import stage as qat
from ..validators import stage as validators
from ..validators.graph_judge import PARITY_JUDGE
from . import write_stage as write
from .stage import Stage


def _capture(ctx: ExportContext) -> str | None:
    # capture judges a graph by parity's rules and takes the gate's sets and the path probes' reference from
    # prepare's forwards, both handed to it here; then prepare's sets fit the graph it made (an axis it fixed
    # cannot vary)
    resolved = [a.name for a in ctx.dynamic_axes]
    status = capture.capture(ctx, PARITY_JUDGE, inputs.gate_references)
    fit_sets_to_graph(ctx, resolved)
    return status


def _lint(ctx: ExportContext) -> str | None:
    return validators.run_validators(ctx, "lint")


def _validate(ctx: ExportContext) -> str | None:
    # under --no-validate it runs only for a trace kept before its check: the trace gate, on the written graph
    from ..capture import trace_judged_by_parity

    if not ctx.options.validate:
        return trace_judged_by_parity.gate_after_write(ctx, PARITY_JUDGE, inputs.gate_references)
    return trace_judged_by_parity.judged(ctx, lambda: validators.run_validators(ctx, "validate"))


def _quantizing(options: ExportOptions) -> bool:
    return bool(options.quantize)


def _validating(options: ExportOptions) -> bool:
    return bool(options.validate)


def _trace_waits(ctx: ExportContext) -> bool:
    return ctx.trace_deferred is not None


def _publishing(options: ExportOptions) -> bool:
    return bool(options.publish)


STAGES: tuple[Stage, ...] = (
    Stage("load", load.load, errors.LoadError),
    Stage("prepare", inputs.prepare, errors.PrepareError),
    Stage("train", qat.train, errors.TrainError, _quantizing),
    Stage("strip", passes.strip, errors.StripError),
    Stage("capture", _capture, errors.CaptureError),
    Stage("optimize", passes.optimize, errors.OptimizeError),
    Stage("annotate", annotate.annotate, errors.AnnotateError),
    Stage("lint", _lint, errors.LintError),
    Stage("write", write.write, errors.WriteError),
    Stage("validate", _validate, errors.ValidateError, _validating, _trace_waits),
    Stage("commit", write.commit, errors.WriteError),  # finalize (manifest), then rename into place
    Stage("publish", zoo.publish, errors.PublishError, _publishing),  # on the committed artifact
)
STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
