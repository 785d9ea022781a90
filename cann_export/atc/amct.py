"""AMCT's rules for a Q/DQ (QAT) graph, checked without AMCT.

ATC does not parse QuantizeLinear/DequantizeLinear: AMCT's ``amct_onnx.convert_qat_model`` first replaces each
Q/DQ pair with AscendQuant/AscendDequant (see ``amct_run``). It adapts only the documented patterns
(docs/research/amct.md, section 1): a pair on the activation (input 0) and one on the constant weight (input 1)
of Conv, ConvTranspose, Gemm or single-input MatMul; pairs on the inputs of Add; a lone QuantizeLinear as a
graph output. Factors must be equal within a pair, int8 (signed) only, float32 input; activations and Add per
tensor; weights symmetric (zero point 0), per channel only on the output-channel axis of Conv/ConvTranspose.
``check_qdq`` lists every pair that breaks one, naming the ONNX node and the PyTorch module, and what to change.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ..graph import module_paths as mp
from .findings import DEFAULT_DOMAINS, QDQ, _Findings, _graph_opset

COMPUTE = ("Conv", "ConvTranspose", "Gemm", "MatMul")  # scenario 1: Q/DQ on the activation and on the weight
OUTPUT_CHANNEL_AXIS = {"Conv": 0, "ConvTranspose": 1}  # per-channel weights only here (ONNX weight layouts)
INT8, UINT8 = 3, 2  # onnx.TensorProto data types
FLOAT = 1
ADAPTED = ("it adapts the activation (input 0) and constant weight (input 1) of Conv, ConvTranspose, Gemm and "
           "MatMul, and the inputs of Add")


@dataclass(frozen=True)
class _Const:
    """A constant tensor of the graph (an initializer or a Constant node's value)."""

    tensor: Any  # onnx.TensorProto

    @property
    def dims(self) -> tuple[int, ...]:
        return tuple(self.tensor.dims)

    @property
    def numel(self) -> int:
        return math.prod(self.dims)

    def array(self) -> Any:
        """The values, or None when they live in external data not loaded here (never read from disk)."""
        from onnx import numpy_helper
        from onnx.external_data_helper import uses_external_data

        if uses_external_data(self.tensor):
            return None
        try:
            return numpy_helper.to_array(self.tensor)
        except Exception:  # noqa: BLE001 - a malformed tensor: its values are unknown, not a finding here
            return None


def _constant_value(node: Any) -> Any:
    from onnx import TensorProto, helper

    for attr in node.attribute:
        if attr.name == "value" and attr.HasField("t"):
            return attr.t
        if attr.name == "value_float":
            return helper.make_tensor("", TensorProto.FLOAT, [], [attr.f])
        if attr.name == "value_floats":
            return helper.make_tensor("", TensorProto.FLOAT, [len(attr.floats)], list(attr.floats))
        if attr.name == "value_int":
            return helper.make_tensor("", TensorProto.INT64, [], [attr.i])
        if attr.name == "value_ints":
            return helper.make_tensor("", TensorProto.INT64, [len(attr.ints)], list(attr.ints))
    return None


def _attr(node: Any, name: str, default: Any = None) -> Any:
    from onnx import helper

    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


class _Graph:
    """One graph's constants, producers and consumers (outer-scope constants included for subgraphs)."""

    def __init__(self, graph: Any, outer: dict[str, _Const]):
        self.graph = graph
        self.consts = dict(outer)
        self.consts.update({t.name: _Const(t) for t in graph.initializer})
        self.producer: dict[str, Any] = {}
        self.consumers: dict[str, list[tuple[Any, int]]] = defaultdict(list)
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS and node.output:
                value = _constant_value(node)
                if value is not None:
                    self.consts[node.output[0]] = _Const(value)
            for out in node.output:
                self.producer[out] = node
            for i, name in enumerate(node.input):
                if name:
                    self.consumers[name].append((node, i))
        self.outputs = {o.name for o in graph.output}

    def const(self, node: Any, index: int) -> _Const | None:
        name = node.input[index] if len(node.input) > index else ""
        return self.consts.get(name) if name else None


def _is(node: Any, *ops: str) -> bool:
    return node is not None and node.op_type in ops and node.domain in DEFAULT_DOMAINS


def _dtype(code: int) -> str:
    from onnx import TensorProto

    try:
        return TensorProto.DataType.Name(code).lower()
    except ValueError:
        return f"dtype {code}"


def check_qdq(model: Any, module_paths: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Every Q/DQ of ``model`` (an onnx.ModelProto, subgraphs included) against AMCT's convert_qat_model
    rules; a finding per broken rule (severity ``error``), naming the node and the PyTorch module."""
    checker = _Checker(module_paths or {})
    checker.walk(model.graph, {})
    opset = _graph_opset(model)
    if checker.axis_nodes and opset is not None and opset < 13:
        node = checker.axis_nodes[0]
        checker.add("amct-opset", f"{len(checker.axis_nodes)} QuantizeLinear/DequantizeLinear node(s) are per "
                    f"channel (an axis), which needs ONNX opset 13 or later, and the graph is at opset {opset}: "
                    "export with --opset 13 or later", [node])
    return list(checker.findings)


class _Checker:
    def __init__(self, module_paths: dict[str, str]):
        self.paths = module_paths
        self.findings = _Findings()
        self.axis_nodes: list[Any] = []

    def add(self, rule: str, message: str, candidates: list[Any]) -> None:
        """One error finding at the first candidate node from a submodule, else from the root module, else the
        first candidate (Q/DQ nodes may carry no module; the op they feed does)."""
        nodes = [n for n in candidates if n is not None]
        paths = [self.paths.get(n.name, next((p.value for p in n.metadata_props if p.key == mp.KEY), None))
                 for n in nodes]
        ranked = [n for n, p in zip(nodes, paths, strict=True) if p] + \
            [n for n, p in zip(nodes, paths, strict=True) if p == ""]
        self.findings.add("error", rule, message, (ranked or nodes or [None])[0], self.paths)

    def walk(self, graph: Any, outer: dict[str, _Const]) -> None:
        g = _Graph(graph, outer)
        roles: dict[str, dict[int, Any]] = defaultdict(dict)  # compute node name -> {input index: DQ node}
        compute: dict[str, Any] = {}
        for node in graph.node:
            if _is(node, *QDQ):
                scale = g.const(node, 1)
                if _attr(node, "axis") is not None or scale is not None and scale.numel > 1:
                    self.axis_nodes.append(node)
            if _is(node, "QuantizeLinear"):
                self._quantize(g, node)
            elif _is(node, "DequantizeLinear"):
                q = g.producer.get(node.input[0]) if node.input else None
                if not _is(q, "QuantizeLinear"):
                    self._lone_dequantize(g, node)
                    continue
                for user, index in self._pair(g, q, node):
                    roles[user.name][index] = node
                    compute[user.name] = user
            for attr in node.attribute:  # If/Loop/Scan bodies: the same rules, outer constants visible
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    self.walk(sub, g.consts)
        for name, found in roles.items():
            node = compute[name]
            lone = [i for i in (0, 1) if i not in found and len(node.input) > i
                    and _is(g.producer.get(node.input[i]), "DequantizeLinear")]  # reported as unpaired already
            if set(found) != {0, 1} and not lone:
                have, lack = ("weight (input 1)", "activation (input 0)") if 1 in found else \
                    ("activation (input 0)", "weight (input 1)")
                self.add("amct-both-inputs",
                         f"only the {have} of this {node.op_type} has a Q/DQ pair: AMCT's convert_qat_model adapts a "
                         f"{node.op_type} with Q/DQ on both its activation and its weight; quantize its {lack} too, "
                         "or remove the pair so it stays float", [node, *found.values()])

    # ------------------------------------------------------------------ single nodes

    def _quantize(self, g: _Graph, q: Any) -> None:
        users = g.consumers.get(q.output[0], []) if q.output else []
        others = [(n, i) for n, i in users if not _is(n, "DequantizeLinear")]
        if others:
            shown = ", ".join(f"{n.op_type} {n.name!r}" for n, _ in others[:3])
            self.add("amct-unpaired",
                     f"QuantizeLinear {q.name!r} feeds {shown} directly: AMCT's convert_qat_model takes a "
                     "QuantizeLinear only followed by its DequantizeLinear (or alone as a graph output); add the "
                     "DequantizeLinear, or remove the QuantizeLinear", [others[0][0], q, g.producer.get(q.input[0])])
        elif not users and q.output and q.output[0] in g.outputs:  # scenario 3: becomes one AscendQuant
            self._int8(g, q, None, [q, g.producer.get(q.input[0])])
            self._per_tensor(g, q, None, "the graph output", [q, g.producer.get(q.input[0])])
        elif not users:
            self.add("amct-unpaired", f"QuantizeLinear {q.name!r} feeds nothing: remove it", [q])

    def _lone_dequantize(self, g: _Graph, dq: Any) -> None:
        users = [n for n, _ in g.consumers.get(dq.output[0], [])] if dq.output else []
        source = dq.input[0] if dq.input else ""
        if source in g.consts:
            dtype = _dtype(g.consts[source].tensor.data_type)
            what = (f"the {dtype} constant {source!r} reaches DequantizeLinear {dq.name!r} without a QuantizeLinear "
                    "(a weight stored already quantized): AMCT's convert_qat_model needs the float32 weight -> "
                    "QuantizeLinear -> DequantizeLinear (fake quantization, equal factors); store the float32 "
                    "weight (int8 values times the scale) and quantize it in the graph")
        else:
            what = (f"DequantizeLinear {dq.name!r} has no QuantizeLinear before it: AMCT's convert_qat_model takes "
                    "only QuantizeLinear -> DequantizeLinear pairs; add the QuantizeLinear or remove the "
                    "DequantizeLinear")
        self.add("amct-unpaired", what, [*users, dq])

    # ------------------------------------------------------------------ pairs

    def _pair(self, g: _Graph, q: Any, dq: Any) -> list[tuple[Any, int]]:
        """Check one Q/DQ pair; returns the compute ops (and input index) it feeds, for the both-inputs rule."""
        users = g.consumers.get(dq.output[0], []) if dq.output else []
        where = [dq, q, next((n for n, _ in users if _is(n, *COMPUTE, "Add")), None), g.producer.get(q.input[0])]
        label = f"the Q/DQ pair {q.name!r} -> {dq.name!r}"
        self._factors(g, q, dq, label, where)
        self._int8(g, q, dq, where)
        fed: list[tuple[Any, int]] = []
        activation_checked = False
        if dq.output and dq.output[0] in g.outputs:
            self.add("amct-unadapted-op", f"{label} is a graph output, which AMCT's convert_qat_model does not adapt "
                     f"({ADAPTED}): remove the pair (the output stays float)", where)
        if not users and not (dq.output and dq.output[0] in g.outputs):
            self.add("amct-unadapted-op", f"{label} feeds nothing: remove it", where)
        for user, index in users:
            if _is(user, *COMPUTE) and index == 1:
                self._weight(g, q, dq, user, label)
                fed.append((user, index))
            elif _is(user, *COMPUTE) and index == 0 or _is(user, "Add"):
                if not activation_checked:
                    self._per_tensor(g, q, dq, f"an activation of {user.op_type}", [user, dq, q])
                    activation_checked = True
                if _is(user, "Gemm"):
                    self._gemm(user, label, dq)
                if _is(user, *COMPUTE):
                    fed.append((user, index))
            else:
                slot = " (the bias: AMCT quantizes it to int32 itself)" if _is(user, *COMPUTE) else ""
                self.add("amct-unadapted-op",
                         f"{label} feeds input {index} of {user.op_type} {user.name!r}{slot}, which AMCT's "
                         f"convert_qat_model does not adapt ({ADAPTED}): remove this pair (keep the tensor float) or "
                         "quantize the input of an op it adapts instead", [user, dq, q])
        return fed

    def _factors(self, g: _Graph, q: Any, dq: Any, label: str, where: list[Any]) -> None:
        differ = []
        for index, name in ((1, "scale"), (2, "zero point")):
            qn = q.input[index] if len(q.input) > index else ""
            dn = dq.input[index] if len(dq.input) > index else ""
            if index == 1 and (g.const(q, 1) is None or g.const(dq, 1) is None):
                self.add("amct-pair-factors", f"{label}: the scale is computed in the graph, not a constant: AMCT's "
                         "convert_qat_model needs constant quantization factors; export the scale as a constant "
                         "(freeze the observers before export)", where)
                return
            if qn == dn:
                continue
            qc, dc = g.consts.get(qn) if qn else None, g.consts.get(dn) if dn else None
            if qc is None or dc is None:
                differ.append(name if qn and dn else f"{name} (given to one node only)")
                continue
            qa, da = qc.array(), dc.array()
            if qc.tensor.data_type != dc.tensor.data_type or qc.dims != dc.dims or \
                    qa is not None and da is not None and not (qa == da).all():
                differ.append(name)
        per_axis = (g.const(q, 1) or g.const(dq, 1))
        if per_axis is not None and per_axis.numel > 1 and _attr(q, "axis", 1) != _attr(dq, "axis", 1):
            differ.append("axis")
        if differ:
            self.add("amct-pair-factors", f"{label}: the QuantizeLinear and the DequantizeLinear have different "
                     f"{' and '.join(differ)}: AMCT's convert_qat_model needs identical quantization factors in each "
                     "pair; give both nodes the same scale and zero point", where)

    def _int8(self, g: _Graph, q: Any, dq: Any | None, where: list[Any]) -> None:
        zp = g.const(q, 2)
        dtype = zp.tensor.data_type if zp is not None else _attr(q, "output_dtype", 0) or UINT8
        if dtype != INT8:
            how = (" (ONNX's default without a zero point)" if zp is None and not _attr(q, "output_dtype") else "")
            shift = "; for a uint8 range, subtract 128 from the zero point" if dtype == UINT8 else ""
            self.add("amct-int8", f"QuantizeLinear {q.name!r} quantizes to {_dtype(dtype)}{how}: AMCT's "
                     f"convert_qat_model takes signed int8 (-128..127) only; quantize to int8 with an int8 zero "
                     f"point{shift}", where)
        scale = g.const(q, 1)
        if scale is not None and scale.tensor.data_type != FLOAT:
            self.add("amct-float32", f"QuantizeLinear {q.name!r} quantizes a {_dtype(scale.tensor.data_type)} "
                     "tensor: AMCT's convert_qat_model takes float32 input only; export the model in float32",
                     where)
        if _attr(q, "block_size") or (dq is not None and _attr(dq, "block_size")):
            self.add("amct-weight-granularity", f"QuantizeLinear {q.name!r} is blocked (block_size): AMCT takes "
                     "per-tensor or per-channel factors only", where)

    def _per_tensor(self, g: _Graph, q: Any, dq: Any | None, role: str, where: list[Any]) -> None:
        sizes = [c.numel for c in (g.const(q, 1), g.const(q, 2)) if c is not None]
        if any(s != 1 for s in sizes):
            self.add("amct-activation-per-tensor",
                     f"QuantizeLinear {q.name!r} quantizes {role} per channel ({max(sizes)} factors): AMCT's "
                     "convert_qat_model takes per-channel factors on weights only; quantize activations (and Add "
                     "inputs) per tensor", where)

    def _weight(self, g: _Graph, q: Any, dq: Any, user: Any, label: str) -> None:
        where = [user, dq, q]
        weight = g.consts.get(q.input[0]) if q.input else None
        op = user.op_type
        if weight is None:
            if op == "MatMul":
                self.add("amct-weight-constant", f"{label} quantizes the second input of a MatMul of two computed "
                         "tensors: AMCT's convert_qat_model adapts only single-input MatMul (a constant 2-D weight); "
                         "remove the Q/DQ pairs of this MatMul (it stays float)", where)
            else:
                self.add("amct-weight-constant", f"{label}: the weight of this {op} is computed in the graph, not a "
                         f"constant: AMCT's convert_qat_model quantizes constant weights only; fold it into an "
                         "initializer (onnxsim does this for constant subgraphs)", where)
            return
        zp = g.const(q, 2)
        values = zp.array() if zp is not None else None
        if values is not None and values.size and (values != 0).any():
            shown = sorted(set(values.ravel().tolist()))[:4]
            self.add("amct-weight-zero-point", f"{label}: the weight's zero point is {shown}: AMCT takes symmetric "
                     "weights only (zero point 0); quantize the weight symmetrically", where)
        scale = g.const(q, 1)
        if scale is not None and scale.numel > 1:
            axis = _attr(q, "axis", 1)
            axis = axis + len(weight.dims) if axis < 0 else axis
            if op in OUTPUT_CHANNEL_AXIS and axis != OUTPUT_CHANNEL_AXIS[op]:
                self.add("amct-weight-granularity", f"{label} quantizes the {op} weight per channel on axis {axis}: "
                         f"AMCT takes per-channel factors only on the output-channel axis "
                         f"({OUTPUT_CHANNEL_AXIS[op]} for {op}); quantize per output channel or per tensor", where)
            elif op not in OUTPUT_CHANNEL_AXIS:
                self.add("amct-weight-granularity", f"{label} quantizes the {op} weight per channel "
                         f"({scale.numel} factors): AMCT's convert_qat_model takes only per-tensor weights on Gemm "
                         "and MatMul (Linear layers); quantize this weight per tensor", where)
        if op == "MatMul" and len(weight.dims) != 2:
            self.add("amct-matmul-weight", f"{label}: the MatMul weight is {len(weight.dims)}-D {list(weight.dims)}: "
                     "AMCT's convert_qat_model adapts single-input MatMul with a 2-D constant weight only; reshape "
                     "the weight to 2-D (a Linear layer) or leave this MatMul float", where)

    def _gemm(self, gemm: Any, label: str, dq: Any) -> None:
        bad = [f"{k}={v:g}" for k, v, want in (("transA", _attr(gemm, "transA", 0), 0),
                                                ("alpha", _attr(gemm, "alpha", 1.0), 1.0),
                                                ("beta", _attr(gemm, "beta", 1.0), 1.0)) if v != want]
        if bad:
            self.add("amct-gemm", f"{label} feeds a Gemm with {', '.join(bad)}: AMCT quantizes Gemm only with "
                     "transA=0, alpha=1, beta=1 (a Linear layer); export it as a plain Linear or leave it float",
                     [gemm, dq])
