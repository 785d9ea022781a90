"""A traced graph that warned, kept at capture and judged by parity (the trace gate's check, run once, on the
written graph): the gate ran onnxruntime on every prepared set before parity ran them all again (GPT-2 small: 14 s
of its 72 s export, ViT-small 2.8 of 16).

When the stages run validate after capture (``ctx.trace_rewind``: pipeline/rewind.py), capture keeps a trace the
gate could check (``defer``) without running it. The validate stage's parity judges every prepared set and probe as
it always did; when its fp32 verdict or the probes fail, or onnxruntime cannot run the written graph on a set
(``judged``), the trace is rejected (``rejected``): the stages go back to capture with that exporter set aside, and
the next one runs, as after the gate's rejection. A rejected trace is still the last resort when no other exporter
writes a graph (capture/stage.py). A graph that fixed a dimension the sets vary is rejected in capture (``fixed``).

Under --no-validate the validate stage runs the gate alone on the written graph (``gate_after_write``): the gate's
sets (exporter_choice.chosen_sets) through onnxruntime at the verdict rule's least floor, nothing recorded as a
parity verdict; a disagreement sends the stages back to capture as above. Run inside capture, the gate held the raw
trace's proto and a temporary copy of it beside the session, so skipping validation cost more than validating (ViT:
1114 against 925 MiB peak)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any


def defer(ctx: Any, exporter: str, path_references: Callable[[Any], None]) -> dict[str, Any] | None:
    """The check record of a trace kept now for validate to judge (``deferred``), or None when the gate must run
    here (the stages cannot go back, the gate cannot check it, or validate already rejected this exporter's).
    ``path_references``: the model's reference on the path probes (handed to capture), which parity judges too."""
    from ..hooks.contracts import Format, optional
    from . import exporter_choice

    if not ctx.trace_rewind or exporter in ctx.traces_rejected or not exporter_choice.gated(ctx) \
            or exporter_choice.unchecked(ctx) or not exporter_choice.checkable_unvalidated(ctx):
        return None
    runs = optional(ctx.format, Format, "runs_programs")
    if runs is not None and runs(ctx.options):  # the write stage runs a program (ATC): not on a graph in doubt
        return None
    _, labels, _ = exporter_choice.gate_sets(ctx, path_references)  # the path variants, when prepare built none
    ctx.trace_deferred = {"exporter": exporter}
    checked = exporter_choice.chosen_sets(labels) if not ctx.options.validate else list(range(len(labels)))
    return {**exporter_choice.coverage(labels, checked), "passed": True, "deferred": True}


def fixed(ctx: Any, exporter: str) -> str | None:
    """Why a deferred trace's graph cannot stand, known right after capture: it fixed a dimension that the input
    sets vary (the gate's onnxruntime run failed on such a graph; parity would drop those sets instead)."""
    from ..inputs.given_shapes import fixed_dims

    pending = ctx.trace_deferred
    if pending and pending["exporter"] == exporter and (dims := fixed_dims(ctx)):
        return f"the traced graph fixed {', '.join(sorted(dims))} at the example's size, which the input sets vary"
    return None


def judged(ctx: Any, run: Callable[[], str | None]) -> str | None:
    """The validate stage (``run``) on a deferred trace's written graph; a failure of its fp32 verdict (at the least
    floor, as the gate judged) or probes, or onnxruntime failing on a set (validators/parity.py), rejects the trace
    (the stage's status says so; the stages then go back to capture). Other validators' errors are raised."""
    pending = ctx.trace_deferred
    if pending is None:
        return run()
    status = run()
    if not pending.get("reason"):  # parity sets it when onnxruntime cannot run the graph on a set
        why = _failed(ctx.reports.parity)
        if why is None:
            ctx.trace_deferred = None
            return status
        pending["reason"] = f"the traced graph differs from the model: {why}"
    return _not_kept(pending["reason"])


def _not_kept(reason: str) -> str:
    """The stage's status for a rejected trace."""
    if len(reason) > 200:  # at a word when one ends in the last 60 characters, else at 200
        cut = reason.rfind(" ", 140, 200)
        reason = reason[:cut if cut > 0 else 200] + " ..."
    return f"traced graph not kept ({reason}); capture runs the next exporter"


def gate_after_write(ctx: Any, judge: Any, path_references: Callable[[Any], None]) -> str:
    """Under --no-validate: the deferred trace's gate on the graph the write stage wrote (``judge``: parity's rules);
    the stage's status. A failure rejects the trace as validate's parity would (``rejected``)."""
    from . import exporter_choice

    pending = ctx.trace_deferred  # the stage runs under --no-validate only with one (pipeline/table.py)
    check = exporter_choice.check_file(ctx, ctx.onnx_path, judge, path_references)
    if check["passed"]:
        ctx.trace_deferred = None
        return f"validation off; the traced graph agrees with the model on the {check['input_sets']} input sets checked"
    pending["reason"] = check["reason"]
    return _not_kept(pending["reason"])


def rejected(ctx: Any) -> tuple[str, str] | None:
    """(exporter, why) when validate rejected the deferred trace."""
    pending = ctx.trace_deferred
    if pending and pending.get("reason"):
        return pending["exporter"], pending["reason"]
    return None


def _failed(report: Any) -> str | None:
    """Why the written graph's fp32 verdict (probes and other paths included) failed, or None: a device-precision
    failure is no reason to drop a trace (dynamo's graph computes the same)."""
    if report is None:
        return "parity did not run"
    fp32 = report.graph_fp32 if report.graph_fp32 is not None else {"passed": report.passed}
    others = (report.trace_specialized or {}).get("other_paths") or {}
    if fp32.get("passed") and (report.probes or {}).get("passed", True) and others.get("passed", True):
        return None
    failing = [f for f in report.failing_sets or [] if f.get("role") != "probe"] or list(report.failing_sets or [])
    if not failing and not others.get("passed", True):  # the path probes, judged apart (built after capture)
        worst = max((o["max_abs"] for o in others.get("outputs", []) if o.get("max_abs") is not None), default=None)
        where = f" on {others['first_failing']}" if others.get("first_failing") else ""
        return (f"the path probes (sign-flipped / scaled examples) differ{where}"
                + (f": max abs {worst:.3g}" if worst is not None else ""))
    if failing:
        f = failing[0]
        return (f"{f['output']} differs on input set {f['set']} ({f['kind']}): max abs {f['max_abs']:.3g}, "
                f"cosine {f['cosine']:.6f}")
    return str(report.reason or "parity failed")
