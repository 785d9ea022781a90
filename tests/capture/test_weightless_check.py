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


class _Tied(torch.nn.Module):
    """Tied weights, a half-precision weight, an int64 buffer and a bias: what the encoder writes in several ways."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight
        self.half_weight = torch.nn.Parameter(torch.randn(16, 16).half())
        self.register_buffer("offsets", torch.arange(4, dtype=torch.int64))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids + self.offsets[0]) @ self.half_weight.float()
        return self.head(h)


def _plain_and_apart(model: torch.nn.Module, *args: torch.Tensor) -> tuple[bytes, bytes, dict[str, bytes]]:
    import contextlib

    from cann_export.capture import weights_apart

    outs, kept = [], {}
    for apart in (False, True):
        f, weights = io.BytesIO(), {}
        with weights_apart.held_apart(weights) if apart else contextlib.nullcontext():
            torch.onnx.export(model.eval(), args, f, dynamo=False, opset_version=17, input_names=["x"],
                              dynamic_axes={"x": {0: "batch"}})
        if apart:
            kept = dict(weights)
            graph = onnx.ModelProto.FromString(f.getvalue())
            assert len(f.getvalue()) < 4096  # the graph came without its weights' bytes
            from cann_export.graph.weightless_check import full_check_apart

            assert full_check_apart(graph, weights)
            weights_apart.attach(graph, weights)
            outs.append(graph.SerializeToString())
        else:
            outs.append(f.getvalue())
    return outs[0], outs[1], kept


def test_weights_held_apart_give_the_plain_exports_bytes():
    from cann_export.capture import weights_apart

    assert weights_apart.supported()  # this torch's private call is the one held_apart wraps (else: plain export)
    for model, args in ((_Tied(), (torch.randint(0, 40, (2, 5)),)),
                        (torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
                                             torch.nn.Flatten(), torch.nn.Linear(16 * 6 * 6, 4)),
                         (torch.randn(2, 3, 8, 8),))):
        plain, apart, kept = _plain_and_apart(model, *args)
        assert kept and apart == plain


def test_a_weight_held_apart_is_checked_and_attached_whole():
    from cann_export.capture import weights_apart
    from cann_export.graph.weightless_check import full_check_apart

    f, weights = io.BytesIO(), {}
    with weights_apart.held_apart(weights):
        torch.onnx.export(torch.nn.Linear(64, 32).eval(), (torch.randn(1, 64),), f, dynamo=False, opset_version=17)
    graph = onnx.ModelProto.FromString(f.getvalue())
    name = max(weights, key=lambda n: len(weights[n]))
    short = {**weights, name: weights[name][:100]}
    with pytest.raises(onnx.checker.ValidationError, match="too small"):
        full_check_apart(graph, short)
    assert [t.raw_data for t in graph.graph.initializer] == [weights_apart.PLACEHOLDER] * len(weights)  # unchanged
    with pytest.raises(ValueError, match="does not hold"):
        weights_apart.attach(graph, {**weights, "stray": b"\0" * 8})


class _FoldedOperands(torch.nn.Module):
    """Buffers the exporter folds into small initializers that shape inference reads (Slice's starts, TopK's k)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("a", torch.tensor(1))
        self.register_buffer("b", torch.tensor(5))
        self.register_buffer("k", torch.tensor(3))
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.proj(x)
        return y[:, self.a:self.b] * 2, torch.topk(y, self.k, dim=1)[0]


def test_small_weights_held_apart_keep_their_data_for_shape_inference():
    plain, apart, kept = _plain_and_apart(_FoldedOperands(), torch.randn(2, 8))
    assert apart == plain and any(len(v) < KEPT_BELOW for v in kept.values())
    assert _checker(plain) is None and _ours(plain) is None


@pytest.mark.parametrize("dims", [[0, 512], [-1, 512]])
def test_a_weight_of_no_elements_or_a_negative_dimension_is_the_checkers_to_judge(dims):
    weight = np.ones((4, 512), np.float32)
    model = onnx.ModelProto.FromString(_graph([1, 512], np.ones((4, 512), np.float32)))
    tensor = model.graph.initializer[0]
    del tensor.dims[:]
    tensor.dims.extend(dims)
    tensor.raw_data = weight.tobytes()
    data = model.SerializeToString()
    assert _light(data) is None
    assert _ours(data) == _checker(data) == "ValidationError"
