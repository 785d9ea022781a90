"""Capture's full check without the weights' bytes (graph/weightless_check.py) refuses what onnx's own full check
refuses and passes what it passes, on graphs a real exporter wrote and on broken copies of them."""
from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from cann_export.graph.weightless_check import KEPT_BELOW, _light, full_check


def _checker(data: bytes) -> str | None:
    try:
        onnx.checker.check_model(data, full_check=True)
    except Exception as e:  # noqa: BLE001
        return type(e).__name__
    return None


def _ours(data: bytes) -> str | None:
    try:
        full_check(data)
    except Exception as e:  # noqa: BLE001
        return type(e).__name__
    return None


def _exported(model: torch.nn.Module, *args: torch.Tensor) -> bytes:
    f = io.BytesIO()
    torch.onnx.export(model.eval(), args, f, dynamo=False, opset_version=17, input_names=["x"],
                      dynamic_axes={"x": {0: "batch"}})
    return f.getvalue()


def _graph(out_shape: list[int], weight: np.ndarray, raw: bytes | None = None) -> bytes:
    w = helper.make_tensor("w", TensorProto.FLOAT, list(weight.shape), weight.tobytes(), raw=True)
    if raw is not None:
        w.raw_data = raw
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1, -1])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Reshape", ["y", "shape"], ["z"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, weight.shape[0]])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, out_shape)], [w, shape])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_real_exports_pass_with_their_weights_left_out():
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.LayerNorm(128),
                              torch.nn.Linear(128, 8))
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(16 * 6 * 6, 4))
    for data in (_exported(mlp, torch.randn(2, 64)), _exported(conv, torch.randn(2, 3, 8, 8))):
        light = _light(data)
        left_out = [t for t in light.graph.initializer if t.data_location == TensorProto.EXTERNAL]
        assert left_out and all(not t.raw_data for t in left_out)  # the big weights' bytes were never read
        assert _checker(data) is None and _ours(data) is None


@pytest.mark.parametrize("case", ["fine", "short weight", "wrong output shape", "long weight"])
def test_it_refuses_what_the_checker_refuses(case):
    weight = np.ones((64, 32), np.float32)  # 8 KiB: left out of the checker's graph
    assert weight.nbytes >= KEPT_BELOW
    data = {"fine": _graph([1, 32], weight),
            "short weight": _graph([1, 32], weight, weight.tobytes()[:100]),
            "wrong output shape": _graph([1, 31], weight),
            "long weight": _graph([1, 32], weight, weight.tobytes() + b"\0" * 8)}[case]
    assert _ours(data) == _checker(data), case
    assert (_checker(data) is None) == (case in ("fine", "long weight"))


def test_a_weight_it_cannot_check_by_length_gets_the_checker_on_the_whole_graph():
    weight = np.ones((64, 32), np.float32)
    model = onnx.ModelProto.FromString(_graph([1, 32], weight))
    model.graph.initializer[0].float_data.extend([1.0])  # two data fields: the checker's to judge
    data = model.SerializeToString()
    assert _light(data) is None
    assert _ours(data) == _checker(data) == "ValidationError"
