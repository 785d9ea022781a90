"""Lowering fake quantization to ONNX QuantizeLinear/DequantizeLinear, whatever exporter captured the graph.

strip: each trained fake-quant layer becomes its plain Conv / Linear with the fake-quantized weight, BatchNorms
are folded into their convs, and the layer is then frozen (qat.frozen.FrozenQuantLayer): fixed fake-quant
arithmetic on its input and weight, which torch.onnx writes as QuantizeLinear -> DequantizeLinear, so the
placement is in the traced graph and no node has to be found again by name after onnxsim.
after onnxsim: qat.placement puts every Q/DQ graph (ours, torch.ao's, torchao PT2E's) in the form AMCT adapts.
"""
from __future__ import annotations

from typing import Any

from ..errors import StripError


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
        from .frozen_fake_quant import FrozenQuantLayer, arithmetic_form
        from .wrapping import fold_batchnorm, kept_batchnorms, replace

        frozen: dict[str, tuple[float, int, int]] = {}
        for path, layer in layers.items():
            if not layer.calibrated:
                raise StripError(f"quantized layer {path} has no observed activation range; calibrate it (run a few "
                                 "batches through the prepared model in train mode) before export")
            frozen[path] = (*layer.frozen_act_qparams(), layer.weight_bits)
            replace(model, path, layer.to_float())
        # a model fake-quantized in place trained with its BatchNorms: fold them into their convs now (per-channel
        # symmetric weight quantization commutes with the per-channel BatchNorm factor)
        folded = fold_batchnorm(model.eval(), ctx.example_inputs)
        for path, (scale, zero, bits) in frozen.items():
            layer = FrozenQuantLayer(model.get_submodule(path), scale, zero, bits)
            replace(model, path, layer)
            ctx.quant_table[path] = layer.summary()
        report = ctx.reports.quantization_report("qat (prepared in Python)")
        if folded:
            report.folded_bn_at_export = folded
        kept = kept_batchnorms(model)
        if kept:
            report.kept_bn = kept
        report.layers = {p: dict(q) for p, q in sorted(ctx.quant_table.items())}
        ctx.program_form = arithmetic_form
        return model

    def apply_final_graph(self, model: Any, ctx: Any) -> Any:
        from .qdq_placement import place_for_amct, quantized_ops

        if not any(n.op_type == "QuantizeLinear" for n in model.graph.node):
            if ctx.quant_table:
                raise StripError("the captured graph holds no QuantizeLinear although the model has quantized "
                                 "layers; report this with the model's architecture")
            return model
        placed = place_for_amct(model)
        report = ctx.reports.quantization_report("quantized graph (Q/DQ)")
        report.placement = placed
        if ctx.quant_table and placed["quantized_ops"] < len(ctx.quant_table):
            found = {ctx.module_paths.get(n.name) for n in quantized_ops(model)}
            missing = sorted(p for p in ctx.quant_table if p not in found)
            raise StripError(f"{len(ctx.quant_table) - placed['quantized_ops']} quantized layer(s) did not reach the "
                             f"graph as Q/DQ around a Conv/Gemm/MatMul (not found: {', '.join(missing[:8]) or '?'}); "
                             "skip these modules in quant_config's skip_modules")
        return model


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
