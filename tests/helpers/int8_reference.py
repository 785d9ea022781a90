"""An independent numpy implementation of one quantized layer as the device runs it after AMCT (issue 18),
written from the rule, not from cann_export/validators/int8_device.py, and sharing no code with it:

AscendQuant: fp16(x) times fp16(1/s_x), plus the offset zp, each in fp16, then rint saturated to int8; the op in
integers: the feature map padded with the offset zp (Conv2D's offset_x), sum(q * w_int8) in int32 over the taps,
plus the int32 bias round(b / (s_x s_w)) - zp * sum(w_int8) (AMCT folds the offset into the bias; a ConvTranspose
scatters q - zp, the offset read wherever the transposed conv inserts or pads zeros); AscendDequant:
the int32 sum times deq_scale = s_x s_w (S19: the fp32 bits & 0xFFFFE000; or fp16 on the v100 SoCs), in fp16.

``wrong`` names a deliberately wrong rule, to show a check tells it apart: "dequant_fp32" (AscendDequant writes
fp32), "quant_fp32" (AscendQuant as ONNX QuantizeLinear: x / s in fp32), "deq_fp32" (deq_scale in full fp32)."""
from __future__ import annotations

from typing import Any

import numpy as np
from onnx import numpy_helper

INT32 = (-(2 ** 31), 2 ** 31 - 1)


def to_fp16(a: np.ndarray, saturate: bool) -> np.ndarray:
    a = np.asarray(a, np.float32)
    if saturate:
        a = np.clip(a, -65504.0, 65504.0)
    with np.errstate(over="ignore"):
        return a.astype(np.float16)


def ascend_quant(x: np.ndarray, scale: float, zp: int, saturate: bool, wrong: str | None = None) -> np.ndarray:
    if wrong == "quant_fp32":
        return np.clip(np.rint(np.float32(x) / np.float32(scale)) + zp, -128, 127).astype(np.int8)
    multiplier = np.float16(np.float32(1.0) / np.float32(scale))
    x16 = to_fp16(x, saturate)
    y = to_fp16(x16.astype(np.float32) * np.float32(multiplier), saturate)
    if zp:
        y = to_fp16(y.astype(np.float32) + np.float32(zp), saturate)
    return np.clip(np.rint(y.astype(np.float32)), -128, 127).astype(np.int8)


def ascend_dequant(acc: np.ndarray, deq: np.ndarray, saturate: bool, rule: str, wrong: str | None) -> np.ndarray:
    deq = np.asarray(deq, np.float32)
    if wrong == "deq_fp32":
        factor = deq
    elif rule == "s19":
        factor = (deq.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
    else:  # fp16 deq_scale; applied twice as its square root below fp16's normal range
        if np.all(deq >= 2.0 ** -14):
            factor = deq.astype(np.float16).astype(np.float32)
        else:
            root = np.sqrt(deq.astype(np.float64)).astype(np.float16).astype(np.float32)
            if wrong == "dequant_fp32":
                return acc.astype(np.float32) * root * root
            first = to_fp16(acc.astype(np.float32) * root, saturate).astype(np.float32)
            return to_fp16(first * root, saturate).astype(np.float32)
    y = acc.astype(np.float32) * factor
    return y if wrong == "dequant_fp32" else to_fp16(y, saturate).astype(np.float32)


class Graph:
    """Constants and producers of an ONNX graph, and the quantization of one compute node read from them."""

    def __init__(self, model: Any):
        self.consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        self.nodes = {n.name: n for n in model.graph.node}
        self.made_by = {o: n for n in model.graph.node for o in n.output}

    def attr(self, node: Any, name: str, default: Any) -> Any:
        for a in node.attribute:
            if a.name == name:
                return list(a.ints) if a.ints else (a.i if a.type == 2 else a.f)
        return default

    def activation(self, node: Any) -> tuple[str, float, int]:
        """(the tensor AscendQuant reads, s_x, zp) of the compute node's input 0 (x -> Q -> DQ -> node)."""
        dq = self.made_by[node.input[0]]
        q = self.made_by[dq.input[0]]
        assert dq.op_type == "DequantizeLinear" and q.op_type == "QuantizeLinear"
        return q.input[0], float(self.consts[q.input[1]]), int(self.consts[q.input[2]])

    def weight(self, node: Any) -> tuple[np.ndarray, np.ndarray]:
        """(int8 weight as int64, its scale) of input 1: int8 -> DQ, or fp32 -> Q -> DQ (rounded in float64)."""
        dq = self.made_by[node.input[1]]
        scale = self.consts[dq.input[1]].astype(np.float32)
        if dq.input[0] in self.consts:
            return self.consts[dq.input[0]].astype(np.int64), scale
        q = self.made_by[dq.input[0]]
        w = self.consts[q.input[0]].astype(np.float64)
        axis = self.attr(q, "axis", 1)
        shape = [1] * w.ndim
        if scale.size > 1:
            shape[axis] = scale.size
        return np.clip(np.round(w / scale.astype(np.float64).reshape(shape)), -127, 127).astype(np.int64), scale


def conv2d(graph: Graph, name: str, x: np.ndarray, saturate: bool = True, rule: str = "s19",
           wrong: str | None = None) -> np.ndarray:
    """The 2-D Conv node ``name`` (groups, strides, dilations, pads) on its AscendQuant input ``x``."""
    node = graph.nodes[name]
    _, s_x, zp = graph.activation(node)
    w, s_w = graph.weight(node)
    groups = graph.attr(node, "group", 1)
    pads = graph.attr(node, "pads", [0, 0, 0, 0])
    (sh, sw), (dh, dw) = graph.attr(node, "strides", [1, 1]), graph.attr(node, "dilations", [1, 1])
    q = ascend_quant(x, s_x, zp, saturate, wrong).astype(np.int64)
    q = np.pad(q, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])), constant_values=zp)  # offset_x
    cout, cin_g, kh, kw = w.shape
    oh = (q.shape[2] - (kh - 1) * dh - 1) // sh + 1
    ow = (q.shape[3] - (kw - 1) * dw - 1) // sw + 1
    acc = np.zeros((q.shape[0], cout, oh, ow), np.int64)
    per_group = cout // groups
    for g in range(groups):
        qg, wg = q[:, g * cin_g:(g + 1) * cin_g], w[g * per_group:(g + 1) * per_group]
        for i in range(kh):
            for j in range(kw):
                patch = qg[:, :, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
                acc[:, g * per_group:(g + 1) * per_group] += np.einsum("nchw,oc->nohw", patch, wg[:, :, i, j])
    step = np.float64(np.float32(s_x)) * np.broadcast_to(s_w, (cout,)).astype(np.float64)
    bias = np.zeros(cout) if len(node.input) < 3 else graph.consts[node.input[2]].astype(np.float64)
    bias_int = np.rint(bias / step).astype(np.int64) - zp * w.reshape(cout, -1).sum(1)
    acc = acc + bias_int[None, :, None, None]
    assert acc.min() >= INT32[0] and acc.max() <= INT32[1], "the int32 accumulator overflowed"
    return ascend_dequant(acc.astype(np.int32), step.astype(np.float32)[None, :, None, None], saturate, rule, wrong)


def conv_transpose2d(graph: Graph, name: str, x: np.ndarray, saturate: bool = True, rule: str = "s19",
                     wrong: str | None = None) -> np.ndarray:
    """The 2-D ConvTranspose node ``name`` (groups, strides, dilations, pads; weight per channel on axis 1):
    every (q - zp) scattered through the int8 kernel taps into int64 sums, then cropped by the pads."""
    node = graph.nodes[name]
    _, s_x, zp = graph.activation(node)
    w, s_w = graph.weight(node)
    groups = graph.attr(node, "group", 1)
    pads = graph.attr(node, "pads", [0, 0, 0, 0])
    (sh, sw), (dh, dw) = graph.attr(node, "strides", [1, 1]), graph.attr(node, "dilations", [1, 1])
    xc = ascend_quant(x, s_x, zp, saturate, wrong).astype(np.int64) - zp
    n, cin, ih, iw = xc.shape
    _, cout_g, kh, kw = w.shape
    out_h, out_w = (ih - 1) * sh + (kh - 1) * dh + 1, (iw - 1) * sw + (kw - 1) * dw + 1
    full = np.zeros((n, cout_g * groups, out_h, out_w), np.int64)
    cin_g = cin // groups
    for g in range(groups):
        xg, wg = xc[:, g * cin_g:(g + 1) * cin_g], w[g * cin_g:(g + 1) * cin_g]
        for i in range(kh):
            for j in range(kw):
                full[:, g * cout_g:(g + 1) * cout_g, i * dh:i * dh + (ih - 1) * sh + 1:sh,
                     j * dw:j * dw + (iw - 1) * sw + 1:sw] += np.einsum("nchw,co->nohw", xg, wg[:, :, i, j])
    acc = full[:, :, pads[0]:full.shape[2] - pads[2], pads[1]:full.shape[3] - pads[3]]
    cout = cout_g * groups
    step = np.float64(np.float32(s_x)) * np.tile(np.broadcast_to(s_w, (cout_g,)), groups).astype(np.float64)
    bias = np.zeros(cout) if len(node.input) < 3 else graph.consts[node.input[2]].astype(np.float64)
    acc = acc + np.rint(bias / step).astype(np.int64)[None, :, None, None]
    assert acc.min() >= INT32[0] and acc.max() <= INT32[1], "the int32 accumulator overflowed"
    return ascend_dequant(acc.astype(np.int32), step.astype(np.float32)[None, :, None, None], saturate, rule, wrong)


def matmul(graph: Graph, name: str, x: np.ndarray, saturate: bool = True, rule: str = "s19",
           wrong: str | None = None) -> np.ndarray:
    """The MatMul (constant 2-D weight) or Gemm (transB, bias C) node ``name`` on its AscendQuant input ``x``."""
    node = graph.nodes[name]
    _, s_x, zp = graph.activation(node)
    w, s_w = graph.weight(node)
    if node.op_type == "Gemm" and graph.attr(node, "transB", 0):
        w = w.T
    q = ascend_quant(x, s_x, zp, saturate, wrong).astype(np.int64)
    n_out = w.shape[1]
    acc = np.einsum("...k,kn->...n", q, w)
    step = np.float64(np.float32(s_x)) * np.broadcast_to(s_w, (n_out,)).astype(np.float64)
    bias = graph.consts[node.input[2]].astype(np.float64).ravel() if len(node.input) > 2 else np.zeros(n_out)
    acc = acc + (np.rint(np.broadcast_to(bias, (n_out,)) / step).astype(np.int64) - zp * w.sum(0))
    assert acc.min() >= INT32[0] and acc.max() <= INT32[1], "the int32 accumulator overflowed"
    return ascend_dequant(acc.astype(np.int32), step.astype(np.float32), saturate, rule, wrong)


def layer(graph: Graph, name: str, x: np.ndarray, **kw: Any) -> np.ndarray:
    op = {"Conv": conv2d, "ConvTranspose": conv_transpose2d}.get(graph.nodes[name].op_type, matmul)
    return op(graph, name, x, **kw)
