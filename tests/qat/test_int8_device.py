"""The device verdict of a Q/DQ graph emulates the AMCT-adapted int8 path (AscendQuant -> int8 op with int32
sums -> AscendDequant in fp16): every quantized layer of the emulation equals, bit for bit, an independent numpy
implementation (tests/helpers/int8_reference.py) on graphs built in the Q/DQ contract form and on a real QAT
export; fp32 Q/DQ semantics and deliberately wrong rules are told apart."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from helpers import int8_reference as ref
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import cann.torch
import cann_export
from cann_export.options import Tolerance
from cann_export.validators import int8_device
from cann_export.validators.fix_precision import device_report
from cann_export.validators.precision import Emulator

RNG = np.random.default_rng(7)


class Builder:
    """A graph in the Q/DQ contract form: activation x -> Q -> DQ (int8, per tensor, asymmetric) and constant
    fp32 weights on the int8 grid -> Q -> DQ (symmetric, per channel or per tensor) feeding each compute op."""

    def __init__(self):
        self.nodes, self.inits = [], []

    def const(self, name, value):
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def qdq(self, x, name, scale, zp):
        s, z = self.const(f"{name}_s", np.float32(scale)), self.const(f"{name}_z", np.int8(zp))
        self.nodes += [helper.make_node("QuantizeLinear", [x, s, z], [f"{name}_q"], name=f"{name}_quant"),
                       helper.make_node("DequantizeLinear", [f"{name}_q", s, z], [f"{name}_dq"], name=f"{name}_deq")]
        return f"{name}_dq"

    def weight(self, name, shape, scale, axis=0, scale_w=1.0):
        """Weights k * s_w with k in -127..127; ``scale`` per channel on ``axis`` when it is a vector."""
        k = RNG.integers(-127, 128, shape).astype(np.float32)
        scale = np.asarray(scale, np.float32) * np.float32(scale_w)
        bshape = [1] * len(shape)
        if scale.size > 1:
            bshape[axis] = scale.size
        w = self.const(f"{name}_w", (k * scale.reshape(bshape)).astype(np.float32))
        s = self.const(f"{name}_ws", scale)
        z = self.const(f"{name}_wz", np.zeros(scale.shape, np.int8))
        extra = {"axis": axis} if scale.size > 1 else {}
        self.nodes += [helper.make_node("QuantizeLinear", [w, s, z], [f"{name}_wq"], name=f"{name}_wquant", **extra),
                       helper.make_node("DequantizeLinear", [f"{name}_wq", s, z], [f"{name}_wdq"],
                                        name=f"{name}_wdeq", **extra)]
        return f"{name}_wdq"

    def op(self, op_type, inputs, name, **attrs):
        self.nodes.append(helper.make_node(op_type, inputs, [f"{name}_y"], name=name, **attrs))
        return f"{name}_y"

    def model(self, x_shape, out):
        graph = helper.make_graph(self.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                                  [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        return model


def conv_net(scale_w=1.0):
    """Conv (per channel) -> Relu -> depthwise Conv (per tensor, stride 2) -> Relu -> grouped 1x1 Conv; every
    activation zero point asymmetric; ``scale_w`` scales the first weights and the activation scales after them
    (outputs in the thousands, where fp16 rounding shows)."""
    b = Builder()
    h = b.op("Conv", [b.qdq("x", "a0", 0.05, 7), b.weight("c1", (16, 8, 3, 3), RNG.uniform(1e-3, 3e-3, 16),
                                                          scale_w=scale_w),
                      b.const("c1_b", RNG.normal(0, 0.3, 16).astype(np.float32))], "c1", pads=[1, 1, 1, 1])
    h = b.op("Relu", [h], "r1")
    h = b.op("Conv", [b.qdq(h, "a1", 0.03 * scale_w, -100), b.weight("dw", (16, 1, 3, 3), 4e-3),
                      b.const("dw_b", RNG.normal(0, 0.3, 16).astype(np.float32))], "dw",
             group=16, strides=[2, 2], pads=[1, 1, 1, 1])
    h = b.op("Relu", [h], "r2")
    h = b.op("Conv", [b.qdq(h, "a2", 0.04 * scale_w, -3), b.weight("gc", (8, 4, 1, 1), RNG.uniform(2e-3, 5e-3, 8)),
                      b.const("gc_b", RNG.normal(0, 0.3, 8).astype(np.float32))], "gc", group=4)
    return b.model([2, 8, 9, 9], h), ["c1", "dw", "gc"]


def linear_net():
    """MatMul on a 3-D input (per-tensor weight) + Add bias -> Relu -> Reshape -> Gemm (transB, bias C)."""
    b = Builder()
    h = b.op("MatMul", [b.qdq("x", "a0", 0.02, 11), b.weight("mm", (16, 24), 3e-3)], "mm")
    h = b.op("Relu", [b.op("Add", [h, b.const("mm_b", RNG.normal(0, 0.2, 24).astype(np.float32))], "mm_add")], "r")
    h = b.op("Reshape", [h, b.const("shape", np.array([10, 24], np.int64))], "flat")
    h = b.op("Gemm", [b.qdq(h, "a1", 0.05, -20), b.weight("fc", (12, 24), 2e-3),
                      b.const("fc_b", RNG.normal(0, 0.2, 12).astype(np.float32))], "fc", transB=1)
    return b.model([2, 5, 16], h), ["mm", "fc"]


def deconv_net():
    """Grouped ConvTranspose (stride 2, pads, weight per channel on its output axis 1) -> Relu -> Conv."""
    b = Builder()
    h = b.op("ConvTranspose", [b.qdq("x", "a0", 0.03, -40), b.weight("up", (8, 3, 3, 3), RNG.uniform(1e-3, 3e-3, 3),
                                                                    axis=1),
                               b.const("up_b", RNG.normal(0, 0.3, 6).astype(np.float32))], "up",
             group=2, strides=[2, 2], pads=[1, 1, 0, 0])
    h = b.op("Relu", [h], "r")
    h = b.op("Conv", [b.qdq(h, "a1", 0.02, -90), b.weight("c", (4, 6, 3, 3), RNG.uniform(1e-3, 3e-3, 4))], "c")
    return b.model([2, 8, 5, 5], h), ["up", "c"]


def _layers(model, names, feed, overflow="saturation", deq_scale="s19"):
    """Per quantized layer: (its AscendQuant input, its output) as the emulation holds them."""
    graph = ref.Graph(model)
    inputs = [graph.activation(graph.nodes[n])[0] for n in names]
    outputs = [graph.nodes[n].output[0] for n in names]
    emulator = Emulator(model, "force_fp16", overflow, deq_scale)
    held = emulator.session(expose=inputs + outputs).run(feed, inputs + outputs)
    return graph, emulator, dict(zip(names, held[:len(names)], strict=True)), dict(
        zip(names, held[len(names):], strict=True))


@pytest.mark.parametrize("build", [conv_net, linear_net, deconv_net])
@pytest.mark.parametrize(("overflow", "deq_scale"), [("saturation", "s19"), ("inf_nan", "s19"),
                                                     ("saturation", "fp16")])
def test_each_quantized_layer_equals_the_numpy_device_rule(build, overflow, deq_scale):
    model, names = build()
    feed = {"x": RNG.normal(0, 1.5, [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim])
            .astype(np.float32)}
    graph, emulator, x, y = _layers(model, names, feed, overflow, deq_scale)
    summary = emulator.int8.summary()
    assert summary["ops"] == len(names) and summary["rule"] == "AscendQuant/int32/AscendDequant fp16"
    assert "skipped" not in summary
    for n in names:
        expected = ref.layer(graph, n, x[n], saturate=overflow == "saturation", rule=deq_scale)
        assert np.array_equal(y[n], expected), (n, np.abs(y[n] - expected).max())
        assert np.array_equal(y[n], y[n].astype(np.float16).astype(np.float32))  # AscendDequant wrote fp16
        for wrong in ("dequant_fp32", "deq_fp32"):  # a deliberately wrong rule is told apart
            other = ref.layer(graph, n, x[n], saturate=overflow == "saturation", rule=deq_scale, wrong=wrong)
            if not (wrong == "deq_fp32" and deq_scale == "fp16"):  # fp16 deq: S19 truncation is not the rule there
                assert not np.array_equal(y[n], other), (n, wrong)


def test_ascend_quant_in_fp16_is_not_onnx_quantize_linear():
    """fp16(x) * fp16(1/s) rounds differently from QuantizeLinear's x / s in fp32 on some elements; the emulated
    layer follows the device's AscendQuant, and the wrong rule is told apart."""
    model, names = conv_net()
    feed = {"x": RNG.normal(0, 2.0, (2, 8, 9, 9)).astype(np.float32)}
    graph, _, x, y = _layers(model, names, feed)
    q16 = ref.ascend_quant(x["c1"], 0.05, 7, True)
    q32 = ref.ascend_quant(x["c1"], 0.05, 7, True, wrong="quant_fp32")
    assert np.any(q16 != q32)
    assert not np.array_equal(y["c1"], ref.layer(graph, "c1", x["c1"], wrong="quant_fp32"))


def test_fp32_qdq_semantics_differ_from_the_device_where_fp16_rounding_matters():
    """Large outputs (thousands: fp16 steps of 2 to 8): onnxruntime on the plain Q/DQ graph is not what the device
    computes; the emulation equals the numpy device rule, the plain graph does not."""
    model, names = conv_net(scale_w=300.0)
    feed = {"x": RNG.normal(0, 1.5, (2, 8, 9, 9)).astype(np.float32)}
    graph, emulator, x, y = _layers(model, names, feed)
    assert np.abs(y["c1"]).max() > 2048
    plain = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    fp32 = plain.run(None, feed)[0]
    emulated = emulator.session().run(feed)[0]
    device = ref.layer(graph, "gc", x["gc"])
    assert np.array_equal(emulated, device)
    assert np.abs(fp32 - emulated).max() > 0.5 and not np.array_equal(fp32, device)
    # the first layer: its fp32 result (the wrong rule) is off the fp16 grid the device writes, by up to half a step
    wrong = ref.layer(graph, "c1", x["c1"], wrong="dequant_fp32")
    assert 0.25 < np.abs(wrong - y["c1"]).max() <= np.spacing(np.float16(np.abs(y["c1"]).max())) / 2


def test_a_pair_feeding_add_is_ascend_quant_then_antiquant_in_fp16():
    """AMCT's Add scenario: AscendQuant -> AscendAntiQuant, fp16((q - zp) * fp16(s)) on the device."""
    b = Builder()
    out = b.op("Add", [b.qdq("x", "a0", 0.0123, 5), b.const("c", np.float32(0.5))], "add")
    model = b.model([3, 40], out)
    feed = {"x": RNG.normal(0, 0.5, (3, 40)).astype(np.float32)}
    emulator = Emulator(model, "force_fp16", "saturation")
    assert emulator.int8.summary()["ops"] == 0 and emulator.int8.summary()["quantize"] == 1
    dq = emulator.session(expose=["a0_dq"]).run(feed, ["a0_dq"])[0]
    q = ref.ascend_quant(feed["x"], 0.0123, 5, True).astype(np.float32)
    assert np.array_equal(dq, ((q - 5) * np.float32(np.float16(0.0123))).astype(np.float16).astype(np.float32))
    fp32 = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    assert not np.array_equal(emulator.session().run(feed)[0], fp32)


def test_graphs_without_qdq_are_left_alone_and_the_report_names_the_int8_path():
    model, names = linear_net()
    plain = onnx.load_from_string(model.SerializeToString())
    plain.graph.ClearField("node")
    plain.graph.node.extend([n for n in model.graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")])
    assert int8_device.plan(plain) is None and Emulator(plain, "force_fp16").int8 is None
    assert Emulator(model, "force_fp32").int8 is None  # nothing reduced: no device int8 path emulated
    feed = {"x": RNG.normal(0, 1.0, (2, 5, 16)).astype(np.float32)}
    plain_out = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    policy = Tolerance().device_policy()
    report = device_report(model, "force_fp16", [], [feed], [plain_out], ["fc_y"], policy, {})
    assert report["passed"] and report["precision"]["int8"]["ops"] == 2
    assert report["precision"]["int8"]["op_types"] == ["Gemm", "MatMul"]
    # a failing verdict localises through the int8 graph (every value exposed: the pruning keeps what is exposed)
    failing = device_report(model, "force_fp16", [], [feed], [[-plain_out[0]]], ["fc_y"], policy, {})
    assert not failing["passed"] and "first_divergence" in failing


class TokenNet(nn.Module):
    """Conv, depthwise and grouped convs, then a Linear on a 3-D token tensor."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.gc = nn.Conv2d(8, 8, 1, groups=2)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.gc(torch.relu(self.dw(torch.relu(self.conv(x))))))
        return self.head(h.flatten(2).transpose(1, 2)).mean(1)


@pytest.fixture(scope="module")
def qat_bundle(tmp_path_factory):
    cann.torch.config(quantization_aware_training=True, quant_config={"weight_bits": 8, "activation_bits": 8})
    try:
        torch.manual_seed(0)
        model = TokenNet()
        x, y = torch.randn(16, 3, 8, 8), torch.randint(0, 4, (16,))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with pytest.warns(UserWarning, match="fake quantization"):
            for _ in range(3):
                model.train()
                loss = nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        model.eval()
        out = tmp_path_factory.mktemp("qat") / "b"
        result = cann.torch.export(model=model, output_path=out, export_format="atc_ready", example_inputs=(x[:2],))
    finally:
        cann.torch.config(quantization_aware_training=False, quant_config={})
    return result, out, x[:2].numpy()


def test_a_real_qat_export_is_judged_on_the_int8_path(qat_bundle):
    result, out, x = qat_bundle
    int8 = result.manifest["parity"]["precision"]["int8"]
    assert int8["ops"] == 4 and int8["rule"] == "AscendQuant/int32/AscendDequant fp16"
    model = onnx.load(str(out / "model.onnx"))
    names = [n.name for n in model.graph.node if n.op_type in ("Conv", "MatMul", "Gemm")]
    # the 3-D Linear: MatMul + Add (Reshape -> Gemm -> Reshape before the structural lowering)
    assert len(names) == 4 and int8["op_types"] == sorted({n.op_type for n in model.graph.node if n.name in names})
    assert "skipped" not in int8
    graph = ref.Graph(model)
    _, _, held_x, held_y = _layers(model, names, {model.graph.input[0].name: x})
    for n in names:
        assert np.array_equal(held_y[n], ref.layer(graph, n, held_x[n])), n
    report = cann_export.validate(out)
    assert report["passed"] and report["precision"]["int8"]["ops"] == 4
    # Ascend310 (v100: deq_scale in fp16) saturates as Ascend310P3 does, yet its verdict is re-run, not reused
    fp16_deq = cann_export.validate(out, soc_versions=["Ascend310"])["socs"][0]
    assert fp16_deq["soc_version"] == "Ascend310" and fp16_deq["passed"]
    assert fp16_deq["outputs"][0]["cosine"] != report["device"]["outputs"][0]["cosine"]
