"""A FLOPs estimate per node from the graph's inferred shapes, to say what share of the work a keep set
holds in fp32: the cube ops (MatMul, Gemm, Conv, ConvTranspose) as 2 x multiply-accumulates, every other
node as one operation per output element (an estimate: it weighs keep sets, it is no profiler)."""
from __future__ import annotations

from typing import Any

import numpy as np


def _shapes(model: Any, input_shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, list[int]]:
    """Static shapes (-1 for an unknown dim) of every value shape inference can type, weights included; a dynamic
    graph's at ``input_shapes``."""
    from ..graph.onnx_helpers import inferred_values

    out = {}
    for v in inferred_values(model, input_shapes):
        t = v.type.tensor_type
        if t.HasField("shape"):
            out[v.name] = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
    return out


def _count(shape: list[int] | None) -> int:
    return int(np.prod(shape)) if shape is not None and all(d >= 0 for d in shape) else 0


def _node_flops(node: Any, shapes: dict[str, list[int]]) -> int:
    out = shapes.get(node.output[0]) if node.output else None
    first = shapes.get(node.input[0]) if node.input else None
    second = shapes.get(node.input[1]) if len(node.input) > 1 else None
    if node.op_type in ("MatMul", "Gemm") and first:
        trans_a = any(a.name == "transA" and a.i for a in node.attribute)
        k = first[-2] if trans_a and len(first) >= 2 else first[-1]
        return 2 * _count(out) * max(k, 0)
    if node.op_type == "Conv" and second:
        return 2 * _count(out) * _count(second[1:])  # weight [C_out, C_in/group, *kernel]
    if node.op_type == "ConvTranspose" and second and first:
        return 2 * _count(first) * _count(second[1:])  # weight [C_in, C_out/group, *kernel]
    return _count(out)


def node_flops(model: Any, input_shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, int]:
    """``{node name: estimated FLOPs}`` for every named node (Constants count 0); a dynamic graph's at
    ``input_shapes`` (its dynamic dims are otherwise unknown, and their nodes would weigh nothing)."""
    shapes = _shapes(model, input_shapes)
    return {n.name: 0 if n.op_type == "Constant" else _node_flops(n, shapes) for n in model.graph.node if n.name}


def share(kept: list[str] | set[str], flops: dict[str, int]) -> float:
    """The share of the graph's estimated FLOPs in ``kept`` (0.0 for a graph of unknown shapes)."""
    total = sum(flops.values())
    return sum(flops.get(n, 0) for n in set(kept)) / total if total else 0.0
