"""AMCT-ready int8 bundles: the checker of AMCT's convert_qat_model rules (hand-built graphs, one per rule, and a
real torch.ao QAT export), convert.sh's AMCT step before atc, ``--format om`` and ``convert`` with and without AMCT.

AMCT itself is not installed here. Where a test needs it to have run, ``helpers/amct_test_double`` stands in: a
TEST DOUBLE package ``amct_onnx`` whose convert_qat_model records its arguments and copies the model (no
quantization numerics), enough to check the order and the paths of the AMCT step."""
import copy
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from helpers.fake_atc import fake_atc, path_without_atc
from helpers.qdq_graphs import QdqGraph, conv_model
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import cann_export
from cann_export import errors
from cann_export.atc import amct_run
from cann_export.atc.amct import check_qdq
from cann_export.graph import module_paths
from cann_export.cli.main import cli
from cann_export.hooks.manager import get_plugin_manager

DOUBLE = Path(__file__).parents[1] / "helpers" / "amct_test_double"


@pytest.fixture(scope="module", autouse=True)
def plugin_commands():
    get_plugin_manager().hook.register_commands(cli=cli)  # what main() does before running the group


# ------------------------------------------------------------------ the rules, on hand-built graphs


def conv_transpose_model(axis=1):
    g = QdqGraph()
    w = g.weight("convt_w", (3, 5, 2, 2), per_channel_axis=axis)  # (C_in, C_out, kH, kW): output channels on 1
    g.node("ConvTranspose", [g.qdq("x", "act"), w], "y", "up_node", module="decoder.up", strides=[2, 2])
    g.output("y", (1, 5, 16, 16))
    return g.model(), g.paths


def gemm_model(per_channel=False, **attrs):
    g = QdqGraph((2, 8))
    w = g.weight("fc_w", (4, 8), per_channel_axis=0 if per_channel else None)
    g.node("Gemm", [g.qdq("x", "act"), w, g.const("fc_b", np.zeros(4, np.float32))], "y", "fc_node",
           module="head.fc", transB=1, **attrs)
    g.output("y", (2, 4))
    return g.model(), g.paths


def matmul_model(shape=(8, 4), per_channel=False):
    g = QdqGraph((2, 8))
    w = g.weight("mm_w", shape, per_channel_axis=len(shape) - 1 if per_channel else None)
    g.node("MatMul", [g.qdq("x", "act"), w], "y", "mm_node", module="blocks.0.proj")
    g.output("y", (2, 4))
    return g.model(), g.paths


def add_model(scale=0.05, axis=None):
    g = QdqGraph((1, 3, 8, 8))
    relu = g.node("Relu", ["x"], "r", "relu_node", module="stem.act")
    a, b = g.qdq("x", "a", scale=scale, zero_point=np.zeros(np.size(scale)) if axis is not None else 0,
                 axis=axis), g.qdq(relu, "b")
    g.node("Add", [a, b], "y", "add_node", module="blocks.0.residual")
    g.output("y", (1, 3, 8, 8))
    return g.model(), g.paths


def output_q_model():
    g = QdqGraph((2, 8))
    relu = g.node("Relu", ["x"], "r", "relu_node", module="head.act")
    s, z = g.const("out_s", 0.1, np.float32), g.const("out_z", 0, np.int8)
    g.node("QuantizeLinear", [relu, s, z], "y", "out_quant")
    g.outputs.append(helper.make_tensor_value_info("y", TensorProto.INT8, [2, 8]))
    return g.model(), g.paths


CONFORMING = {
    "conv per output channel": conv_model,
    "conv per tensor": lambda: conv_model(axis=None),
    "conv, asymmetric activation": lambda: _set(conv_model(), "act_zp", np.int8(-7)),
    "convtranspose per output channel": conv_transpose_model,
    "gemm per tensor": gemm_model,
    "single-input matmul": matmul_model,
    "add": add_model,
    "graph-output quantize": output_q_model,
}


def _set(built, name, value):
    model, paths = built
    init = next(t for t in model.graph.initializer if t.name == name)
    init.CopyFrom(numpy_helper.from_array(np.asarray(value), name))
    return model, paths


@pytest.mark.parametrize("build", CONFORMING.values(), ids=CONFORMING.keys())
def test_conforming_graphs_pass(build):
    model, paths = build()
    onnx.checker.check_model(model, full_check=True)  # a valid ONNX graph, shapes inferred
    assert check_qdq(model, paths) == []


def _bad_dq_scale():
    g = QdqGraph()
    a = g.qdq("x", "act", dq_scale=0.06)
    g.node("Conv", [a, g.weight("conv_w", (4, 3, 3, 3), per_channel_axis=0)], "y", "conv_node",
           module="features.conv")
    g.output("y", (1, 4, 6, 6))
    return g.model(), g.paths


def _bad_dq_zero_point():
    g = QdqGraph()
    a = g.qdq("x", "act", zero_point=3, dq_zero_point=4)
    g.node("Conv", [a, g.weight("conv_w", (4, 3, 3, 3), per_channel_axis=0)], "y", "conv_node",
           module="features.conv")
    g.output("y", (1, 4, 6, 6))
    return g.model(), g.paths


def _computed_scale():
    model, paths = conv_model()
    mul = helper.make_node("Mul", ["act_scale", "act_scale"], ["act_scale2"], name="scale_mul")
    model.graph.node.insert(0, mul)
    for node in model.graph.node:
        if node.name in ("act_quant", "act_dequant"):
            node.input[1] = "act_scale2"
    return model, paths


def _no_zero_point():
    g = QdqGraph()
    a = g.qdq("x", "act", zero_point=None)  # ONNX: no zero point means uint8
    g.node("Conv", [a, g.weight("conv_w", (4, 3, 3, 3), per_channel_axis=0)], "y", "conv_node",
           module="features.conv")
    g.output("y", (1, 4, 6, 6))
    return g.model(), g.paths


def _fp16_scale():
    model, paths = conv_model()
    init = next(t for t in model.graph.initializer if t.name == "act_scale")
    init.CopyFrom(numpy_helper.from_array(np.float16(0.05), "act_scale"))
    return model, paths


def _per_channel_activation():
    g = QdqGraph()
    a = g.qdq("x", "act", scale=np.full(3, 0.05), zero_point=np.zeros(3), axis=1)
    g.node("Conv", [a, g.weight("conv_w", (4, 3, 3, 3), per_channel_axis=0)], "y", "conv_node",
           module="features.conv")
    g.output("y", (1, 4, 6, 6))
    return g.model(), g.paths


def _computed_conv_weight():
    g = QdqGraph()
    g.inputs.append(helper.make_tensor_value_info("w_in", TensorProto.FLOAT, [4, 3, 3, 3]))
    w = g.qdq("w_in", "w", scale=np.linspace(0.01, 0.03, 4), zero_point=np.zeros(4), axis=0)
    g.node("Conv", [g.qdq("x", "act"), w], "y", "conv_node", module="features.conv")
    g.output("y", (1, 4, 6, 6))
    return g.model(), g.paths


def _two_tensor_matmul():
    g = QdqGraph((2, 8))
    g.inputs.append(helper.make_tensor_value_info("k", TensorProto.FLOAT, [8, 4]))
    g.node("MatMul", [g.qdq("x", "q"), g.qdq("k", "k")], "y", "attn_node", module="blocks.0.attn")
    g.output("y", (2, 4))
    return g.model(), g.paths


def _pair_on(op, module, index=0):
    g = QdqGraph()
    g.node(op, [g.qdq("x", "act")] if index == 0 else ["x"], "y", f"{op.lower()}_node", module=module)
    g.output("y", (1, 3, 8, 8))
    return g.model(), g.paths


def _pair_on_bias():
    g = QdqGraph()
    b = g.qdq(g.const("conv_b", np.zeros(4, np.float32)), "bias", scale=0.01)
    w = g.weight("conv_w", (4, 3, 3, 3), per_channel_axis=0)
    g.node("Conv", [g.qdq("x", "act"), w, b], "y", "conv_node", module="features.conv")
    g.output("y", (1, 4, 6, 6))
    return g.model(), g.paths


def _dq_as_output():
    g = QdqGraph((2, 8))
    relu = g.node("Relu", ["x"], "r", "relu_node", module="head.act")
    dq = g.qdq(relu, "out")
    g.output(dq, (2, 8))
    return g.model(), g.paths


def _int8_weight_without_quantize():
    g = QdqGraph()
    w = g.const("conv_w_int8", np.ones((4, 3, 3, 3), np.int8))
    s, z = g.const("w_s", np.full(4, 0.02, np.float32)), g.const("w_z", np.zeros(4, np.int8))
    g.node("DequantizeLinear", [w, s, z], "w_dq", "w_dequant", axis=0)
    g.node("Conv", [g.qdq("x", "act"), "w_dq"], "y", "conv_node", module="features.conv")
    g.output("y", (1, 4, 6, 6))
    return g.model(), g.paths


def _quantize_feeding_relu():
    g = QdqGraph()
    s, z = g.const("s", 0.05, np.float32), g.const("z", 0, np.int8)
    q = g.node("QuantizeLinear", ["x", s, z], "xq", "x_quant")
    g.node("Relu", [q], "y", "relu_node", module="stem.act")
    g.outputs.append(helper.make_tensor_value_info("y", TensorProto.INT8, [1, 3, 8, 8]))
    return g.model(), g.paths


def _float_weight_conv():
    g = QdqGraph()
    w = g.const("conv_w", np.ones((4, 3, 3, 3), np.float32))
    g.node("Conv", [g.qdq("x", "act"), w], "y", "conv_node", module="features.conv")
    g.output("y", (1, 4, 6, 6))
    return g.model(), g.paths


VIOLATIONS = {  # rule -> (graph, the module the finding must name, words of its message)
    "scale differs in the pair": (_bad_dq_scale, "amct-pair-factors", "features.conv", "different scale"),
    "zero point differs in the pair": (_bad_dq_zero_point, "amct-pair-factors", "features.conv", "zero point"),
    "scale computed, not constant": (_computed_scale, "amct-pair-factors", "features.conv", "constant"),
    "uint8 activation": (lambda: _set(conv_model(), "act_zp", np.uint8(128)), "amct-int8", "features.conv",
                         "uint8"),
    "no zero point (uint8)": (_no_zero_point, "amct-int8", "features.conv", "default"),
    "int16 weight": (lambda: _set(conv_model(), "conv_w_zp", np.zeros(4, np.int16)), "amct-int8",
                     "features.conv", "int16"),
    "fp16 input": (_fp16_scale, "amct-float32", "features.conv", "float32"),
    "per-channel activation": (_per_channel_activation, "amct-activation-per-tensor", "features.conv",
                               "per channel"),
    "per-channel add input": (lambda: add_model(scale=np.full(3, 0.05), axis=1), "amct-activation-per-tensor",
                              "blocks.0.residual", "Add"),
    "computed conv weight": (_computed_conv_weight, "amct-weight-constant", "features.conv", "constant"),
    "two-tensor matmul": (_two_tensor_matmul, "amct-weight-constant", "blocks.0.attn", "single-input MatMul"),
    "weight zero point": (lambda: conv_model(axis=None, zero_point=3), "amct-weight-zero-point", "features.conv",
                          "symmetric"),
    "conv weight per input channel": (lambda: conv_model(axis=1), "amct-weight-granularity", "features.conv",
                                      "axis 1"),
    "convtranspose weight on axis 0": (lambda: conv_transpose_model(axis=0), "amct-weight-granularity",
                                       "decoder.up", "output-channel axis (1"),
    "gemm weight per channel": (lambda: gemm_model(per_channel=True), "amct-weight-granularity", "head.fc",
                                "per-tensor"),
    "matmul weight per channel": (lambda: matmul_model(per_channel=True), "amct-weight-granularity",
                                  "blocks.0.proj", "per-tensor"),
    "gemm transA": (lambda: gemm_model(transA=1), "amct-gemm", "head.fc", "transA=1"),
    "gemm alpha": (lambda: gemm_model(alpha=0.5), "amct-gemm", "head.fc", "alpha=0.5"),
    "3-D matmul weight": (lambda: matmul_model(shape=(1, 8, 4)), "amct-matmul-weight", "blocks.0.proj", "2-D"),
    "pair feeding Relu": (lambda: _pair_on("Relu", "stem.act"), "amct-unadapted-op", "stem.act", "Relu"),
    "pair feeding MaxPool": (lambda: _pair_on("GlobalMaxPool", "pool"), "amct-unadapted-op", "pool", "does not"),
    "pair on a conv bias": (_pair_on_bias, "amct-unadapted-op", "features.conv", "bias"),
    "pair as graph output": (_dq_as_output, "amct-unadapted-op", "head.act", "graph output"),
    "int8 weight without QuantizeLinear": (_int8_weight_without_quantize, "amct-unpaired", "features.conv",
                                           "float32 weight"),
    "QuantizeLinear feeding Relu": (_quantize_feeding_relu, "amct-unpaired", "stem.act", "directly"),
    "only the activation quantized": (_float_weight_conv, "amct-both-inputs", "features.conv", "weight (input 1)"),
    "per channel below opset 13": (lambda: conv_model(opset=12), "amct-opset", None, "opset 13"),
}


@pytest.mark.parametrize("case", VIOLATIONS.values(), ids=VIOLATIONS.keys())
def test_each_rule_is_refused_naming_the_module(case):
    build, rule, module, words = case
    model, paths = build()
    findings = check_qdq(model, paths)
    assert findings and all(f["severity"] == "error" for f in findings)
    hits = [f for f in findings if f["rule"] == rule]
    assert hits, findings
    finding = hits[0]
    assert words in finding["message"], finding["message"]
    assert finding["node"] and f"node {finding['node']!r}" in finding["message"]
    if module is not None:
        assert finding["module"] == module and f"module {module}" in finding["message"]
    # the same graph through the whole lint: refused, the rule among its errors
    from cann_export.atc.lint import lint_model

    report = lint_model(model, "8.0", {}, "force_fp16", paths)
    assert not report["passed"] and rule in {f["rule"] for f in report["findings"] if f["severity"] == "error"}


def test_module_comes_from_the_nodes_own_metadata_without_a_table():
    model, _ = conv_model(axis=1)
    (finding,) = check_qdq(model)  # no module_paths given: the cann_export.module stamp on the node
    assert finding["module"] == "features.conv"


# ------------------------------------------------------------------ a real QAT export (torch.ao eager)


class AmctNet(nn.Module):
    """torch.ao eager QAT laid out the way AMCT adapts it: int8 fake quantization on the inputs of the conv and
    the linear layer, a per-channel conv weight, a per-tensor linear weight, no fake quantization elsewhere."""

    def __init__(self):
        super().__init__()
        import torch.ao.quantization as tq

        self.quant, self.quant_fc = tq.QuantStub(), tq.QuantStub()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(self.quant_fc(torch.relu(self.conv(self.quant(x))).mean((2, 3))))


@pytest.fixture(scope="module")
def qat_model():
    import torch.ao.quantization as tq

    act = tq.FakeQuantize.with_args(observer=tq.MovingAverageMinMaxObserver, quant_min=-128, quant_max=127,
                                    dtype=torch.qint8, qscheme=torch.per_tensor_affine)
    per_tensor_w = tq.FakeQuantize.with_args(observer=tq.MovingAverageMinMaxObserver, quant_min=-127,
                                             quant_max=127, dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
    float_out = tq.PlaceholderObserver.with_args(dtype=torch.float)
    torch.manual_seed(0)
    model = AmctNet().train()
    model.quant.qconfig = model.quant_fc.qconfig = tq.QConfig(activation=act, weight=per_tensor_w)
    model.conv.qconfig = tq.QConfig(activation=float_out, weight=tq.default_per_channel_weight_fake_quant)
    model.fc.qconfig = tq.QConfig(activation=float_out, weight=per_tensor_w)
    tq.prepare_qat(model, inplace=True)
    x = torch.randn(16, 3, 8, 8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        loss = nn.functional.mse_loss(model(x), torch.zeros(16, 4))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval(), x[:2]


def export(qat_model, out, fmt="atc_ready", **kw):
    model, x = qat_model
    return cann_export.export(copy.deepcopy(model), out, fmt, example_inputs=(x,), **kw)


@pytest.fixture(scope="module")
def stub_bundle(qat_model, tmp_path_factory):
    """An om export of the QAT model with neither atc nor AMCT here: an om-stub bundle, validated."""
    out = tmp_path_factory.mktemp("amct") / "qat_om"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", path_without_atc())
        result = export(qat_model, out, "om")
    assert result.ok, result.parity
    return out, result


def manifest_of(bundle):
    return json.loads((bundle / "manifest.json").read_text())


def test_real_qat_export_meets_amcts_rules(stub_bundle):
    bundle, result = stub_bundle
    model = onnx.load(str(bundle / "model.onnx"))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("QuantizeLinear") == 4 and ops.count("DequantizeLinear") == 4
    assert check_qdq(model, module_paths.collect(model)) == []
    lint = result.manifest["lint"]["atc-lint"]
    assert lint["passed"] and [f["rule"] for f in lint["findings"]] == ["qdq-amct"]

    # the same written graph with the linear layer's weight made per channel: refused, naming the layer
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    dq = next(n for n in model.graph.node if n.output[0] == gemm.input[1])
    q = next(n for n in model.graph.node if n.output[0] == dq.input[0])
    weight = next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == q.input[0])
    scale = (np.abs(weight).max(axis=1) / 127).astype(np.float32)
    model.graph.initializer.extend([numpy_helper.from_array(scale, "fc_scale_pc"),
                                    numpy_helper.from_array(np.zeros(4, np.int8), "fc_zp_pc")])
    for node in (q, dq):
        node.input[1], node.input[2] = "fc_scale_pc", "fc_zp_pc"
        del node.attribute[:]
        node.attribute.append(helper.make_attribute("axis", 0))
    (finding,) = check_qdq(model, module_paths.collect(model))
    assert finding["rule"] == "amct-weight-granularity" and finding["module"] == "fc"


# ------------------------------------------------------------------ convert.sh


@pytest.fixture
def tools(tmp_path, monkeypatch):
    """PATH with a stand-in atc (records its argv) and python3 (this interpreter); ``use_amct()`` puts the
    amct_onnx TEST DOUBLE on the path of this process and of its children."""
    argv = tmp_path / "atc_argv.txt"
    bin_dir = fake_atc(tmp_path / "bin", argv)
    (bin_dir / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_dir), path_without_atc()]))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert amct_run.find_amct() is None  # no AMCT here: the tests below choose

    record = tmp_path / "amct_calls.jsonl"

    def use_amct(fail=False):
        monkeypatch.syspath_prepend(str(DOUBLE))
        monkeypatch.setenv("PYTHONPATH", str(DOUBLE))
        monkeypatch.setenv("AMCT_TEST_DOUBLE_RECORD", str(record))
        if fail:
            monkeypatch.setenv("AMCT_TEST_DOUBLE_FAIL", "1")
        assert amct_run.find_amct()["version"] == "0.0.0+test.double"

    def calls():
        return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []

    return argv, use_amct, calls


def test_convert_sh_runs_amct_then_atc_on_the_deploy_model(stub_bundle, tools, tmp_path):
    bundle, _ = stub_bundle
    atc = manifest_of(bundle)["atc"]
    assert atc["command"][2] == "--model=amct/model_deploy_model.onnx"
    assert atc["amct"]["command"] == ["python3", "-c", amct_run.SCRIPT, "model.onnx", "amct/model", "amct/record.txt"]
    script = (bundle / "atc" / "convert.sh").read_text()
    lines = script.splitlines()
    amct_line = lines.index(shlex.join(atc["amct"]["command"]))
    atc_line = next(i for i, line in enumerate(lines) if line.startswith("atc "))
    assert amct_line < atc_line and lines[atc_line] == shlex.join(atc["command"]) + ' "$@"'
    assert subprocess.run(["bash", "-n", str(bundle / "atc" / "convert.sh")]).returncode == 0

    argv, use_amct, calls = tools
    work = tmp_path / "copy"
    shutil.copytree(bundle, work)
    missing = subprocess.run(["bash", str(work / "atc" / "convert.sh")], capture_output=True, text=True)
    assert missing.returncode == 2 and "amct_onnx" in missing.stderr and "Ascend-cann-amct" in missing.stderr
    assert not argv.exists() and not (work / "amct").exists()  # neither AMCT nor atc ran

    use_amct()
    done = subprocess.run(["bash", str(work / "atc" / "convert.sh")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (call,) = calls()
    assert call == {"model_file": "model.onnx", "save_path": "amct/model", "record_file": "amct/record.txt",
                    "cwd": str(work), "model_exists": True}
    assert argv.read_text().splitlines() == atc["command"][1:]  # atc ran after, on the deploy model AMCT wrote
    assert (work / "amct" / "model_deploy_model.onnx").is_file() and (work / "model.om").is_file()


# ------------------------------------------------------------------ --format om


def test_om_stub_names_why(stub_bundle):
    bundle, result = stub_bundle
    om = manifest_of(bundle)["atc"]["om"]
    assert om["kind"] == "stub" and "no `atc` on PATH" in om["reason"] and "AMCT" in om["reason"]
    info = result.info()
    assert info.label == "om-stub" and "amct_onnx" in info.notes[0] and "CANN and AMCT" in info.notes[0]


def test_om_with_atc_but_no_amct_is_a_stub_saying_so(qat_model, tools, tmp_path):
    argv, _, _ = tools
    result = export(qat_model, tmp_path / "b", "om", validate=False)
    om = result.manifest["atc"]["om"]
    assert om["kind"] == "stub" and om["reason"] == amct_run.MISSING and not argv.exists()
    assert result.info().label == "om-stub" and amct_run.MISSING in result.info().notes[0]
    assert (tmp_path / "b" / "model.om").read_bytes()[120:136] == b"CANN-EXPORT-STUB"

    with pytest.raises(errors.ExportError, match="Ascend-cann-amct") as refused:
        export(qat_model, tmp_path / "strict", "om", validate=False, require_atc=True)
    assert refused.value.exit_code == 3 and not (tmp_path / "strict").exists()


def test_om_with_amct_runs_it_before_atc(qat_model, tools, tmp_path):
    argv, use_amct, calls = tools
    use_amct()
    out = tmp_path / "b"
    result = export(qat_model, out, "om", validate=False)
    atc = result.manifest["atc"]
    assert atc["om"]["kind"] == "atc" and (out / "model.om").read_bytes().startswith(b"FAKE-OM ")
    assert atc["amct"]["ran"] and atc["amct"]["exit_code"] == 0 and atc["amct"]["version"] == "0.0.0+test.double"
    (call,) = calls()
    assert call["model_file"] == "model.onnx" and call["model_exists"]
    assert argv.read_text().splitlines() == atc["command"][1:]
    assert "--model=amct/model_deploy_model.onnx" in atc["command"]  # the deploy model AMCT wrote, read by atc
    kept = {p.relative_to(out).as_posix() for p in (out / "amct").rglob("*") if p.is_file()}
    assert kept == {"amct/amct.log", "amct/record.txt", "amct/amct_log/amct_onnx.log"}  # deploy model dropped
    assert kept <= set(result.manifest["files"])
    assert "TEST DOUBLE: copied model.onnx" in (out / "amct" / "amct.log").read_text()
    assert not (out / "amct_log").exists()


# ------------------------------------------------------------------ cann-export convert


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def test_convert_without_amct_names_what_to_install(stub_bundle, tools, tmp_path):
    bundle, _ = stub_bundle
    argv, _, _ = tools
    result = invoke("convert", bundle / "model.om", "-o", tmp_path / "x.om")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "amct_onnx" in result.stderr and "Ascend-cann-amct" in result.stderr and "setup.py build" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"] and not argv.exists()  # nothing written, no atc


def test_convert_runs_amct_then_atc(stub_bundle, tools, tmp_path):
    bundle, _ = stub_bundle
    argv, use_amct, calls = tools
    use_amct()
    target = tmp_path / "deploy" / "qat.om"
    result = invoke("convert", bundle / "model.om", "-o", target, "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["amct"]["version"] == "0.0.0+test.double" and payload["amct"]["exit_code"] == 0
    assert payload["amct"]["command"] == manifest_of(bundle)["atc"]["amct"]["command"]
    (call,) = calls()
    assert call["model_exists"] and (call["model_file"], call["save_path"]) == ("model.onnx", "amct/model")
    assert "--model=amct/model_deploy_model.onnx" in argv.read_text().splitlines()
    assert target.read_bytes().startswith(b"FAKE-OM ")
    assert {p.name for p in target.parent.iterdir()} == {"qat.om", "qat.atc.log", "qat.amct.log"}
    again = invoke("convert", bundle / "model.om", "-o", tmp_path / "again.om")
    assert again.exit_code == 0, again.output
    assert "AMCT 0.0.0+test.double converted the Q/DQ graph first" in again.stdout


def test_convert_with_failing_amct_reports_it(stub_bundle, tools, tmp_path):
    bundle, _ = stub_bundle
    argv, use_amct, _ = tools
    use_amct(fail=True)
    target = tmp_path / "x.om"
    result = invoke("convert", bundle / "model.om", "-o", target, "--json")
    assert result.exit_code == 3 and "Traceback" not in result.stderr
    error = json.loads(result.stdout)["error"]
    assert error["stage"] == "convert" and "TEST DOUBLE: refused" in error["message"]
    assert not target.exists() and not argv.exists()  # atc never ran
    assert "refused the model" in (tmp_path / "x.amct.log").read_text()  # kept for the post-mortem
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_convert_never_runs_the_manifests_amct_command(stub_bundle, tools, tmp_path):
    bundle, _ = stub_bundle
    _, use_amct, calls = tools
    use_amct()
    copy_dir = tmp_path / "tampered"
    shutil.copytree(bundle, copy_dir)
    (copy_dir / "model.om").unlink()  # convert the directory bundle itself
    manifest = manifest_of(copy_dir)
    marker = tmp_path / "pwned"
    manifest["atc"]["amct"]["command"] = ["sh", "-c", f"touch {marker}"]
    manifest["files"].pop("model.om")
    (copy_dir / "manifest.json").write_text(json.dumps(manifest))
    result = invoke("convert", copy_dir, "-o", tmp_path / "t.om")
    assert result.exit_code == 2 and "atc.amct.command" in result.stderr
    assert not marker.exists() and calls() == [] and not (tmp_path / "t.om").exists()
