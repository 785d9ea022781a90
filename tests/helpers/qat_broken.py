"""Broken QAT lowerings, for calibrating the int8 parity policy (issue 18): what a wrong export would compute,
as a changed copy of the trained fake-quant model (torch) or a changed copy of the written graph (onnxruntime).
Each is judged against the correct fake-quant model, exactly as a written graph is.

torch variants (``TORCH_BROKEN``): one layer's activation scale doubled (or every layer's), one activation Q/DQ
dropped, one layer left entirely in float (first / middle / last quantized layer in module order), weights not
quantized (every layer: float weight, quantized activation), BatchNorm folded without its activation (timm's
BatchNormAct2d, torchvision's Conv2dNormActivation: the bug of issue 18). Graph variants (``GRAPH_BROKEN``): the
written graph's middle activation Q/DQ with its scale doubled, or removed."""
from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

WHERE = ("first", "middle", "last")


def _layers(model: nn.Module) -> dict[str, Any]:
    from cann_export.qat.fake_quant import quant_layers

    return quant_layers(model)


def _pick(model: nn.Module, where: str) -> tuple[str, Any]:
    layers = list(_layers(model).items())
    return layers[{"first": 0, "middle": len(layers) // 2, "last": len(layers) - 1}[where]]


def _set(model: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, attr = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, module)


def act_scale_x2(model: nn.Module, where: str) -> tuple[nn.Module, str] | None:
    clone = copy.deepcopy(model)
    path, layer = _pick(clone, where)
    with torch.no_grad():  # range doubled about 0: twice the scale, the same zero point
        layer.act_min.mul_(2.0)
        layer.act_max.mul_(2.0)
    return clone, path


def act_scale_x2_all(model: nn.Module) -> tuple[nn.Module, str] | None:
    clone = copy.deepcopy(model)
    layers = _layers(clone)
    with torch.no_grad():
        for layer in layers.values():
            layer.act_min.mul_(2.0)
            layer.act_max.mul_(2.0)
    return clone, f"{len(layers)} layers"


def act_qdq_dropped(model: nn.Module, where: str) -> tuple[nn.Module, str] | None:
    clone = copy.deepcopy(model)
    path, layer = _pick(clone, where)
    layer.observing, layer.calibrating = False, True  # QuantLayer: no activation fake-quant while calibrating
    return clone, path


def layer_float(model: nn.Module, where: str) -> tuple[nn.Module, str] | None:
    clone = copy.deepcopy(model)
    path, layer = _pick(clone, where)
    _set(clone, path, layer.layer)
    return clone, path


def _float_weight_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    """A QuantLayer's forward with its activation quantized and its float (never quantized) weight."""
    from cann_export.qat.fake_quant import compute, fake_quant_activation

    scale, zero = self._act_qparams_tensor()
    return compute(self.layer, fake_quant_activation(x, scale, zero), self.layer.weight)


def weights_float(model: nn.Module) -> tuple[nn.Module, str] | None:
    import types

    clone = copy.deepcopy(model)
    layers = _layers(clone)
    for layer in layers.values():  # the instance's _forward shadows QuantLayer._forward
        layer._forward = types.MethodType(_float_weight_forward, layer)
    return clone, f"{len(layers)} layers"


def norm_act_dropped(model: nn.Module) -> tuple[nn.Module, str] | None:
    """Every fused BatchNorm+activation loses its activation (None when the model has no such block)."""
    clone = copy.deepcopy(model)
    dropped = []
    for path, m in clone.named_modules():
        act = getattr(m, "act", None)
        if type(m).__name__ == "BatchNormAct2d" and isinstance(act, nn.Module) and not isinstance(act, nn.Identity):
            m.act = nn.Identity()
            dropped.append(path)
        elif type(m).__name__ == "Conv2dNormActivation" and len(m) == 3:
            m[2] = nn.Identity()
            dropped.append(path)
    return (clone, f"{len(dropped)} blocks") if dropped else None


TORCH_BROKEN: dict[str, Callable[[nn.Module], tuple[nn.Module, str] | None]] = {
    **{f"act_scale_x2@{w}": (lambda m, w=w: act_scale_x2(m, w)) for w in WHERE},
    "act_scale_x2@all": act_scale_x2_all,
    **{f"act_qdq_dropped@{w}": (lambda m, w=w: act_qdq_dropped(m, w)) for w in WHERE},
    **{f"layer_float@{w}": (lambda m, w=w: layer_float(m, w)) for w in WHERE},
    "weights_float": weights_float,
    "norm_act_dropped": norm_act_dropped,
}


def _activation_pairs(graph: Any) -> list[tuple[Any, Any]]:
    """(QuantizeLinear, DequantizeLinear) of the activations: a Q whose input is not a constant."""
    consts = {t.name for t in graph.graph.initializer} | {o for n in graph.graph.node if n.op_type == "Constant"
                                                         for o in n.output}
    dq_of = {n.input[0]: n for n in graph.graph.node if n.op_type == "DequantizeLinear"}
    return [(n, dq_of[n.output[0]]) for n in graph.graph.node
            if n.op_type == "QuantizeLinear" and n.input[0] not in consts and n.output[0] in dq_of]


def graph_scale_x2(graph: Any) -> tuple[Any, str] | None:
    from onnx import numpy_helper

    pairs = _activation_pairs(graph)
    if not pairs:
        return None
    g = copy.deepcopy(graph)
    q, dq = _activation_pairs(g)[len(pairs) // 2]
    inits = {t.name: t for t in g.graph.initializer}
    scale = numpy_helper.to_array(inits[q.input[1]]) * np.float32(2.0)
    name = f"{q.input[1]}_x2"
    g.graph.initializer.append(numpy_helper.from_array(scale.astype(np.float32), name))
    q.input[1] = dq.input[1] = name
    return g, q.name


def graph_qdq_dropped(graph: Any) -> tuple[Any, str] | None:
    pairs = _activation_pairs(graph)
    if not pairs:
        return None
    g = copy.deepcopy(graph)
    q, dq = _activation_pairs(g)[len(pairs) // 2]
    for n in g.graph.node:
        for i, name in enumerate(n.input):
            if name == dq.output[0]:
                n.input[i] = q.input[0]
    kept = [n for n in g.graph.node if n is not q and n is not dq]
    del g.graph.node[:]
    g.graph.node.extend(kept)
    return g, q.name


GRAPH_BROKEN: dict[str, Callable[[Any], tuple[Any, str] | None]] = {
    "graph_act_scale_x2@middle": graph_scale_x2,
    "graph_act_qdq_dropped@middle": graph_qdq_dropped,
}
