"""Models prepared with PyTorch's own eager QAT API (``torch.ao.quantization.prepare_qat``: FakeQuantize,
QuantStub / DeQuantStub, fused ConvBn(ReLU) QAT modules) exported as Q/DQ ONNX.

In eval mode their observers are frozen (eval is inference: the ranges must not move between the reference
and the export: backend/eval_mode.py), and each FakeQuantize module becomes the fixed arithmetic it computes with
its current scale and zero point: ``fake_quantize_per_tensor_affine`` / ``fake_quantize_per_channel_affine``, which
the exporters write as QuantizeLinear -> DequantizeLinear. ONNX's 8-bit types cover (0, 255) and (-128, 127)
only; a narrower range (``reduce_range``: 0..127) is the same arithmetic after a clamp to the range's
float bounds, so it is written as Clip + Q/DQ over the full type.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..backend.eval_mode import fake_quant_modules

FULL_RANGES = ((0, 255), (-128, 127))


def fake_quantized(model: Any) -> bool:
    """A model with torch.ao eager fake quantization (prepare_qat), whose export is a Q/DQ graph."""
    try:
        from torch.ao.quantization import FakeQuantizeBase
    except ImportError:
        return False
    return hasattr(model, "modules") and any(isinstance(m, FakeQuantizeBase) for m in model.modules())


class FixedFakeQuant(nn.Module):
    """A torch.ao FakeQuantize frozen to its scale and zero point (buffers, so they export as constants)."""

    def __init__(self, source: nn.Module):
        super().__init__()
        scale, zero = source.scale, source.zero_point  # what its forward uses once the observer is frozen
        self.register_buffer("scale", scale.detach().float().reshape(-1).clone())
        self.register_buffer("zero_point", zero.detach().reshape(-1).to(torch.int32).clone())
        self.scale_value, self.zero_value = float(self.scale[0]), int(self.zero_point[0])  # per tensor
        self.quant_min, self.quant_max = int(source.quant_min), int(source.quant_max)
        self.per_channel = self.scale.numel() > 1 or getattr(source, "is_per_channel", False)
        self.ch_axis = int(getattr(source, "ch_axis", 0))
        self.enabled = bool(source.fake_quant_enabled[0])
        full = next((r for r in FULL_RANGES if r[0] <= self.quant_min and self.quant_max <= r[1]), None)
        if full is None:
            raise ValueError(f"quantization range {self.quant_min}..{self.quant_max} fits no 8-bit ONNX type")
        self.full_min, self.full_max = full

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return x
        narrowed = (self.quant_min, self.quant_max) != (self.full_min, self.full_max)
        if self.per_channel:
            shape = [1] * x.dim()
            shape[self.ch_axis] = -1
            if narrowed:
                zp = self.zero_point.reshape(shape).to(x.dtype)
                s = self.scale.reshape(shape)
                x = torch.clamp(x, (self.quant_min - zp) * s, (self.quant_max - zp) * s)
            return torch.fake_quantize_per_channel_affine(x, self.scale, self.zero_point, self.ch_axis,
                                                          self.full_min, self.full_max)
        scale, zero = self.scale_value, self.zero_value
        if narrowed:
            x = torch.clamp(x, (self.quant_min - zero) * scale, (self.quant_max - zero) * scale)
        return torch.fake_quantize_per_tensor_affine(x, scale, zero, self.full_min, self.full_max)


def lower(model: nn.Module) -> list[str]:
    """Replace every torch.ao fake-quant module with its FixedFakeQuant, in place; returns their paths."""
    found = fake_quant_modules(model)
    for path in found:
        parent, _, name = path.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, name, FixedFakeQuant(found[path]))
    return list(found)


def summary(model: nn.Module) -> dict[str, Any]:
    return {p: {"scale_min": float(m.scale.min()), "scale_max": float(m.scale.max()), "range": [m.quant_min,
            m.quant_max], "per_channel": m.per_channel} for p, m in model.named_modules()
            if isinstance(m, FixedFakeQuant)}
