"""Graphs that really differ from their model, made from a correct export: fp32 parity must refuse each.
Each function takes an ``onnx.ModelProto`` and returns a changed copy (or None when the graph has nothing to
change), for the calibration (tests/helpers/fp32_calibration.py) and tests/verdict/test_parity_probes.py."""
from __future__ import annotations

import copy

import numpy as np

WEIGHT_OPS = ("Conv", "MatMul", "Gemm")
ACTIVATIONS = ("Relu", "HardSwish", "HardSigmoid", "Sigmoid", "Gelu", "Erf", "Tanh", "Softmax", "Silu")


def _weights(model) -> list[tuple[int, str]]:
    """(node index, initializer name) of the float weights read by Conv / MatMul / Gemm, in graph order."""
    inits = {i.name for i in model.graph.initializer}
    return [(k, name) for k, node in enumerate(model.graph.node) if node.op_type in WEIGHT_OPS
            for name in node.input[1:2] if name in inits]


def wrong_constant(model, factor: float = 1.01):
    """A weight in the middle of the graph scaled by ``factor`` (a mis-folded constant, a wrong scale)."""
    from onnx import numpy_helper

    weights = _weights(model)
    if not weights:
        return None
    _, name = weights[len(weights) // 2]
    out = copy.deepcopy(model)
    for init in out.graph.initializer:
        if init.name == name:
            init.CopyFrom(numpy_helper.from_array((numpy_helper.to_array(init) * factor).astype(np.float32), name))
    return out


def dropped_op(model):
    """The first activation (one input, one output) replaced by Identity: an op the exporter lost."""
    from onnx import helper

    out = copy.deepcopy(model)
    for k, node in enumerate(out.graph.node):
        if node.op_type in ACTIVATIONS and len(node.input) == 1 and len(node.output) == 1:
            out.graph.node[k].CopyFrom(helper.make_node("Identity", list(node.input), list(node.output), node.name))
            return out
    return None


TAMPERS = {"weight x1.01": lambda m: wrong_constant(m, 1.01), "weight x1.001": lambda m: wrong_constant(m, 1.001),
           "dropped activation": dropped_op}
