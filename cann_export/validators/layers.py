"""The per-layer curve of report.html: every float value the graph makes, in graph order, as the device
computes it (the emulation of the precision mode, keep_dtype applied) against fp32, on one input set: cosine
and max relative error, with the node, op, PyTorch module and source line that made it. Polygraphy's
``--onnx-outputs mark all`` and msprobe's per-node table give the same numbers; a curve shows the knee.

The metrics are the device rule's (device_verdict.judge), computed in float32 (BLAS sums): a curve over
every value of a ResNet-50 stays within the report's time budget (benchmarks/bench_precision.py)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..graph import module_paths
from .device_verdict import DevicePolicy, cosine, judge
from .origin import float_values, value_pairs
from .precision import Emulator

MAX_POINTS = 20000  # values plotted, at most (a graph with more is cut at the end, and says so)


def curve(emulator: Emulator, keep: set[str], feed: dict[str, np.ndarray], policy: DevicePolicy,
          paths: dict[str, str], held: dict[str, np.ndarray] | None = None, input_set: int = 0) -> dict[str, Any]:
    """The curve (JSON-safe); ``held``: the device values of this feed a run already fetched."""
    order = float_values(emulator)[:MAX_POINTS]
    producer = {out: node for node in emulator.model.graph.node for out in node.output if out}
    points = []
    for tensor, e, r in value_pairs(emulator, keep, feed, order, held):
        node = producer[tensor]
        props = {p.key: p.value for p in node.metadata_props}
        points.append({"index": len(points), "tensor": tensor, "node": node.name, "op_type": node.op_type,
                       "module": paths.get(node.name), "source": props.get(module_paths.SOURCE),
                       **metrics(e, r, policy, emulator.emulation.epsilon, emulator.saturation),
                       "kept": node.name in keep})
    total = len(float_values(emulator))
    return {"mode": emulator.emulation.description, "input_set": input_set, "values": total, "points": points,
            "truncated": total > MAX_POINTS}


def one_sample(emulator: Emulator, feed: dict[str, np.ndarray]) -> int:
    """The batch size of ``feed`` where the graph's signature says it computes sample by sample: every input and
    output shares one symbolic first axis (Optimum's ``batch_size``) and the feed holds more than one sample there;
    else 0."""
    def first_axis(value: Any) -> str | None:
        dims = value.type.tensor_type.shape.dim
        return dims[0].dim_param or None if len(dims) else None

    inputs = emulator.graph_inputs
    axes = {first_axis(v) for v in [*inputs, *emulator.model.graph.output]}
    sizes = {np.shape(feed[i.name])[0] if i.name in feed and np.ndim(feed[i.name]) else 0 for i in inputs}
    size = sizes.pop() if len(sizes) == 1 else 0
    return size if inputs and len(axes) == 1 and None not in axes and size > 1 else 0


def sampled_curve(emulator: Emulator, keep: set[str], feed: dict[str, np.ndarray], policy: DevicePolicy,
                  paths: dict[str, str], input_set: int, outputs: tuple[list, list]) -> dict[str, Any]:
    """The curve on one sample of a batched set (one_sample): the one whose ``outputs`` (the emulated and reference
    outputs of the set) agree least. Its chunked runs hold values of each side at once, so a guided denoiser's curve
    at batch 2 held twice what one sample shows. The whole set where onnxruntime refuses one sample (a graph that
    fixed its batch inside: a Reshape to a traced size)."""
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument, RuntimeException

    batch = one_sample(emulator, feed)
    if not batch:
        return curve(emulator, keep, feed, policy, paths, input_set=input_set)
    at = worst_sample(*outputs)
    names = {i.name for i in emulator.graph_inputs}
    cut = {k: np.ascontiguousarray(v[at:at + 1]) if k in names else v for k, v in feed.items()}
    try:
        out = curve(emulator, keep, cut, policy, paths, input_set=input_set)
    except (Fail, InvalidArgument, RuntimeException):  # the graph's own batch: the whole set, as before
        return curve(emulator, keep, feed, policy, paths, input_set=input_set)
    return {**out, "sample": {"index": at, "of": batch}}


def worst_sample(actual: list[np.ndarray], expected: list[np.ndarray]) -> int:
    """The sample (first axis) whose outputs agree least with the reference (agreement)."""
    samples = min(len(a) for a in actual) if actual else 0
    return int(np.argmin([min(agreement(a[i], e[i]) for a, e in zip(actual, expected, strict=False))
                          for i in range(samples)])) if samples else 0


def agreement(actual: np.ndarray, expected: np.ndarray) -> float:
    """The cosine of two outputs in float64 (0.0 where their shapes differ)."""
    a, e = np.asarray(actual, dtype=np.float64).ravel(), np.asarray(expected, dtype=np.float64).ravel()
    return cosine(a, e) if a.shape == e.shape else 0.0


def metrics(actual: np.ndarray, expected: np.ndarray, policy: DevicePolicy, epsilon: float,
            saturation: float | None) -> dict[str, Any]:
    """cosine, max_rel, max_abs, overflow and passed of one value, by the device rule."""
    if actual.shape != expected.shape or not np.issubdtype(expected.dtype, np.floating) or expected.size < 4096:
        v = judge(actual, expected, policy, epsilon, saturation)  # small or odd values: the rule itself
        return {"cosine": _finite(v["cosine"]), "max_rel": _finite(v["max_rel"]), "max_abs": _finite(v["max_abs"]),
                "overflow": bool(v["non_finite"] or v["saturated"]), "passed": bool(v["passed"])}
    a = actual.astype(np.float32, copy=False).ravel()
    b = expected.astype(np.float32, copy=False).ravel()
    with np.errstate(over="ignore"):  # an overflowing float32 sum is redone in float64 below
        aa, bb = float(np.dot(a, a)), float(np.dot(b, b))
    non_finite = False
    if not (np.isfinite(aa) and np.isfinite(bb)):
        fin_a, fin_b = np.isfinite(a), np.isfinite(b)
        non_finite = bool(np.any(~fin_a & fin_b))
        both = fin_a & fin_b
        a, b = a[both], b[both]
        with np.errstate(over="ignore"):
            aa, bb = float(np.dot(a, a)), float(np.dot(b, b))
    if not (np.isfinite(aa) and np.isfinite(bb)):  # finite values past 1.8e19 (a -3.4e38 mask fill): squares
        a, b = a.astype(np.float64), b.astype(np.float64)  # overflow float32's sums, never float64's
        aa, bb = float(np.dot(a, a)), float(np.dot(b, b))
    na, nb = np.sqrt(aa), np.sqrt(bb)
    err = a - b
    ee = float(np.dot(err, err))
    np.abs(err, out=err)
    max_abs = float(err.max()) if err.size else 0.0
    peak = max(float(b.max()), -float(b.min())) if b.size else 0.0
    cos = 0.0 if non_finite else 1.0 if na == nb == 0.0 else 0.0 if na == 0.0 or nb == 0.0 else \
        float(np.clip(float(np.dot(a, b)) / (na * nb), -1.0, 1.0))
    rel_rms = float(np.sqrt(ee / bb)) if bb > 0 else 0.0
    saturated = saturation is not None and _saturated(a, b, saturation, epsilon)
    floor = max(policy.atol, epsilon * peak)
    failed = (non_finite or saturated or cos < policy.fail_cosine or (cos < policy.min_cosine and max_abs > floor)
              or (rel_rms > policy.max_rel_rms and max_abs > floor))
    return {"cosine": cos, "max_rel": max_abs / peak if peak > 0 else 0.0, "max_abs": max_abs,
            "overflow": bool(non_finite or saturated), "passed": not failed}


def _saturated(a: np.ndarray, b: np.ndarray, saturation: float, epsilon: float) -> bool:
    """Whether a device value sits at the saturation bound where fp32 is past it (finite ``a``): two reductions
    first, as most values never reach the bound (the four temporaries of the test itself cost a third of a large
    value's metrics)."""
    if not a.size or max(float(a.max()), -float(a.min())) < saturation:
        return False
    return bool(np.any((np.abs(a) == saturation) & (np.abs(b) > saturation * (1 + 2 * epsilon))))


def _finite(x: float) -> float:
    x = float(x)
    return x if np.isfinite(x) else 0.0
