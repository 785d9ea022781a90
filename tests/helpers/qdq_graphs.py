"""Hand-built Q/DQ graphs (onnx.helper) in the int8 contract form AMCT's convert_qat_model adapts, and a small
builder to break one rule at a time."""
from __future__ import annotations

import zlib

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from cann_export.graph.module_paths import KEY


class QdqGraph:
    """Nodes, initializers and values of one graph; ``qdq`` adds a QuantizeLinear -> DequantizeLinear pair."""

    def __init__(self, x_shape=(1, 3, 8, 8)):
        self.nodes, self.inits, self.paths = [], [], {}
        self.inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
        self.outputs = []

    def const(self, name, value, dtype=None):
        array = np.asarray(value, dtype=dtype)
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def node(self, op, inputs, output, name, module=None, **attrs):
        node = helper.make_node(op, inputs, [output], name=name, **attrs)
        if module is not None:
            node.metadata_props.add(key=KEY, value=module)
            self.paths[name] = module
        self.nodes.append(node)
        return output

    def qdq(self, x, name, scale=0.05, zero_point=0, zp_dtype=np.int8, axis=None, dq_scale=None, dq_zero_point=None):
        """x -> Q -> DQ with constant factors; ``dq_*`` give the DequantizeLinear other factors."""
        s = self.const(f"{name}_scale", scale, np.float32)
        z = self.const(f"{name}_zp", zero_point, zp_dtype) if zero_point is not None else ""
        ds = self.const(f"{name}_dq_scale", dq_scale, np.float32) if dq_scale is not None else s
        dz = self.const(f"{name}_dq_zp", dq_zero_point, zp_dtype) if dq_zero_point is not None else z
        kw = {} if axis is None else {"axis": axis}
        q = self.node("QuantizeLinear", [x, s] + ([z] if z else []), f"{name}_q", f"{name}_quant", **kw)
        return self.node("DequantizeLinear", [q, ds] + ([dz] if dz else []), f"{name}_dq", f"{name}_dequant", **kw)

    def weight(self, name, shape, per_channel_axis=None, **kw):
        """A float32 weight on the int8 grid -> Q -> DQ, per tensor or per channel on ``per_channel_axis``."""
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        if per_channel_axis is None:
            scale = kw.pop("scale", 0.02)
            w = rng.integers(-127, 128, size=shape).astype(np.float32) * scale
            return self.qdq(self.const(name, w), name, scale=scale, zero_point=kw.pop("zero_point", 0), **kw)
        n = shape[per_channel_axis]
        scale = kw.pop("scale", np.linspace(0.01, 0.03, n).astype(np.float32))
        view = [1] * len(shape)
        view[per_channel_axis] = n
        w = rng.integers(-127, 128, size=shape).astype(np.float32) * np.reshape(scale, view)
        return self.qdq(self.const(name, w), name, scale=scale, zero_point=kw.pop("zero_point", np.zeros(n)),
                        axis=kw.pop("axis", per_channel_axis), **kw)

    def output(self, name, shape):
        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))

    def model(self, opset=17):
        graph = helper.make_graph(self.nodes, "g", self.inputs, self.outputs, self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def conv_model(opset=17, **weight):
    """x -> Q/DQ -> Conv (weight per output channel) -> y: what AMCT adapts."""
    g = QdqGraph()
    a = g.qdq("x", "act")
    w = g.weight("conv_w", (4, 3, 3, 3), per_channel_axis=weight.pop("axis", 0), **weight)
    g.node("Conv", [a, w, g.const("conv_b", np.zeros(4, np.float32))], "y", "conv_node", module="features.conv",
           pads=[1, 1, 1, 1])
    g.output("y", (1, 4, 8, 8))
    return g.model(opset), g.paths
