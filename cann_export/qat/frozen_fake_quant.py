"""A trained fake-quant layer frozen for export: fixed fake-quant arithmetic that the exporters write as
QuantizeLinear -> DequantizeLinear on the layer's input and on its weight, so the Q/DQ placement is in the
traced graph itself (no node names to find again after onnxsim renames them)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from .fake_quant import ACT_QMAX, ACT_QMIN, WrapsLayer, compute, per_channel_weights, weight_range


class FrozenQuantLayer(WrapsLayer):
    """``layer`` (Conv / Linear / Conv1D, its weight on the int8 grid) behind per-tensor activation fake
    quantization with a fixed scale and zero point, and symmetric weight fake quantization whose scale is
    derived from the weight as it is now (after any BatchNorm folded into it). ONNX has no narrow weight range
    (-127..127); the full int8 range computes the same numbers, since max |w| / scale is the weight's qmax."""

    def __init__(self, layer: nn.Module, act_scale: float, act_zero: int, weight_bits: int):
        super().__init__()
        self.layer = layer
        self.act_scale, self.act_zero = float(act_scale), int(act_zero)
        self.weight_bits = weight_bits
        self.per_channel = per_channel_weights(layer)
        qmax = weight_range(weight_bits)[1]
        w = layer.weight.detach()
        flat = w.flatten(1) if self.per_channel else w.reshape(1, -1)
        scale = (flat.abs().amax(dim=1) / qmax).clamp(min=1e-12).float()
        self.register_buffer("weight_scale", scale)
        self.register_buffer("weight_zero_point", torch.zeros(scale.numel(), dtype=torch.int32))
        self.weight_scale_value = float(scale[0])
        self.qdq_ops = True  # torch's fake-quant ops, which torch.onnx writes as QuantizeLinear/DequantizeLinear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(self.layer, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            # transformers' Conv1D flattens its input for addmm: quantize the 2-D value the Gemm reads
            flat = self._forward(x.reshape(-1, x.size(-1)))
            return flat.reshape(*x.shape[:-1], flat.shape[-1])
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.qdq_ops:  # the same numbers in plain arithmetic (ONNX QuantizeLinear's x / scale)
            x = torch.div(x, self.act_scale).round_().add_(self.act_zero).clamp_(ACT_QMIN, ACT_QMAX)
            x = x.sub_(self.act_zero).mul_(self.act_scale)
            scale = self.weight_scale.reshape(-1, *([1] * (self.layer.weight.dim() - 1)))
            return compute(self.layer, x, torch.div(self.layer.weight, scale).round_().mul_(scale))
        x = torch.fake_quantize_per_tensor_affine(x, self.act_scale, self.act_zero, ACT_QMIN, ACT_QMAX)
        weight = self.layer.weight
        if self.per_channel:
            weight = torch.fake_quantize_per_channel_affine(weight, self.weight_scale, self.weight_zero_point, 0,
                                                            ACT_QMIN, ACT_QMAX)
        else:
            weight = torch.fake_quantize_per_tensor_affine(weight, self.weight_scale_value, 0, ACT_QMIN, ACT_QMAX)
        return compute(self.layer, x, weight)

    def summary(self) -> dict[str, Any]:
        scale = self.weight_scale
        return {"act_scale": self.act_scale, "act_zero_point": self.act_zero, "weight_bits": self.weight_bits,
                "weight_granularity": "per_channel" if self.per_channel else "per_tensor",
                "weight_scale_min": float(scale.min()), "weight_scale_max": float(scale.max()),
                "channels": int(scale.numel())}


@contextlib.contextmanager
def arithmetic_form(model: nn.Module) -> Iterator[None]:
    """The frozen layers of ``model`` compute in plain arithmetic for a while: torch.export with a free batch
    dimension has no symbolic kernel for torch's fake-quant ops, and devices such as npu-sim run plain ops."""
    layers = [m for m in model.modules() if isinstance(m, FrozenQuantLayer)]
    for layer in layers:
        layer.qdq_ops = False
    try:
        yield
    finally:
        for layer in layers:
            layer.qdq_ops = True
