"""The articles' QAT: ``cann.torch.config(quantization_aware_training=True, ...)`` then the user's unchanged
training loop, then ``cann.torch.export``: the written graph is int8 Q/DQ, checked in onnxruntime against the
fake-quant model; export without the loop ever training is refused."""
import numpy as np
import onnx
import pytest
import torch
from helpers.hf_models import tiny_bert, tiny_resnet, token_inputs
from onnx import numpy_helper
from torch import nn

import cann.torch
from cann_export import errors


class ConvBnNet(nn.Module):
    """BatchNorm as an attribute (not inside a Sequential): trained as is, folded at export."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


@pytest.fixture
def qat_config():
    cann.torch.config(quantization_aware_training=True, quant_config={"weight_bits": 8, "activation_bits": 8})
    yield
    cann.torch.config(quantization_aware_training=False, quant_config={})


def _train(model, batches, loss_fn, epochs=3):
    """The user's loop, unchanged: AdamW built before the first forward."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(epochs):
        model.train()
        for inputs, target in batches:
            loss = loss_fn(model(**inputs) if isinstance(inputs, dict) else model(inputs), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return optimizer


def _assert_int8_qdq(path, layers):
    """AMCT's form: every quantized op reads DequantizeLinear(QuantizeLinear(x)) and a float weight constant
    on the int8 grid through its own QuantizeLinear -> DequantizeLinear with a zero zero point."""
    model = onnx.load(str(path))
    producer = {o: n for n in model.graph.node for o in n.output}
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    quantized = 0
    for node in model.graph.node:
        if node.op_type not in ("Conv", "Gemm", "MatMul"):
            continue
        act, wdq = producer.get(node.input[0]), producer.get(node.input[1])
        if act is None or act.op_type != "DequantizeLinear" or wdq is None or wdq.op_type != "DequantizeLinear":
            continue
        wq = producer[wdq.input[0]]
        assert wq.op_type == "QuantizeLinear" and wq.input[0] in inits
        w, scale, zero = (inits[n] for n in wq.input)
        assert not zero.any() and zero.dtype == np.int8
        shape = [-1] + [1] * (w.ndim - 1) if scale.size > 1 else []
        grid = w / scale.reshape(shape)
        np.testing.assert_allclose(grid, np.rint(grid), atol=1e-3)  # the float weight sits on the int8 grid
        quantized += 1
    assert quantized >= layers
    return model


def _int8_close(out, ref):
    """Within the int8 policy's defaults: RMS <= 1 of the output's 8-bit step, cosine >= 0.9995."""
    step = (ref.max() - ref.min()) / 255
    err = np.abs(out.astype(np.float64) - ref)
    cos = float((out.ravel() @ ref.ravel()) / (np.linalg.norm(out) * np.linalg.norm(ref)))
    assert np.sqrt((err ** 2).mean()) <= step and cos >= 0.9995, (err.max() / step, cos)


def test_unchanged_loop_on_a_bn_cnn_exports_int8(qat_config, tmp_path):
    torch.manual_seed(0)
    model = ConvBnNet()
    x, y = torch.randn(16, 3, 8, 8), torch.randint(0, 4, (16,))
    params_before = [id(p) for p in model.parameters()]
    with pytest.warns(UserWarning, match="fake quantization inserted into 2 layer"):
        optimizer = _train(model, [(x, y)], nn.functional.cross_entropy)
    # the optimizer built before the first forward still trains the same Parameter objects
    assert [id(p) for p in model.parameters()][:2] == params_before[:2]
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} <= {id(p) for p in model.parameters()}
    model.eval()
    result = cann.torch.export(model=model, output_path=tmp_path / "b", export_format="atc_ready",
                               example_inputs=(x[:2],))
    assert result.ok, result.parity
    graph = _assert_int8_qdq(tmp_path / "b" / "model.onnx", 2)
    assert "BatchNormalization" not in [n.op_type for n in graph.graph.node]
    quant = result.manifest["quantization"]
    assert set(quant["layers"]) == {"conv", "head"} and quant["folded_bn_at_export"] == ["bn"]
    # independent check: onnxruntime on the written file against the fake-quant module in eval mode
    import onnxruntime as ort

    sess = ort.InferenceSession(str(tmp_path / "b" / "model.onnx"), providers=["CPUExecutionProvider"])
    probe = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        ref = model(probe).numpy()
    out = sess.run(None, {sess.get_inputs()[0].name: probe.numpy()})[0]
    step = (ref.max() - ref.min()) / 255
    assert np.abs(out - ref).max() <= 2 * step
    # the folded per-channel weight scales were re-derived: int8 values reach +-127 on every channel
    conv = next(n for n in graph.graph.node if n.op_type == "Conv")
    producer = {o: n for n in graph.graph.node for o in n.output}
    inits = {t.name: numpy_helper.to_array(t) for t in graph.graph.initializer}
    w, scale, _ = (inits[n] for n in producer[producer[conv.input[1]].input[0]].input)
    assert np.allclose(np.abs(w.reshape(w.shape[0], -1)).max(axis=1) / scale, 127)


def test_unchanged_loop_on_tiny_transformers(qat_config, tmp_path):
    model = tiny_bert()
    feed = token_inputs(batch=4, seq=8)

    def loss_fn(out, target):
        return nn.functional.mse_loss(out.last_hidden_state.mean(1), target)

    _train(model, [(feed, torch.zeros(4, 32))], loss_fn, epochs=2)
    model.eval()
    result = cann.torch.export(model=model, output_path=tmp_path / "bert", export_format="atc_ready",
                               example_inputs={k: v[:2] for k, v in feed.items()})
    assert result.ok, result.parity
    assert len(result.manifest["quantization"]["layers"]) >= 12  # q/k/v/out/ffn Linear layers of 2 blocks
    _assert_int8_qdq(tmp_path / "bert" / "model.onnx", 12)


def test_resnet_from_transformers_with_its_batchnorms(qat_config, tmp_path):
    model = tiny_resnet()
    x = torch.randn(8, 3, 32, 32)
    _train(model, [({"pixel_values": x}, torch.randint(0, 4, (8,)))],
           lambda out, t: nn.functional.cross_entropy(out.logits, t), epochs=2)
    model.eval()
    result = cann.torch.export(model=model, output_path=tmp_path / "r", export_format="atc_ready",
                               example_inputs={"pixel_values": x[:2]})
    assert result.ok, result.parity
    assert result.manifest["quantization"]["folded_bn_at_export"]


def test_export_after_config_without_training_is_refused(qat_config, tmp_path):
    model = ConvBnNet().eval()
    with pytest.raises(errors.OptionsError, match="never trained after it"):
        cann.torch.export(model=model, output_path=tmp_path / "x", example_inputs=(torch.randn(1, 3, 8, 8),))
    assert not (tmp_path / "x").exists()


def test_eval_calls_do_not_quantize(qat_config):
    model = ConvBnNet().eval()
    with torch.no_grad():
        model(torch.randn(1, 3, 8, 8))
    assert not any(type(m).__name__ == "QuantLayer" for m in model.modules())


class StubNet(nn.Module):
    """The eager torch.ao layout: QuantStub / DeQuantStub around a conv-bn-relu block and a head."""

    def __init__(self):
        super().__init__()
        import torch.ao.quantization as tq

        self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
        self.conv, self.bn, self.relu = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = self.relu(self.bn(self.conv(self.quant(x))))
        return self.dequant(self.fc(x.mean((2, 3))))


def _ort(path, x):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]


def test_torch_ao_eager_prepare_qat_exports_qdq(tmp_path):
    import torch.ao.quantization as tq

    torch.manual_seed(0)
    model = StubNet().train()
    model.qconfig = tq.get_default_qat_qconfig("x86")  # activations reduce_range 0..127, weights per channel
    model = tq.fuse_modules_qat(model, [["conv", "bn", "relu"]])
    tq.prepare_qat(model, inplace=True)
    x = torch.randn(16, 3, 8, 8)
    _train(model, [(x, torch.zeros(16, 4))], nn.functional.mse_loss)
    model.eval()
    result = cann_export_export(model, tmp_path / "ao", x)
    assert result.manifest["parity"]["fp32"]["passed"], result.parity
    graph = onnx.load(str(tmp_path / "ao" / "model.onnx"))
    ops = [n.op_type for n in graph.graph.node]
    assert ops.count("QuantizeLinear") == 2 and "Clip" in ops  # reduce_range written as Clip + full-range Q/DQ
    assert set(result.manifest["quantization"]["torch_ao"])  # every FakeQuantize recorded with its range
    # independent: onnxruntime on the file against the torch.ao model itself on a fresh input (observers frozen)
    model.apply(tq.disable_observer)
    probe = torch.randn_like(x)
    with torch.no_grad():
        ref = model(probe).numpy()
    # torch.ao quantizes module outputs; AMCT adapts compute inputs: the pairs after the ReLU (read by the mean)
    # and on the output are gone, and the head, left without an activation pair, reads its dequantized weight
    placement = result.manifest["quantization"]["placement"]
    assert len(placement["unadapted_pairs_removed"]) == 2 and len(placement["weight_pairs_folded"]) == 1
    assert placement["uint8_rewritten_as_int8"] and placement["quantized_ops"] == 1
    _int8_close(_ort(tmp_path / "ao" / "model.onnx", probe), ref)


def test_torchao_pt2e_qat_exports_qdq(tmp_path):
    import torchao.quantization.pt2e.quantize_pt2e as pt2e  # a declared test dependency: never skipped
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    torch.manual_seed(0)
    x = torch.randn(8, 3, 8, 8)
    exported = torch.export.export(ConvBnNet(), (x,)).module()
    quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config(is_qat=True))
    prepared = pt2e.prepare_qat_pt2e(exported, quantizer)
    from torchao.quantization.pt2e import allow_exported_model_train_eval

    allow_exported_model_train_eval(prepared)  # torchao's switch for a loop that calls model.train()
    _train(prepared, [(x, torch.randint(0, 4, (8,)))], nn.functional.cross_entropy)
    converted = pt2e.convert_pt2e(prepared)
    # the x86 quantizer's Linear weights are per channel: AMCT takes only per-tensor weights on Gemm, and the
    # lint names the module (exported anyway with lint="warn" to check the rest)
    with pytest.raises(errors.LintError, match="(?s)linear.*per-tensor weights on Gemm"):
        cann_export_export(converted, tmp_path / "refused", x)
    assert not (tmp_path / "refused").exists()
    result = cann_export_export(converted, tmp_path / "pt2e", x, lint="warn")
    assert result.manifest["parity"]["fp32"]["passed"], result.parity
    # PT2E writes int8 weight constants -> DequantizeLinear: rewritten as the float weight -> Q -> DQ AMCT reads
    assert result.manifest["quantization"]["placement"]["weights_requantized"] >= 2
    _assert_int8_qdq(tmp_path / "pt2e" / "model.onnx", 2)
    with torch.no_grad():
        ref = converted(x).numpy()
    _int8_close(_ort(tmp_path / "pt2e" / "model.onnx", x), ref)


def cann_export_export(model, out, x, **options):
    import cann_export

    return cann_export.export(model, out, "atc_ready", example_inputs=(x,), **options)


def _qat_checkpoint(tmp_path):
    model = ConvBnNet()
    optimizer = _train(model, [(torch.randn(4, 3, 8, 8), torch.randint(0, 4, (4,)))], nn.functional.cross_entropy, 1)
    path = tmp_path / "checkpoint.pt"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 1}, path)
    return model, path


def test_resume_of_a_qat_checkpoint_wraps_a_fresh_model_and_keeps_its_optimizer(qat_config, tmp_path):
    trained, path = _qat_checkpoint(tmp_path)
    model = ConvBnNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    params = list(model.parameters())
    state = cann.torch.resume(path, model, optimizer)
    assert state == {"epoch": 1, "restored": ["model", "optimizer", "qat_observers"]}
    assert list(model.parameters()) == params and optimizer.param_groups[0]["params"] == params  # same objects
    assert torch.equal(model.conv.act_max, trained.conv.act_max) and torch.isfinite(model.head.act_min)
    assert torch.equal(model.conv.layer.weight, trained.conv.layer.weight)


def test_resume_of_a_plain_checkpoint_into_a_wrapped_model_starts_its_observers_afresh(qat_config, tmp_path):
    plain = ConvBnNet()
    torch.save(plain.state_dict(), tmp_path / "plain.pt")
    model = ConvBnNet()
    _train(model, [(torch.randn(4, 3, 8, 8), torch.randint(0, 4, (4,)))], nn.functional.cross_entropy, 1)
    assert cann.torch.resume(tmp_path / "plain.pt", model) == {"restored": ["model"]}
    assert torch.equal(model.conv.layer.weight, plain.conv.weight) and not torch.isfinite(model.conv.act_min)


def test_resume_of_a_qat_checkpoint_without_qat_configured_says_what_to_do(tmp_path):
    cann.torch.config(quantization_aware_training=True, quant_config={})
    try:
        _, path = _qat_checkpoint(tmp_path)
    finally:
        cann.torch.config(quantization_aware_training=False, quant_config={})
    with pytest.raises(errors.OptionsError, match=r"config\(quantization_aware_training=True"):
        cann.torch.resume(path, ConvBnNet())
