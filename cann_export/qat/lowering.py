"""Lowering fake quantization to ONNX QuantizeLinear/DequantizeLinear, whatever exporter captured the graph.

strip: each fake-quant layer becomes its plain Conv/Linear with the fake-quantized weight (exactly
representable in int8) and its scales are recorded; the exporters then see an ordinary float model
(torch.onnx's dynamo exporter cannot export FakeQuantize, pytorch issue 167063).
after onnxsim: for each recorded layer, the Conv/Gemm/MatMul node that the module produced (found through
the node -> module path mapping) gets QuantizeLinear -> DequantizeLinear on its input (per-tensor int8)
and its weight initializer becomes int8 + a per-channel DequantizeLinear (axis = output channels).
"""
from __future__ import annotations

from typing import Any

from ..errors import StripError

COMPUTE_OPS = ("Conv", "Gemm", "MatMul")


class LowerFakeQuant:
    name = "lower-fake-quant"
    order = 5

    def apply_module(self, model: Any, ctx: Any) -> Any:
        try:
            from .fake_quant import quant_layers
        except ImportError:  # torch without the fake-quant ops: nothing of ours to lower
            return model
        layers = quant_layers(model) if hasattr(model, "named_modules") else {}
        if not layers:
            return model
        for path, layer in layers.items():
            if not layer.calibrated:
                raise StripError(f"quantized layer {path} has no observed activation range; calibrate it (run a few "
                                 "batches through the prepared model in train mode) before export")
            ctx.quant_table[path] = layer.export_table()
            parent, _, attr = path.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, attr, layer.to_float())
        from .wrapping import fold_batchnorm

        # a model fake-quantized in place trained with its BatchNorms: fold them into their convs now (the
        # Q/DQ lowering derives per-channel weight scales from the folded weights)
        folded = fold_batchnorm(model.eval(), ctx.example_inputs)
        report = ctx.reports.quantization_report("qat (prepared in Python)")
        if folded:
            report.folded_bn_at_export = folded
        return model

    def apply_graph(self, model: Any, ctx: Any) -> Any:
        """Before onnxsim (which renames nodes it fuses): remember each layer's weight initializer."""
        if ctx.quant_table:
            inits = {t.name for t in model.graph.initializer}
            for node in model.graph.node:
                path = ctx.module_paths.get(node.name)
                if path in ctx.quant_table and node.op_type in COMPUTE_OPS and len(node.input) > 1 \
                        and node.input[1] in inits:
                    ctx.quant_table[path].setdefault("weight_initializer", node.input[1])
        return model

    def apply_final_graph(self, model: Any, ctx: Any) -> Any:
        if not ctx.quant_table:
            return model
        if ctx.capture.opset < 13:
            raise StripError("per-channel QuantizeLinear/DequantizeLinear need opset >= 13; export with --opset 13..18")
        lowered = insert_qdq(model, ctx.quant_table, ctx.module_paths)
        missing = sorted(set(ctx.quant_table) - set(lowered))
        if missing:
            raise StripError(f"could not find the ONNX node of quantized layer(s) {', '.join(missing)} to lower; "
                             "export with --no-simplify or --exporter torchscript, or skip these modules in "
                             "quant_config")
        ctx.reports.quantization_report().layers = {p: _summary(ctx.quant_table[p], lowered[p])
                                                    for p in sorted(lowered)}
        return model


def _summary(q: dict[str, Any], node: str) -> dict[str, Any]:
    ws = q["weight_scale"]
    return {"node": node, "act_scale": q["act_scale"], "act_zero_point": q["act_zero_point"],
            "weight_bits": q["weight_bits"], "weight_scale_min": min(ws), "weight_scale_max": max(ws),
            "channels": len(ws)}


def insert_qdq(model: Any, table: dict[str, dict[str, Any]], paths: dict[str, str]) -> dict[str, str]:
    """Insert Q/DQ for every layer of ``table``; returns {module path: node name} of what was lowered."""
    import numpy as np
    from onnx import helper, numpy_helper

    from ..capture.onnx_utils import prune_initializers

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    lowered: dict[str, str] = {}
    new_nodes = []
    by_weight = {q["weight_initializer"]: p for p, q in table.items() if q.get("weight_initializer")}
    for node in graph.node:
        path = paths.get(node.name)
        if path not in table and len(node.input) > 1:  # a node onnxsim fused and renamed: find it by its weight
            path = by_weight.get(node.input[1])
        q = table.get(path) if path is not None else None
        if q is None or node.op_type not in COMPUTE_OPS or path in lowered or len(node.input) < 2 \
                or node.input[1] not in inits:
            new_nodes.append(node)
            continue
        tag = path.replace(".", "_") or "root"
        s_name, z_name = f"{tag}_act_scale", f"{tag}_act_zero_point"
        graph.initializer.extend([numpy_helper.from_array(np.array(q["act_scale"], np.float32), s_name),
                                  numpy_helper.from_array(np.array(q["act_zero_point"], np.int8), z_name)])
        x = node.input[0]
        new_nodes.append(helper.make_node("QuantizeLinear", [x, s_name, z_name], [f"{tag}_act_q"],
                                          name=f"{tag}_act_quant"))
        new_nodes.append(helper.make_node("DequantizeLinear", [f"{tag}_act_q", s_name, z_name], [f"{tag}_act_dq"],
                                          name=f"{tag}_act_dequant"))
        node.input[0] = f"{tag}_act_dq"
        w = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
        axis = _channel_axis(node, w, len(q["weight_scale"]))
        shape = [1] * w.ndim
        shape[axis] = -1
        qmax = 2 ** (q["weight_bits"] - 1) - 1
        # max |w| / qmax of the exported weight: the training-time scale, times the per-channel factor of a
        # BatchNorm folded in after training (per-channel symmetric quantization commutes with that scaling)
        scale = np.maximum(np.abs(np.moveaxis(w, axis, 0)).reshape(w.shape[axis], -1).max(axis=1) / qmax,
                           1e-12).astype(np.float32)
        q["weight_scale"] = scale.tolist()
        w_int = np.clip(np.rint(w / scale.reshape(shape)), -qmax, qmax).astype(np.int8)
        wq, ws, wz = f"{tag}_weight_int8", f"{tag}_weight_scale", f"{tag}_weight_zero_point"
        graph.initializer.extend([numpy_helper.from_array(w_int, wq), numpy_helper.from_array(scale, ws),
                                  numpy_helper.from_array(np.zeros(len(scale), np.int8), wz)])
        new_nodes.append(helper.make_node("DequantizeLinear", [wq, ws, wz], [f"{tag}_weight_dq"], axis=axis,
                                          name=f"{tag}_weight_dequant"))
        node.input[1] = f"{tag}_weight_dq"
        new_nodes.append(node)
        lowered[path] = node.name
    del graph.node[:]
    graph.node.extend(new_nodes)
    prune_initializers(model)
    return lowered


def _channel_axis(node: Any, weight: Any, channels: int) -> int:
    """The weight axis of the output channels: Conv 0; Gemm 0 with transB else 1; MatMul the last."""
    if node.op_type == "Conv":
        axis = 0
    elif node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        axis = 0 if trans_b else 1
    else:
        axis = weight.ndim - 1
    if weight.shape[axis] != channels:
        raise StripError(f"weight {node.input[1]} of node {node.name} has shape {list(weight.shape)}; expected "
                         f"{channels} output channels on axis {axis}")
    return axis


class LowerTorchAoFakeQuant:
    """Models prepared with torch.ao.quantization's eager QAT: each FakeQuantize becomes the fixed
    fake_quantize arithmetic it computes, which the exporters write as QuantizeLinear/DequantizeLinear."""

    name = "lower-torch-ao-fake-quant"
    order = 4

    def apply_module(self, model: Any, ctx: Any) -> Any:
        if not hasattr(model, "named_modules"):
            return model
        from . import torch_ao

        try:
            lowered = torch_ao.lower(model)
        except ValueError as e:
            raise StripError(f"torch.ao fake quantization cannot be written as ONNX Q/DQ: {e}; use a qconfig with "
                             "an 8-bit range") from e
        if lowered:
            report = ctx.reports.quantization_report("qat (torch.ao.quantization prepare_qat)")
            report.torch_ao = torch_ao.summary(model)
        return model
