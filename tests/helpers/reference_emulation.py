"""A second, independent emulation of the device rule, for tests: the ONNX graph is interpreted node by
node in numpy (onnx.reference), and each value is converted with numpy's float16 exactly where the rule
says, with no Cast graph and no onnxruntime.

The rule (force_fp16 with keep_dtype): a node not kept reads its float inputs as fp16 (whatever
produced them: a graph input, a weight, a constant, a kept node), computes, and writes fp16; a kept
node reads fp32 (an fp16 value converts exactly), keeps its weights and constants fp32, writes fp32.

The SoC's overflow mode decides what an fp16 value past the range becomes on the device: "inf_nan" is IEEE
(inf), "saturation" is +-65504, with NaN set to 0. Whatever the mode, ATC converts constants on the host
(weights, Constant nodes, and what nodes compute from constants and shapes alone, folded in fp32 first), and
its conversion saturates: float32 min becomes -65504, never -inf.
"""
from __future__ import annotations

import numpy as np
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

SHAPE_INPUTS = {"Resize": (1, 2), "Upsample": (1,), "Range": (0, 1, 2)}
FP16_MAX = 65504.0


def _to_fp16(value, saturate: bool):
    """fp32 -> fp16 -> fp32; ``saturate``: past the range is +-65504 and NaN is 0 (else IEEE)."""
    if not (isinstance(value, np.ndarray) and value.dtype == np.float32):
        return value
    with np.errstate(over="ignore", invalid="ignore"):
        half = value.astype(np.float16).astype(np.float32)
    if saturate:
        half = np.nan_to_num(half, nan=0.0, posinf=FP16_MAX, neginf=-FP16_MAX)
    return half


def _atc_constant(value):
    """A constant as ATC's host conversion writes it: saturated to +-65504, never inf."""
    if not (isinstance(value, np.ndarray) and value.dtype == np.float32):
        return value
    return np.clip(value, -FP16_MAX, FP16_MAX).astype(np.float16).astype(np.float32)


def run_device(model, feed: dict, keep: set[str], overflow: str = "inf_nan") -> list[np.ndarray]:
    """The graph's outputs as the device computes them under force_fp16 with ``keep`` in fp32."""
    env = values(model, feed, keep, overflow)
    return [env[o.name] for o in model.graph.output]


def _constants(model) -> set[str]:
    """Names whose values are known without the graph's inputs (ATC folds them before the run)."""
    known = {i.name for i in model.graph.initializer}
    changed = True
    while changed:
        changed = False
        for node in model.graph.node:
            if set(node.output) <= known:
                continue
            inputs = [i for i in node.input if i]
            if node.op_type in ("Constant", "Shape", "Size") or (inputs and set(inputs) <= known):
                known.update(node.output)
                changed = True
    return known


def values(model, feed: dict, keep: set[str], overflow: str = "inf_nan") -> dict[str, np.ndarray]:
    """Every value of the graph (inputs, weights, intermediates, outputs) as the device holds it."""
    saturate = overflow == "saturation"
    host = _constants(model)
    env = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    env.update({k: np.asarray(v) for k, v in feed.items()})
    opsets = {o.domain: o.version for o in model.opset_import}
    for node in model.graph.node:
        kept = node.name in keep or node.op_type == "Constant" or set(node.output) <= host
        skip = SHAPE_INPUTS.get(node.op_type, ())
        args = []
        for k, name in enumerate(node.input):
            value = env[name] if name else None
            if not kept and k not in skip:
                value = _atc_constant(value) if name in host else _to_fp16(value, saturate)
            args.append(value)
        names = [f"in{k}" for k in range(len(node.input))]
        evaluator = _single(node, names, opsets)
        with np.errstate(all="ignore"):
            outs = evaluator.run(None, {n: a for n, a in zip(names, args, strict=False) if a is not None})
        for name, value in zip(node.output, outs, strict=False):
            env[name] = value if kept else _to_fp16(value, saturate)
    return env


def _single(node, names, opsets):
    """A one-node model whose inputs are ``in0, in1, ...`` (empty optional inputs stay empty)."""
    from onnx import helper

    copy = helper.make_node(node.op_type, [n if i else "" for n, i in zip(names, node.input, strict=False)],
                            [f"out{k}" for k in range(len(node.output))], domain=node.domain or None)
    copy.attribute.extend(node.attribute)
    return ReferenceEvaluator(copy, opsets=opsets)
