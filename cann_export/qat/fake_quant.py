"""Fake quantization for QAT: layers that see int8-rounded inputs and weights while training in float.

Forward and backward use torch's fake_quantize ops (straight-through gradients). The same arithmetic
exported as ONNX QuantizeLinear/DequantizeLinear gives the same numbers (round half to even, clamp).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

ACT_QMIN, ACT_QMAX = -128, 127


def weight_range(bits: int) -> tuple[int, int]:
    q = 2 ** (bits - 1) - 1  # symmetric, narrow range: zero point 0
    return -q, q


def weight_scale(weight: torch.Tensor, bits: int) -> torch.Tensor:
    """Per output channel (axis 0): max |w| / qmax."""
    qmax = weight_range(bits)[1]
    return (weight.detach().abs().flatten(1).amax(dim=1) / qmax).clamp(min=1e-12)


def fake_quant_weight(weight: torch.Tensor, bits: int) -> torch.Tensor:
    qmin, qmax = weight_range(bits)
    scale = weight_scale(weight, bits).float()
    zero = torch.zeros_like(scale, dtype=torch.int32)
    return torch.fake_quantize_per_channel_affine(weight, scale, zero, 0, qmin, qmax)


def activation_qparams(lo: float, hi: float) -> tuple[float, int]:
    """Affine int8 parameters for the observed range (always including 0)."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = max((hi - lo) / (ACT_QMAX - ACT_QMIN), 1e-12)
    zero = int(round(ACT_QMIN - lo / scale))
    return float(scale), max(ACT_QMIN, min(ACT_QMAX, zero))


class QuantLayer(nn.Module):
    """Wraps a Conv or Linear: observes its input range (min/max while ``observing`` and training or
    calibrating), fake-quantizes the input per tensor and the weight per output channel."""

    def __init__(self, layer: nn.Module, weight_bits: int):
        super().__init__()
        self.layer = layer
        self.weight_bits = weight_bits
        self.register_buffer("act_min", torch.tensor(float("inf")))
        self.register_buffer("act_max", torch.tensor(float("-inf")))
        self.observing = True
        self.calibrating = False

    @property
    def calibrated(self) -> bool:
        return bool(torch.isfinite(self.act_min)) and bool(torch.isfinite(self.act_max))

    def act_qparams(self) -> tuple[float, int]:
        return activation_qparams(float(self.act_min), float(self.act_max))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.observing and (self.training or self.calibrating):
            with torch.no_grad():
                self.act_min.copy_(torch.minimum(self.act_min, x.detach().min().to(self.act_min)))
                self.act_max.copy_(torch.maximum(self.act_max, x.detach().max().to(self.act_max)))
        if self.calibrated and not self.calibrating:
            scale, zero = self.act_qparams()
            x = torch.fake_quantize_per_tensor_affine(x, scale, zero, ACT_QMIN, ACT_QMAX)
        w = fake_quant_weight(self.layer.weight, self.weight_bits)
        if isinstance(self.layer, nn.Linear):
            return F.linear(x, w, self.layer.bias)
        return self.layer._conv_forward(x, w, self.layer.bias)

    def export_table(self) -> dict[str, Any]:
        """Scales and zero points as the ONNX lowering writes them."""
        scale, zero = self.act_qparams()
        return {"act_scale": scale, "act_zero_point": zero, "weight_bits": self.weight_bits,
                "weight_scale": weight_scale(self.layer.weight, self.weight_bits).tolist()}

    def to_float(self) -> nn.Module:
        """The wrapped layer with its weight replaced by the fake-quantized (exactly int8-representable) one."""
        with torch.no_grad():
            self.layer.weight.copy_(fake_quant_weight(self.layer.weight, self.weight_bits))
        return self.layer


def quant_layers(model: nn.Module) -> dict[str, QuantLayer]:
    return {name: m for name, m in model.named_modules() if isinstance(m, QuantLayer)}


def set_mode(model: nn.Module, *, observing: bool | None = None, calibrating: bool | None = None) -> None:
    for layer in quant_layers(model).values():
        if observing is not None:
            layer.observing = observing
        if calibrating is not None:
            layer.calibrating = calibrating
