"""Down-convert a graph written at opset 18 (the lowest torch.onnx's dynamo exporter writes) to an older opset.

onnx's C++ converter has no down adapter for many ops (Relu 14 -> 13 asserts) and leaves attributes behind that
the older schema rejects (``noop_with_empty_axes`` on ReduceMean at 17); onnxscript's converter only handles 18 and
up. Here every node either keeps its form (its schema at the target takes the same inputs and attributes, an
attribute added later at its default value is dropped), is rewritten into the older form (axes inputs back to
attributes, LayerNormalization spelled out before 17, Softmax over an inner axis before 13), or the conversion fails
with the node named. The result is checked with onnx's full checker; callers compare its outputs with the original.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

_DEFAULT = ("", "ai.onnx")
_REDUCE = ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
           "ReduceLogSumExp", "ReduceSumSquare", "ReduceSum")


class OpsetConversionError(ValueError):
    """A node that has no equivalent at the target opset (the message names it)."""


_WEIGHT_BYTES = 1 << 16  # initializers above this are weights: no rule reads their values


def convert(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """A copy of ``model`` at ONNX opset ``target`` (lower than its own); raises OpsetConversionError.

    The conversion, shape inference and the full check run on a skeleton whose weights are graph inputs of
    the same type and shape (no rule reads a weight's values), so the weights are copied once, into the
    result, instead of once per step."""
    source = next((int(i.version) for i in model.opset_import if i.domain in _DEFAULT), 0)
    if target >= source:
        raise OpsetConversionError(f"only converts down: the graph is at opset {source}, asked {target}")
    out, weights = _skeleton(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(out)
    except Exception:  # noqa: BLE001 - ranks are then unknown; rules that need one fail by name
        inferred = out
    converter = _Converter(source, target, inferred.graph)
    del inferred
    converter.graph(out.graph)
    for fn in out.functions:
        converter.nodes(fn.node)
        _set_opset(fn.opset_import, target)
    _set_opset(out.opset_import, target)
    try:
        onnx.checker.check_model(out, full_check=True)
    except Exception as e:  # a type or shape the older schema does not allow
        raise OpsetConversionError(f"the graph converted to opset {target} does not check: "
                                   f"{' '.join(str(e).split())[:300]}") from e
    if weights:
        stand_ins = {t.name for t in weights} - _input_names(model)
        inputs = [i for i in out.graph.input if i.name not in stand_ins]
        del out.graph.input[:]
        out.graph.input.extend(inputs)
        out.graph.initializer.extend(weights)
    return out


def _input_names(model: onnx.ModelProto) -> set[str]:
    return {i.name for i in model.graph.input}


def _skeleton(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[onnx.TensorProto]]:
    """A copy of ``model`` without its weights' data, and the weights (still ``model``'s own messages).
    Each weight left out becomes a graph input of its type and shape, unless it is one already. A tensor stored
    as external data (a large model's graph) is always left out: its reference is kept, its file never read."""
    out = onnx.ModelProto()
    for field, value in model.ListFields():
        if field.name != "graph":
            _copy_field(out, field.name, value)
    for field, value in model.graph.ListFields():
        if field.name != "initializer":
            _copy_field(out.graph, field.name, value)
    inputs = _input_names(model)
    weights = []
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL or t.ByteSize() > _WEIGHT_BYTES:  # external: kept as is
            weights.append(t)
            if t.name not in inputs:
                out.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            out.graph.initializer.append(t)
    return out, weights


def _copy_field(msg: Any, name: str, value: Any) -> None:
    target = getattr(msg, name)
    if hasattr(target, "extend"):  # repeated (messages are copied)
        target.extend(value)
    elif hasattr(target, "CopyFrom"):
        target.CopyFrom(value)
    else:
        setattr(msg, name, value)


def _set_opset(imports: Any, target: int) -> None:
    for imp in imports:
        if imp.domain in _DEFAULT:
            imp.version = target


class _Converter:
    def __init__(self, source: int, target: int, inferred: onnx.GraphProto) -> None:
        self.source, self.target = source, target
        self.ranks: dict[str, int] = {}
        self.types: dict[str, int] = {}
        for v in (*inferred.input, *inferred.value_info, *inferred.output):
            t = v.type.tensor_type
            if t.HasField("shape"):
                self.ranks[v.name] = len(t.shape.dim)
            if t.elem_type:
                self.types[v.name] = t.elem_type
        self.consts: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in inferred.initializer}
        for n in inferred.node:
            if n.op_type == "Constant" and n.domain in _DEFAULT and n.attribute and n.attribute[0].name == "value":
                self.consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
        self.new_inits: list[onnx.TensorProto] = []

    def graph(self, g: onnx.GraphProto) -> None:
        self.nodes(g.node)
        g.initializer.extend(self.new_inits)
        self.new_inits = []

    def nodes(self, nodes: Any) -> None:
        converted = [out for n in nodes for out in self.node(n)]
        del nodes[:]
        nodes.extend(converted)

    def node(self, n: onnx.NodeProto) -> list[onnx.NodeProto]:
        for attr in n.attribute:  # If / Loop / Scan bodies
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                self.nodes(sub.node)
        if n.domain not in _DEFAULT:
            return [n]
        rule = _RULES.get(n.op_type)
        produced = rule(self, n) if rule else [n]
        for p in produced:
            self.fit(p)
        return produced

    # -- helpers ---------------------------------------------------------------------------------------------
    def fail(self, n: onnx.NodeProto, why: str) -> OpsetConversionError:
        return OpsetConversionError(f"{n.op_type} node {n.name or n.output[0]!r} "
                                    f"has no opset-{self.target} form: {why}")

    def const(self, n: onnx.NodeProto, index: int) -> list[int] | None:
        """The constant integer list at input ``index`` (None when the input is absent)."""
        if len(n.input) <= index or not n.input[index]:
            return None
        value = self.consts.get(n.input[index])
        if value is None:
            raise self.fail(n, f"input {index} ({n.input[index]}) is computed at run time, the old form takes it "
                               "as an attribute")
        return [int(v) for v in np.asarray(value).reshape(-1)]

    def attr(self, n: onnx.NodeProto, name: str, default: Any) -> Any:
        a = next((a for a in n.attribute if a.name == name), None)
        return default if a is None else helper.get_attribute_value(a)

    def set_attr(self, n: onnx.NodeProto, name: str, value: Any) -> None:
        self.drop_attr(n, name)
        if value is not None:
            n.attribute.append(helper.make_attribute(name, value))

    def drop_attr(self, n: onnx.NodeProto, name: str) -> None:
        keep = [a for a in n.attribute if a.name != name]
        del n.attribute[:]
        n.attribute.extend(keep)

    def make(self, like: onnx.NodeProto, op: str, inputs: list[str], outputs: list[str], suffix: str,
             **attrs: Any) -> onnx.NodeProto:
        node = helper.make_node(op, inputs, outputs, name=f"{like.name or like.output[0]}_{suffix}", **attrs)
        node.metadata_props.extend(like.metadata_props)  # the module path and source line carry over
        return node

    def scalar(self, like: onnx.NodeProto, value: float, dtype: int, suffix: str) -> str:
        name = f"{like.name or like.output[0]}_{suffix}"
        arr = np.array(value, dtype=helper.tensor_dtype_to_np_dtype(dtype))
        self.new_inits.append(numpy_helper.from_array(arr, name))
        return name

    def fit(self, n: onnx.NodeProto) -> None:
        """Drop attributes the target schema lacks when they hold their default; refuse anything else."""
        try:
            schema = onnx.defs.get_schema(n.op_type, self.target, "")
        except onnx.defs.SchemaError as e:
            raise self.fail(n, "the operator does not exist yet") from e
        source = onnx.defs.get_schema(n.op_type, self.source, "")
        for a in list(n.attribute):
            if a.name in schema.attributes:
                continue
            spec = source.attributes.get(a.name)
            default = helper.get_attribute_value(spec.default_value) if spec and spec.default_value.name else None
            if default is None or helper.get_attribute_value(a) != default:
                raise self.fail(n, f"attribute {a.name} was added later and is not at its default")
            self.drop_attr(n, a.name)
        while n.input and not n.input[-1]:
            n.input.pop()
        if len(n.input) > schema.max_input:
            raise self.fail(n, f"{len(n.input)} inputs, the old form takes at most {schema.max_input}")


def _reduce(c: _Converter, n: onnx.NodeProto) -> list[onnx.NodeProto]:
    since = 13 if n.op_type == "ReduceSum" else 18  # the opset that moved axes from attribute to input
    if c.target >= since:
        return [n]
    axes = c.const(n, 1)
    noop = c.attr(n, "noop_with_empty_axes", 0)
    c.drop_attr(n, "noop_with_empty_axes")
    del n.input[1:]
    if not axes and noop:
        return [c.make(n, "Identity", [n.input[0]], list(n.output), "identity")]
    c.set_attr(n, "axes", axes or None)  # no axes: reduce over every axis, as before
    return [n]


def _axes_to_attr(c: _Converter, n: onnx.NodeProto) -> list[onnx.NodeProto]:
    if c.target >= 13:
        return [n]
    axes = c.const(n, 1)
    del n.input[1:]
    c.set_attr(n, "axes", axes)
    return [n]


def _split(c: _Converter, n: onnx.NodeProto) -> list[onnx.NodeProto]:
    count = c.attr(n, "num_outputs", None)
    c.drop_attr(n, "num_outputs")  # without split sizes older Split divides equally among its outputs
    if count is not None and len(n.output) != count:
        raise c.fail(n, "num_outputs differs from the number of outputs")
    if c.target < 13:
        sizes = c.const(n, 1)
        del n.input[1:]
        c.set_attr(n, "split", sizes)
    return [n]


def _reshape(c: _Converter, n: onnx.NodeProto) -> list[onnx.NodeProto]:
    """allowzero=1 (dynamo writes it) differs from the old Reshape only for a 0 in the target shape."""
    if c.target >= 14 or not c.attr(n, "allowzero", 0):
        return [n]
    shape = c.consts.get(n.input[1]) if len(n.input) > 1 else None
    if shape is not None and (np.asarray(shape) == 0).any():
        raise c.fail(n, "allowzero=1 with a 0 in the shape")
    c.drop_attr(n, "allowzero")  # a computed shape holds a 0 only for an empty tensor; the caller's parity check
    return [n]


def _layer_norm(c: _Converter, n: onnx.NodeProto) -> list[onnx.NodeProto]:
    if c.target >= 17:
        return [n]
    if any(n.output[1:]):
        raise c.fail(n, "its Mean / InvStdDev outputs are used")
    axis = c.attr(n, "axis", -1)
    if axis >= 0:
        rank = c.ranks.get(n.input[0])
        if rank is None:
            raise c.fail(n, "the input's rank is unknown")
        axis -= rank
    axes = list(range(axis, 0))
    dtype = c.types.get(n.input[0], onnx.TensorProto.FLOAT)
    eps = c.scalar(n, c.attr(n, "epsilon", 1e-5), dtype, "eps")
    x, base = n.input[0], f"{n.name or n.output[0]}_ln"
    nodes = [
        c.make(n, "ReduceMean", [x], [f"{base}_mean"], "mean", axes=axes, keepdims=1),
        c.make(n, "Sub", [x, f"{base}_mean"], [f"{base}_centered"], "sub"),
        c.make(n, "Mul", [f"{base}_centered", f"{base}_centered"], [f"{base}_sq"], "sq"),
        c.make(n, "ReduceMean", [f"{base}_sq"], [f"{base}_var"], "var", axes=axes, keepdims=1),
        c.make(n, "Add", [f"{base}_var", eps], [f"{base}_var_eps"], "add_eps"),
        c.make(n, "Sqrt", [f"{base}_var_eps"], [f"{base}_std"], "sqrt"),
        c.make(n, "Div", [f"{base}_centered", f"{base}_std"], [f"{base}_normed"], "div"),
    ]
    has_bias = len(n.input) > 2 and bool(n.input[2])
    scaled = f"{base}_scaled" if has_bias else n.output[0]
    nodes.append(c.make(n, "Mul", [f"{base}_normed", n.input[1]], [scaled], "scale"))
    if has_bias:
        nodes.append(c.make(n, "Add", [scaled, n.input[2]], [n.output[0]], "bias"))
    return nodes


def _softmax(c: _Converter, n: onnx.NodeProto) -> list[onnx.NodeProto]:
    if c.target >= 13:
        return [n]
    axis, rank = c.attr(n, "axis", -1), c.ranks.get(n.input[0])
    if axis == -1 or (rank is not None and axis == rank - 1):
        c.set_attr(n, "axis", -1)  # older Softmax flattens from ``axis`` on: the same thing on the last axis
        return [n]
    if rank is None:
        raise c.fail(n, "the input's rank is unknown")
    axis %= rank
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    base = f"{n.name or n.output[0]}_sm"
    return [c.make(n, "Transpose", [n.input[0]], [f"{base}_in"], "to_last", perm=perm),
            c.make(n, n.op_type, [f"{base}_in"], [f"{base}_out"], "last", axis=-1),
            c.make(n, "Transpose", [f"{base}_out"], list(n.output), "back", perm=perm)]


def _constant(c: _Converter, n: onnx.NodeProto) -> list[onnx.NodeProto]:
    if c.target >= 12 or not n.attribute or n.attribute[0].name in ("value", "sparse_value"):
        return [n]
    a = n.attribute[0]
    kinds = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64, "value_ints": np.int64}
    if a.name not in kinds:
        raise c.fail(n, f"attribute {a.name}")
    value = np.asarray(helper.get_attribute_value(a), dtype=kinds[a.name])
    del n.attribute[:]
    n.attribute.append(helper.make_attribute("value", numpy_helper.from_array(value)))
    return [n]


_RULES: dict[str, Callable[[_Converter, onnx.NodeProto], list[onnx.NodeProto]]] = {
    **dict.fromkeys(_REDUCE, _reduce),
    "Reshape": _reshape, "Squeeze": _axes_to_attr, "Unsqueeze": _axes_to_attr, "Split": _split,
    "LayerNormalization": _layer_norm, "Softmax": _softmax, "LogSoftmax": _softmax, "Hardmax": _softmax,
    "Constant": _constant,
}
