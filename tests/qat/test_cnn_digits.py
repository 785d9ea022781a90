"""QAT / PTQ to int8 on a real task (scikit-learn's bundled digits), exported as ONNX Q/DQ."""
import json

import onnx
import pytest
import torch
from click.testing import CliRunner
from helpers import digits
from safetensors.torch import save_file, save_model

import cann_export
from cann_export import errors
from cann_export.cli.main import cli

MODEL_CLASS = "helpers.digits:DigitsCNN"


@pytest.fixture(scope="module")
def digits_files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("digits")
    model = digits.trained()
    save_model(model, str(tmp / "digits.safetensors"))
    x_train = digits.split()[0]
    save_file({"x": x_train[:512].contiguous()}, str(tmp / "calib.safetensors"))
    return tmp, digits.accuracy_torch(model)


def export_quantized(tmp, mode, out, *extra):
    args = [str(tmp / "digits.safetensors"), "--model-class", MODEL_CLASS, f"--{mode}",
            "--calibration-data", str(tmp / "calib.safetensors"), "-o", str(out), "--json", *extra]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), json.loads((out / "manifest.json").read_text())


def test_qat_and_ptq_keep_digits_accuracy(digits_files, tmp_path):
    tmp, fp32_acc = digits_files
    qat_json, qat_manifest = export_quantized(tmp, "qat", tmp_path / "qat", "--qat-steps", "60", "--qat-lr", "1e-4")
    ptq_json, ptq_manifest = export_quantized(tmp, "ptq", tmp_path / "ptq")
    qat_acc = digits.accuracy_onnx(tmp_path / "qat" / "model.onnx")
    ptq_acc = digits.accuracy_onnx(tmp_path / "ptq" / "model.onnx")
    print(f"digits accuracy: fp32 {fp32_acc:.2f}  int8 QAT {qat_acc:.2f}  int8 PTQ {ptq_acc:.2f}")
    assert qat_acc >= fp32_acc - 1.0
    assert ptq_acc >= fp32_acc - 5.0  # reported for comparison; PTQ has no fine-tuning

    ops = {n.op_type for n in onnx.load(str(tmp_path / "qat" / "model.onnx")).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops and "BatchNormalization" not in ops
    assert qat_json["parity"]["passed"] and ptq_json["parity"]["passed"]
    q = qat_manifest["quantization"]
    assert q["mode"] == "qat" and ptq_manifest["quantization"]["mode"] == "ptq"
    assert q["config"]["weight_bits"] == 8 and len(q["calibration_data"]["sha256"]) == 64
    assert set(q["layers"]) == {"features.0", "features.3", "classifier"}
    assert q["qat"]["steps"] == 60 and 0.5 < q["int8_vs_float"]["outputs"][0]["cosine"] <= 1.0
    assert qat_manifest["parity"]["reference"] == "pytorch fake-quant model (eval mode)"


def test_qdq_graph_matches_the_fake_quant_model_per_channel(digits_files, tmp_path):
    from onnx import numpy_helper

    tmp, _ = digits_files
    export_quantized(tmp, "ptq", tmp_path / "p", "--exporter", "torchscript")
    graph = onnx.load(str(tmp_path / "p" / "model.onnx"))
    inits = {t.name: numpy_helper.to_array(t) for t in graph.graph.initializer}
    producer = {o: n for n in graph.graph.node for o in n.output}
    ops = [n for n in graph.graph.node if n.op_type in ("Conv", "Gemm", "MatMul")]
    assert len(ops) == 3
    for node in ops:  # the weight: a float constant -> QuantizeLinear -> DequantizeLinear (AMCT's form)
        quant = producer[producer[node.input[1]].input[0]]
        assert quant.op_type == "QuantizeLinear" and inits[quant.input[0]].dtype.name == "float32"
        scale = inits[quant.input[1]]
        if node.op_type == "Conv":
            assert scale.ndim == 1 and scale.size > 1  # per output channel
        else:
            assert scale.size == 1  # Gemm / MatMul: per tensor, AMCT's rule
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert all(o["passed"] for o in manifest["parity"]["outputs"])


def test_python_flow_with_the_users_own_loop(tmp_path):
    import cann.torch

    cann.torch.config(quantization_aware_training=True,
                      quant_config={"weight_bits": 8, "activation_bits": 8, "skip_modules": ["features.0"]})
    x, y, _, _ = digits.split()
    model = cann.torch.prepare(digits.trained(), x[:1])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model.train()
    for i in range(0, 256, 32):  # the user's unchanged training loop
        loss = torch.nn.functional.cross_entropy(model(x[i:i + 32]), y[i:i + 32])
        opt.zero_grad()
        loss.backward()
        opt.step()
    result = cann.torch.export(model=model, output_path=tmp_path / "b", export_format="atc_ready",
                               example_inputs=(x[:4],))
    assert result.ok, result.parity
    layers = result.manifest["quantization"]["layers"]
    assert set(layers) == {"features.3", "classifier"}  # the first conv stayed float
    # the written int8 graph within 1 point of the float model on the digits test split
    assert digits.accuracy_onnx(tmp_path / "b" / "model.onnx") >= digits.accuracy_torch(digits.trained()) - 1.0


def test_weight_bits_4(tmp_path):
    from cann_export import qat

    x = digits.split()[0]
    model = qat.prepare(digits.trained(), config={"weight_bits": 4})
    qat.calibrate(model, [{"x": x[:128]}])
    result = cann_export.export(model, tmp_path / "b", example_inputs=(x[:2],))
    assert result.ok
    scales = result.manifest["quantization"]["layers"]["classifier"]
    assert scales["weight_bits"] == 4


def test_tiny_bert_linear_layers_through_qat(tmp_path):
    from helpers import hf_models

    bert = hf_models.tiny_bert()
    feeds = hf_models.token_inputs(8, 12)
    save_model(bert, str(tmp_path / "bert.safetensors"))
    save_file(feeds, str(tmp_path / "calib.safetensors"))
    (tmp_path / "bert_factory.py").write_text("from helpers.hf_models import tiny_bert\n")
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        result = cann_export.export(str(tmp_path / "bert.safetensors"), tmp_path / "b",
                                    model_class="bert_factory:tiny_bert",
                                    quantize="qat", calibration_data=str(tmp_path / "calib.safetensors"),
                                    qat_steps=5, quant_config={"batch_size": 4, "quantize_types": ["Linear"]})
    finally:
        sys.path.remove(str(tmp_path))
    assert result.ok, result.parity
    layers = result.manifest["quantization"]["layers"]
    assert "encoder.layer.0.attention.self.query" in layers and len(layers) == 2 * 6 + 1  # 6 per layer + pooler


@pytest.mark.parametrize("config,needle", [
    ({"weight_bit": 8}, "valid keys"),
    ({"weight_bits": 9}, "4, 5, 6, 7, 8"),
    ({"weight_bits": 3}, "4, 5, 6, 7, 8"),
    ({"activation_bits": 4}, "valid values: 8"),
    ({"quantize_types": ["LSTM"]}, "Conv2d"),
])
def test_quant_config_mistakes_are_refused(config, needle):
    import cann.torch

    with pytest.raises(errors.OptionsError, match=needle):
        cann.torch.config(quantization_aware_training=True, quant_config=config)


def test_unknown_config_key_is_refused():
    import cann.torch

    with pytest.raises(errors.OptionsError, match="quantization_aware_training"):
        cann.torch.config(quantisation_aware_training=True)


def _cli(tmp, *args):
    return CliRunner().invoke(cli, [str(tmp / "digits.safetensors"), "--model-class", MODEL_CLASS, *args])


def test_calibration_file_problems(digits_files, tmp_path):
    tmp, _ = digits_files
    missing = _cli(tmp, "--qat", "--calibration-data", str(tmp_path / "none.safetensors"), "-o", str(tmp_path / "o"))
    assert missing.exit_code == 2 and "none.safetensors" in missing.stderr and "not found" in missing.stderr
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"\x01" * 64)
    bad = _cli(tmp, "--qat", "--calibration-data", str(corrupt), "-o", str(tmp_path / "o"))
    assert bad.exit_code == 2 and "corrupt.safetensors" in bad.stderr
    save_file({"pixels": torch.zeros(4, 1, 8, 8)}, str(tmp_path / "names.safetensors"))
    names = _cli(tmp, "--qat", "--calibration-data", str(tmp_path / "names.safetensors"), "-o", str(tmp_path / "o"))
    assert names.exit_code == 2 and "pixels" in names.stderr
    save_file({"x": torch.zeros(4, 1, 9, 9)}, str(tmp_path / "shape.safetensors"))
    shape = _cli(tmp, "--qat", "--calibration-data", str(tmp_path / "shape.safetensors"), "--input-shape", "x:1,1,8,8",
                 "-o", str(tmp_path / "o"))
    assert shape.exit_code == 2 and "per-sample shape" in shape.stderr
    no_data = _cli(tmp, "--qat", "-o", str(tmp_path / "o"))
    assert no_data.exit_code == 2 and "--calibration-data" in no_data.stderr
    for r in (missing, bad, names, shape, no_data):
        assert "Traceback" not in r.output
    assert not (tmp_path / "o").exists()


def test_qat_on_torchscript_is_refused(digits_files, tmp_path):
    tmp, _ = digits_files
    path = tmp_path / "ts.pt"
    torch.jit.save(torch.jit.script(digits.trained()), str(path))
    result = CliRunner().invoke(cli, [str(path), "--qat", "--calibration-data", str(tmp / "calib.safetensors"),
                                      "-o", str(tmp_path / "o")])
    assert result.exit_code == 2 and "trainable nn.Module" in result.stderr and "--model-class" in result.stderr


@pytest.fixture
def training_settings():
    from cann_export.qat.library_config import SESSION

    saved = SESSION.train
    yield SESSION
    SESSION.train = saved


def _finetune_losses(steps=6):
    from cann_export import qat
    from cann_export.qat.train import split_batches

    x = digits.split()[0][:128]
    teacher = digits.trained()
    student = qat.prepare(teacher, config={})
    batches = split_batches({"x": x}, 32)
    qat.calibrate(student, batches)
    return qat.finetune(student, teacher, batches, steps, 1e-3)


def test_seed_config_keys_drive_the_training_helpers(training_settings):
    import cann.torch

    baseline = _finetune_losses()
    cann.torch.config(gradient_checkpointing=True)
    assert _finetune_losses() == baseline  # recomputation changes memory, not results
    cann.torch.config(gradient_checkpointing=False, dataloader_workers=2)
    assert _finetune_losses() == baseline  # same batches, loaded by worker processes
    cann.torch.config(dataloader_workers=0, compile_model="eager")
    assert _finetune_losses() == pytest.approx(baseline, rel=1e-5)
    current = cann.torch.config(compile_model=False, mixed_precision="bf16")
    assert current["mixed_precision"] == "bf16"
    amp = _finetune_losses()
    assert amp != baseline and all(v == v and v < 10 for v in amp)  # computed in bf16, still converging
    assert 0.5 < amp[0] / baseline[0] < 2  # the same first step, up to bf16 rounding


@pytest.mark.parametrize("settings,needle", [
    ({"mixed_precision": "fp8"}, "'fp16', 'bf16'"),
    ({"gradient_checkpointing": "yes"}, "True, False"),
    ({"dataloader_workers": -1}, "integer >= 0"),
    ({"compile_model": 3}, "backend name"),
])
def test_seed_config_values_are_checked(settings, needle, training_settings):
    import cann.torch

    with pytest.raises(errors.OptionsError, match=needle):
        cann.torch.config(**settings)


def test_quant_layer_shows_the_wrapped_layers_attributes():
    """Model code that reads its conv's geometry (transformers' MobileNet pads from ``conv.stride``) keeps
    working once QAT wrapped the conv; unknown names still raise, and the wrapper deep-copies."""
    import copy

    from cann_export.qat.fake_quant import QuantLayer

    conv = torch.nn.Conv2d(3, 4, 3, stride=2, dilation=1, groups=1)
    q = QuantLayer(conv, 8)
    assert (q.stride, q.kernel_size, q.in_channels, q.layer) == ((2, 2), (3, 3), 3, conv)
    assert q.weight is conv.weight
    with pytest.raises(AttributeError):
        _ = q.no_such_attribute
    twin = copy.deepcopy(q)
    assert twin.stride == (2, 2) and twin.layer is not conv
    assert torch.equal(twin(torch.ones(1, 3, 8, 8)), q(torch.ones(1, 3, 8, 8)))


def test_conv_subclasses_are_quantized_and_compute_as_written():
    """A subclass of a quantizable layer is one (transformers' EfficientNetDepthwiseConv2d); one with its own
    forward (timm's Conv2dSame pads first) keeps computing what its forward does under fake quantization."""
    from torch.nn import functional as F

    from cann_export.qat.quant_config import parse
    from cann_export.qat.fake_quant import compute
    from cann_export.qat.wrapping import layer_kind, wrap_layers

    class Depthwise(torch.nn.Conv2d):
        pass

    class SamePad(torch.nn.Conv2d):
        def forward(self, x):
            return F.conv2d(F.pad(x, (0, 1, 0, 1)), self.weight, self.bias, self.stride)

    same = SamePad(4, 4, 2)
    x = torch.randn(1, 4, 6, 6)
    doubled = compute(same, x, same.weight * 2)
    assert doubled.shape == same(x).shape == (1, 4, 6, 6)
    assert torch.allclose(doubled - same.bias.view(1, -1, 1, 1), 2 * (same(x) - same.bias.view(1, -1, 1, 1)),
                          atol=1e-5)
    assert (layer_kind(Depthwise(2, 2, 1)), layer_kind(same), layer_kind(torch.nn.ReLU())) == \
        ("Conv2d", "Conv2d", None)
    model = torch.nn.Sequential(Depthwise(4, 4, 3, padding=1, groups=4), same)
    assert wrap_layers(model, parse({})) == ["0", "1"]
    assert model(x).shape == (1, 4, 6, 6)
