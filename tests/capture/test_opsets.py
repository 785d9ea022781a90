"""Capture: the written opset is the one asked (11, 13, 17) for common architectures, --strict-opset never writes
another, .pt2 archives of Swin and T5 export, graph cleanup folds BatchNorm, folded Convs are named after the Conv."""
from __future__ import annotations

import io

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from helpers import arch_models
from onnx import TensorProto, helper, numpy_helper

import cann_export
from cann_export import errors
from cann_export.graph import module_paths
from cann_export.graph.onnx_helpers import cleanup_graph, opset_of
from cann_export.capture.opset_convert import OpsetConversionError, convert


def _graph(result):
    return onnx.load(result.onnx["path"])


def _export_checked(model, inputs, tmp_path, opset, **kw):
    result = cann_export.export(model, tmp_path / "b", example_inputs=inputs, opset=opset, strict_opset=True,
                                export_format="onnx", **kw)
    graph = _graph(result)
    assert result.onnx["opset"] == opset == opset_of(graph)
    onnx.checker.check_model(graph, full_check=True)
    assert result.ok, result.manifest.get("parity")  # onnxruntime on the written file against PyTorch
    return result, graph


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_resnet_written_at_the_requested_opset(tmp_path, opset):
    model, inputs = arch_models.resnet()
    result, _ = _export_checked(model, inputs, tmp_path, opset)
    assert result.manifest["capture"]["exporter"] == "dynamo" and "warning" not in result.manifest["capture"]


@pytest.mark.slow
@pytest.mark.parametrize("arch,opset", [("resnet50", 11), ("mobilenet", 11), ("convnext", 13), ("efficientnet", 13),
                                        ("vit", 17), ("bert", 13), ("gpt2", 17), ("detr", 17), ("vit", 11)])
def test_architecture_matrix_written_at_the_requested_opset(tmp_path, arch, opset):
    model, inputs = arch_models.ARCHS[arch]()
    _export_checked(model, inputs, tmp_path, opset)


def _tril_model():
    class Tril(torch.nn.Module):
        def forward(self, x):
            return torch.tril(x) * 2.0

    return Tril().eval()


def test_strict_opset_refuses_any_other_opset(tmp_path):
    x = torch.randn(4, 4)
    with pytest.raises(errors.CaptureError, match="Trilu") as info:  # Trilu exists from opset 14 on
        cann_export.export(_tril_model(), tmp_path / "s", example_inputs=x, opset=13, strict_opset=True,
                           exporter="dynamo", export_format="onnx")
    assert info.value.exit_code == errors.EXIT_STAGE_FAILED and "strict_opset=True" in str(info.value)
    assert not (tmp_path / "s").exists()
    loose = cann_export.export(_tril_model(), tmp_path / "l", example_inputs=x, opset=13, exporter="dynamo",
                               export_format="onnx")
    assert loose.onnx["opset"] == 18 and "Trilu" in loose.manifest["capture"]["warning"]


def _pt2(model, inputs, tmp_path):
    path = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(model, tuple(inputs.values())), str(path))
    return path


@pytest.mark.parametrize("arch", ["t5enc", pytest.param("swin", marks=pytest.mark.slow)])
def test_pt2_of_models_whose_conversion_views_non_contiguous_tensors(tmp_path, arch):
    model, inputs = arch_models.ARCHS[arch]()
    result = cann_export.export(_pt2(model, inputs, tmp_path), tmp_path / "b", example_inputs=inputs, opset=17,
                                strict_opset=True, export_format="onnx")
    assert result.ok and result.onnx["opset"] == 17
    assert result.manifest["capture"]["exporter"] == "dynamo", result.manifest["capture"]
    sess = ort.InferenceSession(_graph(result).SerializeToString(), providers=["CPUExecutionProvider"])
    out = sess.run(None, {i.name: inputs[i.name].numpy() for i in sess.get_inputs()})[0]
    with torch.no_grad():
        ref = model(**inputs)[0].numpy()
    np.testing.assert_allclose(out, ref, atol=1e-4, rtol=1e-3)


def test_torchscript_fallback_runs_on_a_pt2_graph(tmp_path):
    model, inputs = arch_models.t5enc()
    result = cann_export.export(_pt2(model, inputs, tmp_path), tmp_path / "b", example_inputs=inputs, opset=17,
                                exporter="torchscript", export_format="onnx")
    assert result.ok and result.manifest["capture"]["exporter"] == "torchscript" and result.onnx["opset"] == 17


def _run(model, feed):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)


def test_reduce_axes_input_becomes_an_attribute_below_18():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 1, 1])
    axes = numpy_helper.from_array(np.array([1, 2], np.int64), "axes")
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["y"], name="mean", keepdims=0, noop_with_empty_axes=0),
             helper.make_node("ReduceMax", ["x"], ["z"], name="all", keepdims=1, noop_with_empty_axes=0)]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y, z], [axes]),
                              opset_imports=[helper.make_opsetid("", 18)])
    feed = {"x": np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)}
    for target in (17, 13, 11):
        converted = convert(model, target)
        assert opset_of(converted) == target
        mean = next(n for n in converted.graph.node if n.name == "mean")
        assert [a.name for a in mean.attribute if a.name == "axes"] == ["axes"] and len(mean.input) == 1
        for got, want in zip(_run(converted, feed), _run(model, feed), strict=False):
            np.testing.assert_allclose(got, want, rtol=1e-6)


def test_conversion_keeps_weights_inputs_and_the_original_intact():
    """Weights skip the conversion's copies (a skeleton is converted); the result has the original's inputs and
    every weight byte for byte, a weight that is also a graph input (IR 3) stays one, the source is untouched."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 256])
    w_in = helper.make_tensor_value_info("w2", TensorProto.FLOAT, [256, 128])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    w1 = numpy_helper.from_array(rng.standard_normal((256, 256)).astype(np.float32), "w1")  # 256 KiB: a weight
    w2 = numpy_helper.from_array(rng.standard_normal((256, 128)).astype(np.float32), "w2")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["o"], name="mm2"),
             helper.make_node("ReduceMean", ["o", "axes"], ["y"], name="mean", keepdims=0)]
    model = helper.make_model(helper.make_graph(nodes, "g", [x, w_in], [y], [w1, w2, axes]),
                              opset_imports=[helper.make_opsetid("", 18)])
    before = model.SerializeToString()
    converted = convert(model, 13)
    assert model.SerializeToString() == before
    assert [i.name for i in converted.graph.input] == ["x", "w2"]
    got = {t.name: numpy_helper.to_array(t) for t in converted.graph.initializer}
    assert {"w1", "w2"} <= set(got)
    for t in (w1, w2):
        np.testing.assert_array_equal(got[t.name], numpy_helper.to_array(t))
    onnx.checker.check_model(converted, full_check=True)
    feed = {"x": rng.standard_normal((2, 256)).astype(np.float32)}
    np.testing.assert_allclose(_run(converted, feed)[0], _run(model, feed)[0], rtol=1e-6)


def test_layer_norm_spelled_out_below_17_and_unconvertible_nodes_named():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 8])
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), n) for n in ("scale", "bias")]
    ln = helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"], name="ln", epsilon=1e-5, axis=-1)
    model = helper.make_model(helper.make_graph([ln], "g", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 18)])
    feed = {"x": rng.standard_normal((2, 5, 8)).astype(np.float32)}
    converted = convert(model, 13)
    assert "LayerNormalization" not in {n.op_type for n in converted.graph.node}
    np.testing.assert_allclose(_run(converted, feed)[0], _run(model, feed)[0], atol=1e-5)
    tril = helper.make_node("Trilu", ["x"], ["y"], name="lower", upper=0)
    model = helper.make_model(helper.make_graph([tril], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(OpsetConversionError, match="Trilu node 'lower'"):
        convert(model, 13)


class _ConvBnBranch(torch.nn.Module):
    """Conv+BN and Linear+BN1d pairs outside any Sequential, behind a branch torch.fx cannot trace, so only
    the graph passes can fold them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.bn = torch.nn.Conv2d(3, 6, 3, padding=1), torch.nn.BatchNorm2d(6)
        self.fc, self.bn1 = torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4)
        with torch.no_grad():
            for bn in (self.bn, self.bn1):
                bn.running_mean.uniform_(-0.5, 0.5)
                bn.running_var.uniform_(0.5, 2.0)
                bn.weight.uniform_(0.5, 1.5)

    def forward(self, x):
        h = self.bn(self.conv(x))
        if x.shape[0] > 0:  # torch.fx cannot trace a branch on a shape
            h = torch.relu(h)
        return self.bn1(self.fc(h.mean(dim=(2, 3))))


def test_cleanup_folds_batchnorm_into_conv_and_gemm():
    model = _ConvBnBranch().eval()
    x = torch.randn(2, 3, 8, 8)
    program = torch.onnx.export(model, (x,), dynamo=True, optimize=False, report=False, verbose=False)
    graph = program.model_proto
    module_paths.stamp_from_exporter(graph)
    assert sum(n.op_type == "BatchNormalization" for n in graph.graph.node) == 2
    cleaned, report = cleanup_graph(graph)
    ops = [n.op_type for n in cleaned.graph.node]
    assert "BatchNormalization" not in ops and report["conv_bn_folded"] == 2
    assert "Conv" in ops and "Gemm" in ops
    used = {i for n in cleaned.graph.node for i in n.input}
    assert all(t.name in used for t in cleaned.graph.initializer)  # the BN statistics are gone
    feed = {cleaned.graph.input[0].name: x.numpy()}
    with torch.no_grad():
        np.testing.assert_allclose(_run(cleaned, feed)[0], model(x).numpy(), atol=1e-5, rtol=1e-4)
    names = {n.op_type: module_paths.describe(n) for n in cleaned.graph.node if n.op_type in ("Conv", "Gemm")}
    assert names["Conv"].startswith("conv (Conv + folded bn) at ") and "test_opsets.py:" in names["Conv"]
    assert names["Gemm"].startswith("fc (Gemm + folded bn1)")


def test_folded_conv_is_named_after_the_conv_in_an_export(tmp_path):
    model = _ConvBnBranch().eval()
    result = cann_export.export(model, tmp_path / "b", example_inputs=torch.randn(2, 3, 8, 8), export_format="onnx")
    described = [module_paths.describe(n) for n in _graph(result).graph.node]
    conv = next(d for d in described if "(Conv" in d)
    assert conv.startswith("conv (Conv + folded bn) at ") and "test_opsets.py:" in conv
    root = next(d for d in described if d.startswith("_ConvBnBranch.forward"))
    assert " at " in root and "test_opsets.py:" in root  # an op of no submodule: root class and source line


def test_module_level_fold_is_the_qat_fold():
    from helpers.toy_models import ConvBnDropout

    from cann_export.qat.wrapping import fold_batchnorm

    model = ConvBnDropout().eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        before = model(x)
        folded = fold_batchnorm(model)
        after = model(x)
    assert sorted(folded) == ["bn", "stem.1"]
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-4)


def test_contiguous_copy_before_views_keeps_the_program_equal():
    from cann_export.capture.exporters import contiguous_before_views

    class Views(torch.nn.Module):
        def forward(self, x):
            return x.transpose(1, 2).reshape(2, -1).view(-1) * 3

    x = torch.randn(2, 3, 4)
    program = torch.export.export(Views(), (x,))
    assert contiguous_before_views(program) == 2
    buf = io.BytesIO()
    torch.export.save(program, buf)
    torch.testing.assert_close(program.module()(x), Views()(x))


def _identity_graph(unused_initializer: bool = False) -> onnx.ModelProto:
    """y = (x @ W) + b through Identity nodes, as TorchScript writes them (a weight read through an Identity,
    an Identity between two ops, an Identity of an Identity)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")]
    if unused_initializer:
        inits.append(numpy_helper.from_array(np.ones(2, np.float32), "stale"))
    nodes = [helper.make_node("Identity", ["W"], ["W_id"]), helper.make_node("Identity", ["W_id"], ["W_id2"]),
             helper.make_node("MatMul", ["x", "W_id2"], ["h"]), helper.make_node("Identity", ["h"], ["h_id"]),
             helper.make_node("Add", ["h_id", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], inits,
                              value_info=[helper.make_tensor_value_info("h_id", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_cleanup_bypasses_identities_in_place():
    """A graph whose only cleanup is its Identity nodes (a TorchScript capture's usual graph) is cleaned in place:
    no onnx_ir round trip, which held a second copy of every weight at the optimize stage's start."""
    graph = _identity_graph()
    feed = {"x": np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)}
    before = _run(graph, feed)[0]
    cleaned, report = cleanup_graph(graph)
    assert cleaned is graph and report == {"conv_bn_folded": 0, "identities_removed": 3}
    assert [n.op_type for n in cleaned.graph.node] == ["MatMul", "Add"]
    assert list(cleaned.graph.node[0].input) == ["x", "W"] and not list(cleaned.graph.value_info)
    onnx.checker.check_model(cleaned, full_check=True)
    np.testing.assert_array_equal(_run(cleaned, feed)[0], before)


def test_cleanup_with_something_unused_takes_the_full_passes():
    graph = _identity_graph(unused_initializer=True)
    cleaned, report = cleanup_graph(graph)
    assert cleaned is not graph and report["identities_removed"] == 3
    assert [t.name for t in cleaned.graph.initializer] == ["W", "b"]  # the unused one pruned
    assert [n.op_type for n in graph.graph.node].count("Identity") == 3  # the input graph left as it was
