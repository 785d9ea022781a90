"""The int8 path of a Q/DQ graph as the device runs it after AMCT's convert_qat_model (issue 18).

AMCT replaces each activation QuantizeLinear by AscendQuant, each quantized compute op (Conv, ConvTranspose,
Gemm, MatMul with a constant weight, fed by an activation Q/DQ pair and a weight Q/DQ or int8 -> DQ) by the op
in int8 with int32 accumulation, and puts AscendDequant after it. The device arithmetic emulated here:

- AscendQuant (TBE ascend_quant.py): the input cast to fp16, multiplied by the fp16 constant ``1/scale``
  (twice by ``sqrt(1/scale)`` past fp16's range, sqrt_mode), the fp16 offset (the zero point) added, each step
  rounded to fp16, then rint (round_mode "Round") saturated to -128..127. AMCT's own FORCE_FP16_QUANT fake
  quant (amct_onnx_op dequant_quant.cpp, FakeQuantKernel) computes the same.
- The op in int8: exact integer sums of (q - zp) x w_int8 (the feature map is padded with the offset, TBE
  conv_compute's im2col pad value ``offset_x``, so a padded tap reads zero) plus the int32 bias
  ``round(bias / (s_x * s_w))`` (rint in float64, an assumption: AMCT's rounding of the bias is not public).
  ConvInteger / MatMulInteger accumulate in int32; ConvTranspose, which has no integer ONNX op, runs in fp32 on
  the split ``q - zp = 16 hi + lo``, exact while (Cin/group) x kernel taps < 8256 (``inexact`` lists the rest);
  that it reads the offset wherever it inserts or pads zeros (``convT(q - zp)``) is assumed, not documented.
- AscendDequant: ``int32 x deq_scale`` written in fp16 (TBE ascend_dequant.py: every branch writes float16),
  ``deq_scale = s_x * s_w`` per output channel. On SoCs with the v200 dequant (Ascend310P, 610 and the fixpipe
  SoCs: ascend_quant_util.is_support_v200) deq_scale is a uint64 holding the fp32 scale in its low 32 bits, applied
  as S19 (the fp32 bits & 0xFFFFE000: AMCT's FakeDequantKernel, ParseParamData and CastToS19CPU); on the v100
  SoCs (Ascend310, Ascend910/A/ProA/ProB/PremiumA) it is fp16, applied twice as its fp16 square root past fp16's
  normal range (ascend_dequant.py's sqrt_mode). The product is rounded once to fp16 under the SoC's overflow mode.
- A Q/DQ pair that feeds anything else (Add: AscendQuant -> AscendAntiQuant) dequantizes in fp16:
  ``fp16((q - zp) x fp16(scale))`` (TBE ascend_anti_quant.py).
Everything else runs as precision.py's fp16 emulation says. The emulation is built only where the mode reduces
precision; a keep_dtype entry does not take a quantized op out of int8 (AMCT converts it regardless).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

RULE = "AscendQuant/int32/AscendDequant fp16"
S19, DEQ_FP16 = "s19", "fp16"
V100_SOCS = re.compile(r"Ascend310|Ascend910(A|ProA|ProB|PremiumA)?")  # fp16 deq_scale (not is_support_v200)
COMPUTE = ("Conv", "ConvTranspose", "Gemm", "MatMul")
FP16_MAX, FP16_MIN_NORMAL = 65504.0, 2.0 ** -14
SPLIT, EXACT = 16, float(2 ** 24)  # ConvTranspose's operand split, fp32's exact integer range
FP16, FLOAT, INT8, INT32 = 10, 1, 3, 6  # onnx.TensorProto element types


def deq_scale_for(soc: str | None) -> str:
    """How ``soc`` holds AscendDequant's deq_scale: fp16 on the v100 SoCs, an fp32 applied as S19 elsewhere."""
    return DEQ_FP16 if soc and V100_SOCS.fullmatch(soc) else S19


def s19(values: np.ndarray) -> np.ndarray:
    """fp32 values with their mantissa truncated to 10 bits (sign, 8-bit exponent, 10-bit mantissa)."""
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
    return bits.view(np.float32)


def quant_scale(scale: float) -> tuple[np.float32, bool]:
    """AscendQuant's fp16 multiplier for a QuantizeLinear scale and whether it is applied twice (sqrt_mode)."""
    inv = float(np.float32(1.0 / float(scale)))
    if FP16_MIN_NORMAL <= inv <= FP16_MAX:
        return np.float32(np.float16(inv)), False
    # a scale below 1 / 65504**2 (an activation that is constant zero: its range clamped to a tiny scale) saturates
    # at fp16's largest multiplier rather than inf, which would turn its zeros into NaN
    return np.float32(np.float16(min(float(np.sqrt(inv)), FP16_MAX))), True


def deq_factors(deq: np.ndarray, rule: str) -> tuple[np.ndarray, bool]:
    """The factor(s) AscendDequant multiplies by (fp32 arrays) and whether it multiplies twice (v100 sqrt_mode)."""
    deq = np.asarray(deq, np.float32)
    if rule == S19:
        return s19(deq), False
    if np.all((deq >= FP16_MIN_NORMAL) & (deq <= FP16_MAX)):
        return deq.astype(np.float16).astype(np.float32), False
    return np.sqrt(deq.astype(np.float64)).astype(np.float16).astype(np.float32), True


def quantize(w: np.ndarray, scale: np.ndarray, zp: np.ndarray, axis: int) -> np.ndarray:
    """ONNX QuantizeLinear to int8 (fp32 division, round half to even, saturation) of a constant."""
    shape = [1] * w.ndim
    if scale.size > 1:
        shape[axis] = scale.size
    q = np.rint(w.astype(np.float32) / scale.astype(np.float32).reshape(shape)) + zp.astype(np.float32).reshape(shape)
    return np.clip(q, -128, 127).astype(np.int8)


@dataclass(frozen=True)
class Quant:
    """An activation QuantizeLinear: AscendQuant of ``x`` into the int8 tensor ``q``."""

    x: str
    q: str
    scale: float
    zp: int


@dataclass(frozen=True)
class AntiQuant:
    """A DequantizeLinear of an AscendQuant output."""

    q: str
    out: str
    scale: float
    zp: int


@dataclass
class IntOp:
    """A quantized compute op: int8 weight ``w`` (in the op's layout), its per-output-channel deq_scale and int32
    bias (``None``: no bias)."""

    node: Any
    quant: Quant
    w: np.ndarray
    deq: np.ndarray
    bias: np.ndarray | None
    taps: int  # products summed per output value


class Int8Plan:
    """The quantized ops of one graph (found by structure), and how to emit their device arithmetic."""

    def __init__(self, model: Any, deq_scale: str = S19):
        if deq_scale not in (S19, DEQ_FP16):
            raise ValueError(f"deq_scale {deq_scale!r} is neither {S19!r} nor {DEQ_FP16!r}")
        self.deq_rule = deq_scale
        g = model.graph
        self.inits = {i.name: i for i in g.initializer}
        self.const_nodes = {n.output[0]: n for n in g.node if n.op_type == "Constant" and n.output}
        self.producer = {o: (k, n) for k, n in enumerate(g.node) for o in n.output if o}
        self.quants: dict[int, Quant] = {}
        self.antiquants: dict[int, AntiQuant] = {}
        self.ops: dict[int, IntOp] = {}
        self.skipped: list[dict[str, str]] = []
        self.cache: dict[str, Any] = {}  # emitted constants (TensorProto) by name
        by_q: dict[str, Quant] = {}
        for k, n in enumerate(g.node):
            if n.op_type == "QuantizeLinear" and (quant := self._activation_quant(n)) is not None:
                self.quants[k] = by_q[quant.q] = quant
        for k, n in enumerate(g.node):
            if n.op_type == "DequantizeLinear" and n.input[0] in by_q:
                scale, zp = self._scalar(n, 1), self._scalar(n, 2, 0)
                if scale is not None and zp is not None:
                    self.antiquants[k] = AntiQuant(n.input[0], n.output[0], scale, int(zp))
        dq_of = {a.out: a for a in self.antiquants.values()}
        for k, n in enumerate(g.node):
            if n.op_type in COMPUTE and len(n.input) > 1 and n.input[0] in self.producer:
                d = self.producer[n.input[0]][1]
                if d.op_type == "DequantizeLinear":
                    self._add_op(k, n, dq_of.get(n.input[0]), by_q)

    # --- analysis -------------------------------------------------------------------------------------------
    def const(self, name: str) -> np.ndarray | None:
        from onnx import numpy_helper

        while name in self.producer and self.producer[name][1].op_type == "Identity" and name not in self.inits:
            name = self.producer[name][1].input[0]
        if name in self.inits:
            return numpy_helper.to_array(self.inits[name])
        node = self.const_nodes.get(name)
        if node is not None:
            attr = next((a for a in node.attribute if a.name == "value"), None)
            return numpy_helper.to_array(attr.t) if attr is not None else None
        return None

    def _scalar(self, node: Any, k: int, default: float | None = None) -> float | None:
        if len(node.input) <= k or not node.input[k]:
            return default
        value = self.const(node.input[k])
        return float(value.ravel()[0]) if value is not None and value.size == 1 else None

    def _activation_quant(self, node: Any) -> Quant | None:
        x = node.input[0]
        if self.const(x) is not None:  # a weight's QuantizeLinear
            return None
        zp = self.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        scale = self._scalar(node, 1)
        if zp is None or zp.dtype != np.int8 or zp.size != 1 or scale is None or not scale > 0:
            self.skipped.append({"node": node.name, "reason": "not an int8 per-tensor activation QuantizeLinear"})
            return None
        return Quant(x, node.output[0], scale, int(zp.ravel()[0]))

    def _add_op(self, k: int, node: Any, anti: AntiQuant | None, by_q: dict[str, Quant]) -> None:
        quant = by_q.get(anti.q) if anti is not None else None
        why = None
        if quant is None:
            why = "its input is not an int8 activation Q/DQ pair"
        elif (anti.scale, anti.zp) != (quant.scale, quant.zp):
            why = "its activation Q/DQ pair has unequal factors"
        else:
            try:
                self.ops[k] = self._int_op(node, quant)
                return
            except ValueError as e:
                why = str(e)
        self.skipped.append({"node": node.name, "reason": why})

    def _weight(self, name: str) -> tuple[np.ndarray, np.ndarray, int]:
        """(int8 weight, scale per weight channel or one, axis) of a constant weight chain ending in DQ."""
        if name not in self.producer or self.producer[name][1].op_type != "DequantizeLinear":
            raise ValueError("its weight is not a DequantizeLinear of a constant")
        dq = self.producer[name][1]
        scale, zp = self.const(dq.input[1]), self.const(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
        axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
        w = self.const(dq.input[0])
        if w is None and dq.input[0] in self.producer and self.producer[dq.input[0]][1].op_type == "QuantizeLinear":
            q = self.producer[dq.input[0]][1]
            w32, s2 = self.const(q.input[0]), self.const(q.input[1])
            z2 = self.const(q.input[2]) if len(q.input) > 2 and q.input[2] else None
            q_axis = next((a.i for a in q.attribute if a.name == "axis"), 1)
            if w32 is None or s2 is None or z2 is None or z2.dtype != np.int8:
                raise ValueError("its weight QuantizeLinear is not int8 of a constant")
            if scale is None or not np.array_equal(s2, scale) or zp is None or not np.array_equal(z2, zp):
                raise ValueError("its weight Q/DQ pair has unequal factors")
            w = quantize(w32, s2.ravel(), z2.ravel(), q_axis % w32.ndim)
        if w is None or w.dtype != np.int8 or scale is None:
            raise ValueError("its weight is not int8 (a constant through QuantizeLinear, or an int8 initializer)")
        if zp is not None and np.any(zp != 0):
            raise ValueError("its weight has a nonzero zero point (AMCT takes symmetric weights only)")
        return w, scale.astype(np.float32).ravel(), axis % w.ndim

    def _int_op(self, node: Any, quant: Quant) -> IntOp:
        attrs = {a.name: a for a in node.attribute}
        w, ws, axis = self._weight(node.input[1])
        alpha, beta = 1.0, 1.0
        if node.op_type == "Gemm":
            if "transA" in attrs and attrs["transA"].i:
                raise ValueError("Gemm with transA is not adapted by AMCT")
            if "transB" in attrs and attrs["transB"].i:
                w, axis = w.T, 1 - axis
            alpha = attrs["alpha"].f if "alpha" in attrs else 1.0
            beta = attrs["beta"].f if "beta" in attrs else 1.0
        if node.op_type in ("Gemm", "MatMul") and w.ndim != 2:
            raise ValueError(f"{node.op_type} with a {w.ndim}-D weight")
        groups = attrs["group"].i if "group" in attrs else 1
        out_axis = {"Conv": 0, "ConvTranspose": 1}.get(node.op_type, 1)
        if ws.size > 1 and (axis != out_axis or ws.size != w.shape[out_axis]):
            raise ValueError("its weight is quantized per channel on an axis that is not its output channels")
        channels = w.shape[out_axis] * (groups if node.op_type == "ConvTranspose" else 1)
        per_channel = np.tile(ws, channels // ws.size) if ws.size > 1 else np.full(channels, ws[0], np.float32)
        step = float(np.float32(quant.scale)) * per_channel.astype(np.float64)  # s_x * s_w per output channel
        bias = None
        if len(node.input) > 2 and node.input[2]:
            b = self.const(node.input[2])
            if b is None or b.size not in (1, channels) or (b.size > 1 and max(b.shape) != b.size):
                raise ValueError("its bias is not a constant per output channel")
            b = np.broadcast_to(b.astype(np.float64).ravel() * beta, (channels,))
            bias = np.clip(np.rint(b / step), -2 ** 31, 2 ** 31 - 1).astype(np.int32)
        taps = int(np.prod(w.shape[1:])) if node.op_type == "Conv" else (
            int(w.shape[0] // groups * np.prod(w.shape[2:])) if node.op_type == "ConvTranspose" else int(w.shape[0]))
        return IntOp(node, quant, w, (step * alpha).astype(np.float32), bias, taps)

    # --- emission -------------------------------------------------------------------------------------------
    def emit(self, k: int, node: Any, build: Any) -> bool:
        """Emit node ``k``'s device arithmetic into ``build`` (precision._Build) when it is on the int8 path."""
        if k in self.quants:
            _Emitter(build, f"__i8_{k}", self.cache).quant(self.quants[k])
        elif k in self.antiquants:
            _Emitter(build, f"__i8_{k}", self.cache).antiquant(self.antiquants[k])
        elif k in self.ops:
            _Emitter(build, f"__i8_{k}", self.cache).int_op(self.ops[k], self.deq_rule)
        else:
            return False
        return True

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ops": len(self.ops), "rule": RULE, "quantize": len(self.quants),
            "deq_scale": "fp32 applied as S19 (10-bit mantissa)" if self.deq_rule == S19 else "fp16",
            "op_types": sorted({op.node.op_type for op in self.ops.values()})}
        inexact = [op.node.name for op in self.ops.values()
                   if op.node.op_type == "ConvTranspose" and op.taps * SPLIT * 127 >= EXACT]
        if inexact:
            out["inexact"] = inexact
        if self.skipped:
            out["skipped"] = self.skipped
        return out


class _Emitter:
    """Appends one int8-path node's ONNX arithmetic to a precision._Build; its constants (the int8 weights, made
    once per plan in ``cache``) are named by the emitting node and their order, the same in every build."""

    def __init__(self, build: Any, prefix: str, cache: dict[str, Any]):
        self.build, self.p, self.n, self.c, self.cache = build, prefix, 0, 0, cache

    def name(self, tag: str) -> str:
        self.n += 1
        return f"{self.p}_{tag}{self.n}"

    def node(self, op: str, inputs: list[str], out: str | None = None, protos: list[Any] | None = None,
             **attrs: Any) -> str:
        from onnx import helper

        out = out or self.name(op.lower())
        made = helper.make_node(op, inputs, [out], name=f"{out}_n", **attrs)
        made.attribute.extend(protos or [])
        self.build.nodes.append(made)
        return out

    def const(self, value: np.ndarray, tag: str) -> str:
        from onnx import numpy_helper

        self.c += 1
        name = f"{self.p}_{tag}_c{self.c}"
        if name not in self.cache:
            self.cache[name] = numpy_helper.from_array(np.ascontiguousarray(value), name)
        self.build.extra_inits.append(self.cache[name])
        return name

    def round16(self, src: str, out: str | None = None) -> str:
        """``src`` rounded to fp16 (clipped to +-65504 first on a saturating SoC)."""
        if self.build.saturate:
            if self.build.int8_bounds is None:
                from onnx import numpy_helper

                self.build.int8_bounds = ("__i8_fp16_lo", "__i8_fp16_hi")
                self.build.extra_inits += [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
                                           zip(self.build.int8_bounds, (-FP16_MAX, FP16_MAX), strict=True)]
            src = self.node("Clip", [src, *self.build.int8_bounds])
        return self.node("Cast", [self.node("Cast", [src], to=FP16)], out, to=FLOAT)

    def done(self, out: str) -> None:
        if self.build.dtype == FP16:
            self.build.rounded.add(out)

    def quant(self, q: Quant) -> None:
        x = q.x if self.build.dtype == FP16 and q.x in self.build.rounded else self.round16(q.x)
        scale, twice = quant_scale(q.scale)
        sc = self.const(np.array(scale, np.float32), "scale")
        m = self.round16(self.node("Mul", [x, sc]))
        if twice:
            m = self.round16(self.node("Mul", [m, sc]))
        if q.zp:
            m = self.round16(self.node("Add", [m, self.const(np.array(q.zp, np.float32), "offset")]))
        lo, hi = (self.const(np.array(v, np.float32), "i8") for v in (-128.0, 127.0))
        self.node("Cast", [self.node("Clip", [self.node("Round", [m]), lo, hi])], q.q, to=INT8)

    def antiquant(self, a: AntiQuant) -> None:
        x = self.node("Cast", [a.q], to=FLOAT)
        if a.zp:
            x = self.node("Sub", [x, self.const(np.array(a.zp, np.float32), "zp")])
        scale = self.const(np.array(np.float16(a.scale), np.float32), "scale")
        self.round16(self.node("Mul", [x, scale]), a.out)
        self.done(a.out)

    def int_op(self, op: IntOp, rule: str) -> None:
        node, q = op.node, op.quant
        attrs = {a.name: a for a in node.attribute}
        zp = self.const(np.array(q.zp, np.int8), "zp")
        if node.op_type == "Conv":
            acc = self.node("ConvInteger", [q.q, self.const(op.w, "w"), zp], protos=list(attrs.values()))
        elif node.op_type == "ConvTranspose":
            acc = self._conv_transpose(op, list(attrs.values()))
        else:
            acc = self.node("MatMulInteger", [q.q, self.const(op.w, "w"), zp])
        channel_shape = [-1] + [1] * (len(op.w.shape) - 2) if node.op_type.startswith("Conv") else [-1]
        if op.bias is not None:
            acc = self.node("Add", [acc, self.const(op.bias.reshape(channel_shape), "bias")])
        factor, twice = deq_factors(op.deq, rule)
        f = self.const(factor.reshape(channel_shape), "deq")
        y = self.node("Mul", [self.node("Cast", [acc], to=FLOAT), f])
        if twice:
            y = self.node("Mul", [self.round16(y), f])
        self.round16(y, node.output[0])
        self.done(node.output[0])

    def _conv_transpose(self, op: IntOp, attrs: list[Any]) -> str:
        """Exact int32 ConvTranspose of (q - zp) by the int8 weight: fp32 on hi and lo parts, summed in int32."""
        x = self.node("Sub", [self.node("Cast", [op.quant.q], to=FLOAT),
                              self.const(np.array(op.quant.zp, np.float32), "zp")])
        k = self.const(np.array(SPLIT, np.float32), "k")
        hi = self.node("Floor", [self.node("Div", [x, k])])
        lo = self.node("Sub", [x, self.node("Mul", [hi, k])])
        w = self.const(op.w.astype(np.float32), "w")
        parts = []
        for part in (hi, lo):
            parts.append(self.node("Cast", [self.node("ConvTranspose", [part, w], protos=attrs)], to=INT32))
        return self.node("Add", [self.node("Mul", [parts[0], self.const(np.array(SPLIT, np.int32), "k")]), parts[1]])


def plan(model: Any, deq_scale: str = S19) -> Int8Plan | None:
    """The int8 plan of ``model``, or None for a graph without QuantizeLinear (left exactly as it was)."""
    if not any(n.op_type == "QuantizeLinear" for n in model.graph.node):
        return None
    found = Int8Plan(model, deq_scale)
    return found if found.quants else None


def prune(nodes: list[Any], roots: list[str], given: frozenset[str] = frozenset()) -> list[Any]:
    """``nodes`` without those whose outputs nothing needed reads (the weights' Q/DQ the int8 ops replaced);
    values in ``given`` are taken as they are (their makers are not needed for them)."""
    needed, kept = set(roots), []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(i for i in node.input if i and i not in given)
    return kept[::-1]
