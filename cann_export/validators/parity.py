"""Numeric parity: the written graph in onnxruntime against the PyTorch eager fp32 reference.

The reference is the original (unstripped) model in eval mode, run on the example inputs and on
``num_random_inputs`` seeded variants of the same shapes; every output of every run is compared.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..context import ParityReport, PrecisionFix, Reports


_KEPT: dict[Any, Any] | None = None  # within ``one_session``: the graph's session, kept for its next use


@contextlib.contextmanager
def one_session(path: Any) -> Iterator[None]:
    """Within it, the next two parity runs on the graph at ``path`` share one onnxruntime session (the path probes
    built after capture, then the verdict sets: GPT-2 small's decode graph took 1.3 CPU-s to load again). The
    session is freed after its second use, before any device-precision run, as it was."""
    global _KEPT
    outer, _KEPT = _KEPT, {"path": str(path)}
    try:
        yield
    finally:
        _KEPT = outer


def onnx_session(path: Path, input_sets: list[dict[str, Any]], quantized: bool = False) -> tuple[Any, list[str]]:
    """An onnxruntime (CPU) session on the graph at ``path`` and the names of the inputs it is fed; a Q/DQ graph's
    under onnx_helpers.for_qdq's options (no u8s8 int8 fusions, no WeightBiasQuantization: artifacts of this runtime
    that the Q/DQ semantics and ATC do not have). A large export's graph is fed the module's own tensors
    (large_graph.parity_session), under the same options."""
    from ..capture.large_graph import parity_session

    key = (str(path), quantized)
    session = _KEPT.pop(key, None) if _KEPT is not None else None  # used once more, then freed as before
    if session is None:
        session = parity_session(Path(path), quantized)  # a large export's graph: weights not held twice
    if session is None:
        from ..graph.onnx_helpers import check_session, for_qdq, session_options

        options = session_options()
        disabled = for_qdq(options) if quantized else []
        session = check_session(str(path), options, disabled_optimizers=disabled)
    if _KEPT is not None and _KEPT.get("path") == str(path) and not _KEPT.get("kept"):
        _KEPT[key], _KEPT["kept"] = session, True  # once: the next run on the graph takes it, later ones load
    wanted = [i.name for i in session.get_inputs()]
    missing = [n for n in wanted if n not in input_sets[0]]
    if missing:
        raise ValueError(f"the graph needs inputs {missing} that the parity data does not have")
    return session, wanted


def judged_runs(path: Path, input_sets: list[dict[str, Any]], judge: Any,
                quantized: bool = False) -> tuple[list[str], list[list[Any]]]:
    """Run the input sets through onnxruntime one at a time; of each run only ``judge(set, output names,
    outputs)`` is kept, and the outputs are dropped before the next run (a large vocabulary's logits at every
    shape never sit in memory together). Returns the output names and the judgements per set."""
    from ..heap_release import give_back
    from ..progress import counted

    session, wanted = onnx_session(path, input_sets, quantized)
    names = [o.name for o in session.get_outputs()]
    kept = []
    for s, feed in enumerate(counted(input_sets, "parity input sets")):
        outputs = session.run(None, {n: feed[n] for n in wanted})
        kept.append(judge(s, names, outputs))
        del outputs
        give_back()  # the next set's run does not stack on this one's freed intermediates
    return names, kept


def parity_report(path: Path, input_sets: list[dict[str, Any]], expected: list[list[Any]],
                  tolerance: Any, reference: str = "pytorch eager fp32 (eval mode)",
                  quantized: bool = False, labels: list[dict[str, Any]] | None = None,
                  noise: list[list[float] | None] | None = None,
                  quant_noise: list[list[dict[str, float]] | None] | None = None) -> dict[str, Any]:
    """Compare the graph's outputs with ``expected`` per output. The verdict sets (``labels``' role
    ``verdict``; every set when no labels are given) decide with the verdict rule, worst case over them; the
    probes are judged with the probe rule and reported apart (``probes``); every failing set is named.
    ``noise`` (per set, per output: the reference's fp32-vs-float64 distance, or None) sets the verdict
    rule's floor where it was measured; ``quant_noise`` (per set, per output: the fake-quant reference's distance
    from itself, inputs/quant_noise.py) does for a Q/DQ graph."""
    import numpy as np

    from ..parity_metrics import compare, compare_probe, compare_quantized, reference_problem
    from .msprobe_metrics import figures, worst

    labels = labels or unlabelled(len(input_sets))
    count = len(expected[0])

    def judge(s: int, names: list[str], outputs: list[Any]) -> list[dict[str, Any]] | None:
        if len(names) != count:
            return None
        rule = compare_probe if labels[s]["role"] == "probe" else compare
        out = []
        for k, got in enumerate(outputs):
            got = np.asarray(got)
            if quantized:
                out.append(compare_quantized(got, expected[s][k], tolerance, noise=_noise(quant_noise, s, k)))
            elif rule is compare:
                row = compare(got, expected[s][k], tolerance, _noise(noise, s, k))
                out.append({**row, "msprobe": figures(got, expected[s][k])})
            else:
                out.append(rule(got, expected[s][k], tolerance))
        return out

    names, judged = judged_runs(path, input_sets, judge, quantized)
    report: dict[str, Any] = {"reference": reference, "runtime": "onnxruntime CPUExecutionProvider",
                              "input_sets": len(input_sets), "tolerance": tolerance.to_dict(), "outputs": [],
                              "sets": [dict(label) for label in labels]}
    if len(names) != count:
        report.update(passed=False, reason=f"the graph has {len(names)} outputs, the reference {count}")
        return report
    verdict = [s for s, label in enumerate(labels) if label["role"] != "probe"]
    probes = [s for s, label in enumerate(labels) if label["role"] == "probe"]
    failed: list[dict[str, Any]] = []
    probe_outputs: list[dict[str, Any]] = []
    for k, name in enumerate(names):
        entry = {"name": name, "shape": list(expected[0][k].shape),
                 **_judged(name, verdict, labels, lambda s, k=k: judged[s][k], failed)}
        if not quantized and verdict:  # msprobe's figures beside ours, worst over the verdict sets
            entry["msprobe"] = worst([judged[s][k].get("msprobe") for s in verdict])
        problem = reference_problem(expected[s][k] for s in range(len(input_sets)))  # one set mapped at a time
        if problem:  # a meaningless reference is a failed check with its own message, never a pass
            entry.update(problem, passed=False)
        report["outputs"].append(entry)
        if probes:
            probe_outputs.append({"name": name, **_judged(name, probes, labels, lambda s, k=k: judged[s][k], failed)})
    _verdict(report, failed, probe_outputs, len(probes))
    return report


def _noise(noise: list[list[Any] | None] | None, s: int, k: int) -> Any:
    row = noise[s] if noise and s < len(noise) else None
    return row[k] if row and k < len(row) and isinstance(row[k], (int, float, dict)) else None


def unlabelled(count: int) -> list[dict[str, Any]]:
    """Labels for input sets of unknown kinds (a bundle exported before sets were labelled): all decide."""
    from ..inputs.tensors import set_label

    return [set_label("stored", "unlabelled", s) for s in range(count)]


def _judged(name: str, sets: list[int], labels: list[dict[str, Any]], judge: Any,
            failed: list[dict[str, Any]]) -> dict[str, Any]:
    """One output over ``sets``: the worst case, and each failing set appended to ``failed``."""
    from ..parity_metrics import merge

    per_set = [judge(s) for s in sets]
    for s, r in zip(sets, per_set, strict=True):
        if not r["passed"]:
            failed.append({"set": s, "kind": labels[s]["kind"], "source": labels[s]["source"],
                           "role": labels[s]["role"], "output": name,
                           **{m: r[m] for m in ("max_abs", "max_rel", "cosine", "reason") if m in r}})
    return merge(per_set) if per_set else {"max_abs": 0.0, "max_rel": 0.0, "cosine": 1.0, "passed": True,
                                           "failed_sets": 0}


def _verdict(report: dict[str, Any], failed: list[dict[str, Any]], probe_outputs: list[dict[str, Any]],
             probes: int) -> None:
    """passed, the failing sets by name, the probes' verdict and the reason naming the first failing set."""
    report["failing_sets"] = failed
    if probes:
        report["probes"] = {"passed": all(o["passed"] for o in probe_outputs), "input_sets": probes,
                            "rule": "max abs error <= atol + probe_rtol x max |ref|, cosine >= probe_min_cosine",
                            "outputs": probe_outputs}
    verdict_ok = all(o["passed"] for o in report["outputs"])
    report["passed"] = verdict_ok and all(o["passed"] for o in probe_outputs)
    bad = [o for o in report["outputs"] if o.get("reference")]
    if bad:
        report["reason"] = f"{bad[0]['name']}: {bad[0]['reason']}"
    elif failed:
        first = next((f for f in failed if f["role"] != "probe"), failed[0])
        others = len({f["set"] for f in failed}) - 1
        what = "specialisation probe" if first["role"] == "probe" else "input set"
        report["reason"] = (f"{first['output']} differs on {what} {first['set']} ({first['kind']}): max abs "
                            f"{first['max_abs']:.3g}, cosine {first['cosine']:.6f}"
                            + (f" ({first['reason']})" if first.get("reason") else "")
                            + (f"; {others} more failing set(s) in failing_sets" if others > 0 else ""))


def _fp32_report(ctx: Any, feeds: list, reference: str, quantized: bool, labels: Any, noise: Any,
                 quant_noise: Any) -> dict[str, Any]:
    """parity_report against the reference. With the reference noise deferred (inputs/float_noise.defer) the
    verdict sets are judged at the rule's least floor first; only when one fails there, where the measured noise
    could raise the floor enough to pass it, is the noise measured and the graph judged again."""
    from ..inputs import float_noise

    deferred = ctx.reference_noise_deferred and not quantized
    ctx.verdict_noise = None
    if deferred:
        noise = float_noise.least_floor(ctx) if labels is not None else None
    report = parity_report(ctx.onnx_path, feeds, ctx.reference_outputs, ctx.options.tolerance, reference,
                           quantized=quantized, labels=labels, noise=noise, quant_noise=quant_noise)
    if not deferred or not any(f["role"] != "probe" for f in report.get("failing_sets", [])):
        ctx.verdict_noise = noise if deferred else None  # passed at the least floor: what a bundle stores
        return report
    if ctx.trace_deferred is not None:  # as the trace gate judged: a trace off at the least floor is not kept
        return report
    measured = float_noise.measured(ctx)
    noise = measured if len(measured) == len(feeds) else None
    return parity_report(ctx.onnx_path, feeds, ctx.reference_outputs, ctx.options.tolerance, reference,
                         quantized=quantized, labels=labels, noise=noise, quant_noise=quant_noise)


class _Unrunnable(Exception):
    """onnxruntime failed on a deferred trace's graph (its cause): the trace is rejected, not the export."""


def _graph_runs(ctx: Any, run: Any) -> Any:
    """``run()`` (onnxruntime on the written graph); with a deferred trace, its failure is ``_Unrunnable``. Only
    these runs decide a trace: an error elsewhere in validate (device emulation, a plugin) is raised as it is."""
    if ctx.trace_deferred is None:
        return run()
    try:
        return run()
    except Exception as e:
        raise _Unrunnable() from e


def _unrunnable(ctx: Any, e: BaseException | None) -> ParityReport:
    """The failing verdict of a deferred trace's graph that onnxruntime cannot run on a set."""
    from .. import errors

    ctx.trace_deferred["reason"] = f"the traced graph fails on an input set: {type(e).__name__}: {errors.gist(e, 200)}"
    return ParityReport(reference="pytorch eager fp32 (eval mode)", runtime="onnxruntime CPUExecutionProvider",
                        input_sets=len(ctx.input_sets), tolerance=ctx.options.tolerance.to_dict(), outputs=[],
                        passed=False, reason=ctx.trace_deferred["reason"])


def example_shape(labels: list[dict[str, Any]] | None, sets: list[int]) -> list[int]:
    """Of ``sets``, those at the example's shape (a dynamic graph's other shapes are judged per shape)."""
    if not labels or "shape" not in labels[0]:
        return sets
    return [s for s in sets if labels[s].get("shape") == labels[0]["shape"]]


def verdict_sets(labels: list[dict[str, Any]], count: int) -> list[int]:
    """Indices of the input sets that decide (device parity runs on these only)."""
    labels = labels or unlabelled(count)
    return [s for s, label in enumerate(labels[:count]) if label["role"] != "probe"]


class ParityValidator:
    """fp32 parity of the written graph; for atc_ready / om also device-precision parity (the graph
    computed as the NPU will under the precision mode), with localisation and --fix-precision."""

    name = "parity"
    stage = "validate"
    formats = "*"

    def check(self, ctx: Any) -> ParityReport:
        from ..capture.trace_warnings import apply_verdict

        try:
            from ..capture.large_graph import state

            probed = bool(ctx.path_input_sets and ctx.path_reference_outputs)  # a trace: inputs that take other paths
            # the probes' session is the verdict sets' too (a large graph's weights are fed from the module instead)
            with one_session(ctx.onnx_path) if probed and state(ctx) is None else contextlib.nullcontext():
                other = _graph_runs(ctx, lambda: path_probe_report(ctx)) if probed else None
                report = self.check_graph(ctx)
            report["input_sets_from"] = dict(ctx.reports.reference.input_sets)
            if ctx.reports.reference.shape_budget is not None:
                report["shape_budget"] = ctx.reports.reference.shape_budget
        except _Unrunnable as e:  # a deferred trace that fails on a set: rejected (capture/trace_judged_by_parity.py)
            return _unrunnable(ctx, e.__cause__)
        return ParityReport.from_dict(apply_verdict(report, ctx, other))

    def check_graph(self, ctx: Any) -> dict[str, Any]:
        feeds = [{n: to_numpy(t) for n, t in s.items()} for s in ctx.input_sets]
        labels = ctx.input_set_labels if len(ctx.input_set_labels) == len(feeds) else None
        noise = ctx.reference_noise if len(ctx.reference_noise) == len(feeds) else None
        quant_noise = ctx.int8_noise if len(ctx.int8_noise) == len(feeds) else None
        # our QAT's lowering, or a graph that arrived quantized (torch.ao / torchao PT2E QAT exported as Q/DQ)
        quantized = bool(ctx.quant_table) or any(n.op_type == "QuantizeLinear" for n in ctx.onnx_model.graph.node)
        reference = "pytorch fake-quant model (eval mode)" if quantized else "pytorch eager fp32 (eval mode)"
        from ..capture.large_graph import sharing

        with sharing(ctx):
            report = _graph_runs(ctx, lambda: _fp32_report(ctx, feeds, reference, quantized, labels, noise,
                                                            quant_noise))
        if ctx.trace_deferred is not None and not report.get("passed"):  # the trace is rejected: no device run
            from .shape_parity import add_shape_verdicts

            add_shape_verdicts(report, labels)
            return report
        if quantized and ctx.float_reference_outputs:  # the accuracy cost of int8, reported apart from parity
            cost = parity_report(ctx.onnx_path, feeds, ctx.float_reference_outputs, ctx.options.tolerance,
                                 "pytorch float model (eval mode)", quantized=True, labels=labels)
            ctx.reports.quantization_report().int8_vs_float = {
                "outputs": [{k: o[k] for k in ("name", "max_abs", "cosine")} for o in cost.get("outputs", [])]}
        from .shape_parity import add_shape_verdicts

        if not ctx.format.device_parity or "outputs" not in report or not report["outputs"]:
            add_shape_verdicts(report, labels)
            return report
        if ctx.large_graph is not None:
            from ..capture.large_graph import device_parity_note

            add_shape_verdicts(report, labels)
            return device_parity_note(report, ctx)
        from ..atc.hints import effective_precision
        from ..heap_release import give_back

        from .emulators import shared_emulators

        keep = ctx.reports.atc.get("keep_dtype", {}).get("nodes", [])
        model, fed = written_graph(ctx)
        # the device verdict: realistic sets only, at the example's shape (other shapes: shape_verdicts, once each)
        chosen = example_shape(labels, verdict_sets(labels or [], len(feeds)))
        known = quantized and len(ctx.float_reference_outputs) == len(feeds)  # the int8 device yardstick
        floats = [ctx.float_reference_outputs[s] for s in chosen] if known else None
        with shared_emulators(model, fed):  # one Emulator (and one copy of the weights) for every device run
            report = with_device_parity(report, model, effective_precision(ctx.options), keep,
                                        [feeds[s] for s in chosen], [ctx.reference_outputs[s] for s in chosen],
                                        ctx.options.tolerance, ctx.module_paths, fix=ctx.options.fix_precision,
                                        reports=ctx.reports, soc=ctx.options.soc_version, float_expected=floats,
                                        layers=True,  # report.html's per-layer curve
                                        mixlist=ctx.options.atc_hints.get("modify_mixlist"),
                                        custom=ctx.options.atc_hints.get("customize_dtypes"))
            ctx.reports.layers = report.pop("layers", None)
            give_back()  # the per-layer curve's exposed values: freed before the other shapes' device runs
            final_keep = list((report.get("precision") or {}).get("keep_dtype", keep))  # --fix-precision's
            return shape_verdicts(report, labels, model, final_keep, feeds, ctx.reference_outputs,
                                  ctx.options.tolerance, ctx.module_paths, quantized)


def written_graph(ctx: Any) -> tuple[Any, dict[str, Any] | None]:
    """The graph the write stage wrote and the weights an Emulator of it feeds: the context's own graph (never
    changed by the checks, which build their graphs from copies of its nodes) when it holds its weights (None:
    the Emulator reads them from it), else the file's graph with those weights read apart, once
    (precision.fed_weights: the context keeps a written graph's structure only, format_writers._save)."""
    import onnx

    from .precision import fed_weights

    model = ctx.onnx_model
    if model is not None and all(i.data_location != onnx.TensorProto.EXTERNAL for i in model.graph.initializer):
        return model, None
    return fed_weights(Path(ctx.onnx_path))


def shape_verdicts(report: dict[str, Any], labels: list[dict[str, Any]] | None, model: Any, keep: list[str],
                   feeds: list, expected: list, tolerance: Any, paths: dict[str, str],
                   quantized: bool) -> dict[str, Any]:
    """``report["shapes"]`` (validators/shape_parity.py) with the device verdict per shape, under the mode and
    device model the device run used (a Q/DQ graph: fp32 per shape only)."""
    from .int8_device import deq_scale_for
    from .shape_parity import add_shape_verdicts, device_check, groups

    precision = report.get("precision") or {}
    device = None
    if groups(labels) and report.get("device") is not None and not quantized:
        model_of_soc = precision.get("device_model") or {}
        names = [o["name"] for o in report["outputs"]]
        device = device_check(model, precision["mode"], keep, feeds, expected, names, tolerance, paths,
                              model_of_soc.get("overflow_mode", "saturation"),
                              deq_scale_for(model_of_soc.get("soc_version", "Ascend310P3")),
                              stored_lists(precision))
    add_shape_verdicts(report, labels, device, (report.get("device") or {}).get("passed"))
    return report


def path_probe_report(ctx: Any) -> dict[str, Any]:
    """The traced graph on sign-flipped / scaled copies of the example, judged as specialisation probes;
    shaped as trace_warnings.apply_verdict reads it (``outputs`` are the probes' per-output verdicts)."""
    from ..inputs.path_probes import PATH_SCALES
    from ..inputs.tensors import set_label

    feeds = [{n: to_numpy(t) for n, t in s.items()} for s in ctx.path_input_sets]
    labels = [set_label("trace_path", f"example x {scale:g}", s, probe=True)
              for s, scale in enumerate(PATH_SCALES[:len(feeds)])]
    report = parity_report(ctx.onnx_path, feeds, ctx.path_reference_outputs, ctx.options.tolerance,
                           "the stripped module (the traced one) on sign-flipped / scaled examples", labels=labels)
    if "probes" in report:
        report["outputs"] = report["probes"]["outputs"]
    return report


def with_device_parity(report: dict[str, Any], model: Any, mode: str, keep: list[str], feeds: list, expected: list,
                       tolerance: Any, paths: dict[str, str], fix: bool = False,
                       reports: Reports | None = None, soc: str | None = None,
                       overflow: str | None = None, float_expected: list | None = None,
                       layers: bool = False, mixlist: dict[str, Any] | None = None,
                       custom: Any = None) -> dict[str, Any]:
    """Add the device-precision run to an fp32 parity report; the verdict needs both. ``soc``: the target SoC,
    whose overflow mode the emulation follows (``overflow`` replaces it: what an older bundle recorded).
    ``float_expected``: a Q/DQ graph's float-model outputs on the same sets (device_verdict.within_int8_noise).
    ``layers``: the device run's per-layer curve goes in ``report["layers"]`` (report.html's plot). ``mixlist``: the
    checked --modify-mixlist edits of the SoC's mixed-precision lists (a mixed mode's); ``custom``: the
    customize_dtypes entries (atc/customize.py), emulated with their own dtypes."""
    from ..options import ExportOptions, soc_model
    from .fix_precision import device_report, fix_precision
    from .int8_device import deq_scale_for
    from .precision import emulation_for

    model_of_soc = soc_model(soc or ExportOptions.soc_version)
    device_model = {**model_of_soc.to_dict(), "overflow_mode": overflow or model_of_soc.overflow}
    if emulation_for(mode).reduces == "none":
        report["precision"] = {"mode": mode, "emulated": emulation_for(mode).description, "keep_dtype": keep,
                               "device_model": device_model}
        return report
    names = [o["name"] for o in report["outputs"]]
    args = (feeds, expected, names, tolerance.device_policy(), paths)
    lists = mixed_lists(mode, device_model["soc_version"], mixlist, custom)
    device_args = {"overflow": device_model["overflow_mode"], "deq_scale": deq_scale_for(device_model["soc_version"]),
                   "float_expected": float_expected, "layers": layers, "lists": lists}
    if fix:
        device, kept = fix_precision(model, mode, keep, *args, **device_args)
        if reports is not None:
            fixed = device["precision"]["fix"]
            reports.precision_fix = PrecisionFix(list(fixed["kept"]), bool(fixed["fixed"]), bool(device["passed"]))
        device["fixed_by_keep_dtype"] = kept
    else:
        device = device_report(model, mode, keep, *args, **device_args)
    device["precision"]["device_model"] = device_model
    if lists is not None and emulation_for(mode).reduces == "mixed":
        device["precision"]["mixed_lists"] = lists.to_dict()
    if lists is not None and lists.custom:
        device["precision"]["customize_dtypes"] = [c.to_dict() for c in lists.custom]
    graph = {k: report[k] for k in ("passed", "outputs", "tolerance")}
    report.update(outputs=device["outputs"], precision=device["precision"], graph_fp32=graph,
                  device={"passed": device["passed"], "tolerance": device.get("tolerance"),
                          "outputs": device["outputs"]},
                  passed=bool(graph["passed"] and device["passed"]))
    for key in ("first_divergence", "fixed_by_keep_dtype", "layers"):
        if key in device:
            report[key] = device[key]
    return report


def to_numpy(t: Any) -> Any:
    return t.detach().cpu().numpy()


def mixed_lists(mode: str, soc: str, edits: dict[str, Any] | None, custom: Any = None) -> Any:
    """The SoC's mixed-precision lists with the user's edits and customize_dtypes entries, for a mode that reduces
    by them or entries to emulate (else None)."""
    from ..atc.mixlists import lists_for
    from .precision import emulation_for

    return lists_for(soc, edits, custom) if emulation_for(mode).reduces == "mixed" or custom else None


def stored_lists(precision: dict[str, Any]) -> Any:
    """The lists and customize_dtypes entries a report recorded (``precision.mixed_lists`` / ``customize_dtypes``),
    or None."""
    from ..atc.customize import parse
    from ..atc.mixlists import MixLists, lists_for

    stored, custom = precision.get("mixed_lists"), precision.get("customize_dtypes")
    if not stored and not custom:
        return None
    base = MixLists(stored["family"], frozenset(stored["white"]), frozenset(stored["black"]),
                    stored["modified"]) if stored else lists_for(None)
    return MixLists(base.family, base.white, base.black, base.edited, tuple(parse(custom)) if custom else ())
