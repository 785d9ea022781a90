"""A second, independent emulation of the device rule, for tests: the ONNX graph is interpreted node by
node in numpy (onnx.reference), and each value is converted with numpy's float16 exactly where the rule
says, with no Cast graph and no onnxruntime.

The rule (force_fp16 with keep_dtype): a node not kept reads its float inputs as fp16 (whatever
produced them: a graph input, a weight, a constant, a kept node), computes, and writes fp16; a kept
node reads fp32 (an fp16 value converts exactly), keeps its weights and constants fp32, writes fp32.
"""
from __future__ import annotations

import numpy as np
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

SHAPE_INPUTS = {"Resize": (1, 2), "Upsample": (1,), "Range": (0, 1, 2)}


def _fp16(value):
    if isinstance(value, np.ndarray) and value.dtype == np.float32:
        with np.errstate(over="ignore", invalid="ignore"):
            return value.astype(np.float16).astype(np.float32)
    return value


def run_device(model, feed: dict, keep: set[str]) -> list[np.ndarray]:
    """The graph's outputs as the device computes them under force_fp16 with ``keep`` in fp32."""
    env = values(model, feed, keep)
    return [env[o.name] for o in model.graph.output]


def values(model, feed: dict, keep: set[str]) -> dict[str, np.ndarray]:
    """Every value of the graph (inputs, weights, intermediates, outputs) as the device holds it."""
    env = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    env.update({k: np.asarray(v) for k, v in feed.items()})
    opsets = {o.domain: o.version for o in model.opset_import}
    for node in model.graph.node:
        kept = node.name in keep or node.op_type == "Constant"
        skip = SHAPE_INPUTS.get(node.op_type, ())
        args = []
        for k, name in enumerate(node.input):
            value = env[name] if name else None
            args.append(value if kept or k in skip else _fp16(value))
        names = [f"in{k}" for k in range(len(node.input))]
        evaluator = _single(node, names, opsets)
        with np.errstate(all="ignore"):
            outs = evaluator.run(None, {n: a for n, a in zip(names, args, strict=False) if a is not None})
        for name, value in zip(node.output, outs, strict=False):
            env[name] = value if kept else _fp16(value)
    return env


def _single(node, names, opsets):
    """A one-node model whose inputs are ``in0, in1, ...`` (empty optional inputs stay empty)."""
    from onnx import helper

    copy = helper.make_node(node.op_type, [n if i else "" for n, i in zip(names, node.input, strict=False)],
                            [f"out{k}" for k in range(len(node.output))], domain=node.domain or None)
    copy.attribute.extend(node.attribute)
    return ReferenceEvaluator(copy, opsets=opsets)
