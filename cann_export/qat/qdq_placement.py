"""Q/DQ where AMCT adapts it, found by graph structure, for every source of a quantized graph (our QAT, torch.ao
eager QAT, torchao PT2E): the one graph-side lowering step, after onnxsim.

AMCT's convert_qat_model (docs/research/amct.md) turns a QuantizeLinear -> DequantizeLinear pair into
AscendQuant / AscendDequant only on the activation input of Conv, ConvTranspose, Gemm and MatMul with a
constant weight (whose own pair is quantized offline), and on the inputs of Add. This pass:
- writes every weight as the float constant -> QuantizeLinear -> DequantizeLinear pair AMCT reads (an int8
  constant -> DequantizeLinear, as torchao PT2E writes it, becomes the float values it stands for);
- folds a Transpose between a per-tensor weight pair and its MatMul into the constant (torch.onnx writes a
  3-D Linear as Transpose(W) -> MatMul);
- removes the activation pairs no adapted op reads (what reads them reads the float value: the rounding they
  stood for is not what the device computes after AMCT);
- folds the weight pair of an op left without an activation pair into its constant (the same values);
- writes uint8 pairs as int8 (zero point - 128, the same values) and Constant-node scales as initializers;
- removes the BatchNormalization nodes that compute the identity (a norm-act layer whose statistics were
  folded into its conv).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

ADAPTED_ACTIVATION = {"Conv": (0,), "ConvTranspose": (0,), "Gemm": (0,), "MatMul": (0,), "Add": (0, 1)}
WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")


class _Graph:
    def __init__(self, model: Any):
        from onnx import numpy_helper

        self.graph = model.graph
        self.inits = {t.name: t for t in self.graph.initializer}
        self.consts: dict[str, np.ndarray] = {}
        for node in self.graph.node:  # Constant nodes (the TorchScript exporter's scales) read as constants
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self.consts[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        self.outputs = {o.name for o in self.graph.output}
        self.index()

    def index(self) -> None:
        self.producer = {o: n for n in self.graph.node for o in n.output}
        self.readers: dict[str, list[tuple[Any, int]]] = defaultdict(list)
        for n in self.graph.node:
            for i, name in enumerate(n.input):
                self.readers[name].append((n, i))

    def const(self, name: str) -> np.ndarray | None:
        from onnx import numpy_helper

        if name in self.inits:
            return numpy_helper.to_array(self.inits[name])
        return self.consts.get(name)

    def add_init(self, array: np.ndarray, name: str) -> str:
        from onnx import numpy_helper

        name = self.fresh(name)
        tensor = numpy_helper.from_array(array, name)
        self.graph.initializer.append(tensor)
        self.inits[name] = tensor
        return name

    def fresh(self, base: str) -> str:
        taken = set(self.inits) | set(self.producer) | {i.name for i in self.graph.input}
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        return name


def _axis(node: Any) -> int | None:
    return next((a.i for a in node.attribute if a.name == "axis"), None)


def weight_pair(g: _Graph, name: str) -> tuple[Any, Any] | None:
    """(Q, DQ) when ``name`` is the output of DequantizeLinear(QuantizeLinear(constant))."""
    dq = g.producer.get(name)
    if dq is None or dq.op_type != "DequantizeLinear":
        return None
    q = g.producer.get(dq.input[0])
    if q is None or q.op_type != "QuantizeLinear" or g.const(q.input[0]) is None:
        return None
    return q, dq


def _requantize_int8_weights(g: _Graph) -> int:
    """int8 constant -> DequantizeLinear becomes float constant -> QuantizeLinear -> DequantizeLinear."""
    from onnx import helper

    count = 0
    for dq in list(g.graph.node):
        if dq.op_type != "DequantizeLinear" or g.const(dq.input[0]) is None:
            continue
        q_int = g.const(dq.input[0])
        scale = g.const(dq.input[1])
        zero = g.const(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else np.zeros((), q_int.dtype)
        if scale is None or zero is None or q_int.dtype != np.int8:
            continue
        axis = _axis(dq)
        shape = [1] * q_int.ndim
        if scale.ndim == 1 and q_int.ndim:
            shape[axis if axis is not None else 1] = -1
        values = ((q_int.astype(np.float32) - zero.reshape(shape if zero.ndim else ()).astype(np.float32))
                  * scale.reshape(shape if scale.ndim else ())).astype(np.float32)
        w = g.add_init(values, f"{dq.input[0]}_float")
        q_out = g.fresh(f"{dq.input[0]}_q")
        q = helper.make_node("QuantizeLinear", [w, *dq.input[1:]], [q_out], name=g.fresh(f"{dq.name}_quant"))
        if axis is not None:
            q.attribute.append(helper.make_attribute("axis", axis))
        g.graph.node.insert(list(g.graph.node).index(dq), q)
        dq.input[0] = q_out
        g.index()
        count += 1
    return count


def _fold_weight_transposes(g: _Graph) -> int:
    """Transpose(DQ(Q(W))) -> MatMul, per tensor, becomes DQ(Q(W^T)) -> MatMul."""
    from onnx import helper

    count = 0
    for t in list(g.graph.node):
        if t.op_type != "Transpose":
            continue
        pair = weight_pair(g, t.input[0])
        readers = g.readers.get(t.output[0], [])
        if pair is None or not readers or any(r.op_type != "MatMul" or i != 1 for r, i in readers):
            continue
        q, dq = pair
        scale = g.const(q.input[1])
        if scale is None or scale.size != 1:
            continue
        w = g.const(q.input[0])
        perm = next((list(a.ints) for a in t.attribute if a.name == "perm"), list(range(w.ndim))[::-1])
        wt = g.add_init(np.ascontiguousarray(np.transpose(w, perm)), f"{q.input[0]}_transposed")
        q2 = helper.make_node("QuantizeLinear", [wt, *q.input[1:]], [g.fresh(f"{wt}_q")], name=g.fresh(f"{q.name}_t"))
        dq2 = helper.make_node("DequantizeLinear", [q2.output[0], *dq.input[1:]], [t.output[0]],
                               name=g.fresh(f"{dq.name}_t"))
        at = list(g.graph.node).index(t)
        g.graph.node.remove(t)
        g.graph.node.insert(at, dq2)
        g.graph.node.insert(at, q2)
        g.index()
        count += 1
    return count


def _adapted(g: _Graph, reader: Any, index: int) -> bool:
    """AMCT adapts the activation pair of a compute op whose weight has its own pair (MatMul: a 2-D constant
    weight), and the pairs on Add's inputs."""
    if index not in ADAPTED_ACTIVATION.get(reader.op_type, ()):
        return False
    if reader.op_type in WEIGHTED:
        pair = weight_pair(g, reader.input[1]) if len(reader.input) > 1 else None
        return pair is not None and (reader.op_type != "MatMul" or g.const(pair[0].input[0]).ndim == 2)
    return True


def _drop_unadapted_pairs(g: _Graph) -> list[str]:
    """Activation Q -> DQ pairs: readers AMCT does not adapt read the pair's float input instead."""
    from onnx import helper

    removed = []
    for dq in list(g.graph.node):
        if dq.op_type != "DequantizeLinear":
            continue
        q = g.producer.get(dq.input[0])
        if q is None or q.op_type != "QuantizeLinear" or g.const(q.input[0]) is not None:
            continue
        source = q.input[0]
        moved = False
        for reader, i in g.readers.get(dq.output[0], []):
            if not _adapted(g, reader, i):
                reader.input[i] = source
                moved = True
        if dq.output[0] in g.outputs:  # a graph output keeps its name: the float value under it
            at = list(g.graph.node).index(dq)
            g.graph.node.remove(dq)
            g.graph.node.insert(at, helper.make_node("Identity", [source], [dq.output[0]], name=dq.name))
            moved = True
        if moved:
            removed.append(dq.name or dq.output[0])
            g.index()
    return removed


def _fold_orphan_weight_pairs(g: _Graph) -> list[str]:
    """A weight pair whose op has no activation pair (AMCT adapts neither): the op reads the dequantized
    constant, the same values in float."""
    folded = []
    for node in list(g.graph.node):
        if node.op_type not in WEIGHTED or len(node.input) < 2:
            continue
        pair = weight_pair(g, node.input[1])
        act = g.producer.get(node.input[0])
        if pair is None or (act is not None and act.op_type == "DequantizeLinear"):
            continue
        q, dq = pair
        node.input[1] = g.add_init(_dequantized(g, q, dq), f"{q.input[0]}_dequantized")
        folded.append(node.name or node.output[0])
        g.index()
    return folded


def _dequantized(g: _Graph, q: Any, dq: Any) -> np.ndarray:
    """DequantizeLinear(QuantizeLinear(w)) of a constant, computed as ONNX defines it."""
    w, scale = g.const(q.input[0]).astype(np.float32), g.const(q.input[1]).astype(np.float32)
    zero = g.const(q.input[2]) if len(q.input) > 2 and q.input[2] else np.zeros((), np.uint8)
    shape = [1] * w.ndim
    if scale.ndim == 1 and scale.size > 1:
        shape[_axis(q) if _axis(q) is not None else 1] = -1
    scale = scale.reshape(shape if scale.size > 1 else ())
    z = zero.astype(np.float32).reshape(shape if zero.size > 1 else ())
    info = np.iinfo(zero.dtype)
    quantized = np.clip(np.rint(w / scale) + z, info.min, info.max)
    return ((quantized - z) * scale).astype(np.float32)


def _uint8_to_int8(g: _Graph) -> int:
    """uint8 pairs (torch.ao's quint8 activations) as int8 with the zero point moved by -128: the same
    values, in the one type AMCT documents."""
    count = 0
    shifted: dict[str, str] = {}
    for node in g.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or len(node.input) < 3:
            continue
        zero = g.const(node.input[2])
        if zero is None or zero.dtype != np.uint8:
            continue
        if node.input[2] not in shifted:
            shifted[node.input[2]] = g.add_init((zero.astype(np.int16) - 128).astype(np.int8), f"{node.input[2]}_int8")
        node.input[2] = shifted[node.input[2]]
        count += 1
    return count


def _hoist_constants(g: _Graph) -> None:
    """Scales and zero points held by Constant nodes (the TorchScript exporter's) become initializers."""
    from onnx import numpy_helper

    for node in list(g.graph.node):
        if node.op_type == "Constant" and node.output[0] in g.consts and g.readers.get(node.output[0]) and all(
                r.op_type in ("QuantizeLinear", "DequantizeLinear") for r, _ in g.readers[node.output[0]]):
            tensor = numpy_helper.from_array(g.consts.pop(node.output[0]), node.output[0])
            g.graph.node.remove(node)
            g.graph.initializer.append(tensor)
            g.inits[tensor.name] = tensor
    g.index()


def _drop_identity_batchnorms(g: _Graph) -> int:
    count = 0
    for bn in list(g.graph.node):
        if bn.op_type != "BatchNormalization" or len(bn.output) != 1:
            continue
        params = [g.const(n) for n in bn.input[1:5]]
        if any(p is None for p in params):
            continue
        scale, bias, mean, var = params
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        if not (np.all(scale == 1) and np.all(bias == 0) and np.all(mean == 0) and np.all(var + eps == 1)):
            continue
        for reader, i in g.readers.get(bn.output[0], []):
            reader.input[i] = bn.input[0]
        if bn.output[0] in g.outputs:
            continue
        g.graph.node.remove(bn)
        g.index()
        count += 1
    return count


def _prune(model: Any) -> None:
    """Nodes nothing reads (the pairs whose readers all moved), then unused initializers."""
    from ..graph.onnx_helpers import prune_initializers

    graph = model.graph
    live = {o.name for o in graph.output}
    keep = []
    for node in reversed(list(graph.node)):
        if any(o in live for o in node.output):
            keep.append(node)
            live.update(node.input)
    del graph.node[:]
    graph.node.extend(reversed(keep))
    prune_initializers(model)


def quantized_ops(model: Any) -> list[Any]:
    """Compute nodes with a Q/DQ pair on their activation and on their constant weight (what AMCT quantizes)."""
    g = _Graph(model)
    found = []
    for node in g.graph.node:
        if node.op_type not in WEIGHTED or len(node.input) < 2 or weight_pair(g, node.input[1]) is None:
            continue
        act = g.producer.get(node.input[0])
        if act is not None and act.op_type == "DequantizeLinear":
            found.append(node)
    return found


def place_for_amct(model: Any) -> dict[str, Any]:
    """Rewrite ``model`` (in place) into the form AMCT adapts; returns what was changed."""
    g = _Graph(model)
    _hoist_constants(g)
    report = {"weights_requantized": _requantize_int8_weights(g),
              "weight_transposes_folded": _fold_weight_transposes(g),
              "identity_batchnorms_removed": _drop_identity_batchnorms(g),
              "uint8_rewritten_as_int8": _uint8_to_int8(g)}
    report["unadapted_pairs_removed"] = _drop_unadapted_pairs(g)
    report["weight_pairs_folded"] = _fold_orphan_weight_pairs(g)  # ops left in float (no activation pair)
    _prune(model)
    quantized = {o for n in model.graph.node if n.op_type == "QuantizeLinear" for o in n.output}
    stale = [v for v in model.graph.value_info if v.name in quantized]  # int8 now where it said uint8
    for v in stale:
        model.graph.value_info.remove(v)
    report["quantized_ops"] = len(quantized_ops(model))
    return report
