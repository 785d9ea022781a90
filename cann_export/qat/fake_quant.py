"""Fake quantization for QAT: layers that see int8-rounded inputs and weights while training in float.

The arithmetic is ONNX's QuantizeLinear/DequantizeLinear (round half to even of x / scale, plus the zero
point, saturated), so the exported Q/DQ graph computes the same numbers; gradients pass straight through.
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


def weight_scale(weight: torch.Tensor, bits: int, per_channel: bool = True) -> torch.Tensor:
    """max |w| / qmax per output channel (axis 0), or of the whole tensor (shape [1])."""
    qmax = weight_range(bits)[1]
    flat = weight.detach().flatten(1) if per_channel else weight.detach().reshape(1, -1)
    # amax and amin separately: on CPU, both together run several times faster than aminmax(dim=1) or abs().amax()
    return (torch.maximum(flat.amax(dim=1), -flat.amin(dim=1)) / qmax).clamp(min=1e-12)


def fake_quant_weight(weight: torch.Tensor, bits: int, per_channel: bool = True) -> torch.Tensor:
    """round(w / s) * s per output channel (or per tensor), gradient passed straight through. Nothing is clipped (the
    scale comes from max |w|, so |w / s| <= qmax), hence no clamp and an exact straight-through estimator; w times
    1 / s (a multiplication runs twice as fast as a division on CPU) may differ from w / s by an ulp, which moves
    a value on the grid only at an exact tie. Vectorised tensor ops run several times faster on CPU than torch's
    fake_quantize_per_channel_affine kernel. The export re-quantizes these values exactly (they are on the grid)."""
    scale = weight_scale(weight, bits, per_channel).reshape(-1, *([1] * (weight.dim() - 1)))
    with torch.no_grad():
        quantized = torch.mul(weight, scale.reciprocal()).round_().mul_(scale)
    return _StraightThrough.apply(weight, quantized, None) if weight.requires_grad else quantized


def fake_quant_activation(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """ONNX QuantizeLinear -> DequantizeLinear arithmetic (round half to even of x / s, plus the zero point,
    saturated); the gradient passes where the value was not clipped, as in torch's fake_quantize."""
    with torch.no_grad():
        q = torch.div(x, scale).round_().add_(zero)
        if not x.requires_grad:
            return q.clamp_(ACT_QMIN, ACT_QMAX).sub_(zero).mul_(scale)
        clipped = q.clamp(ACT_QMIN, ACT_QMAX)
        inside = q == clipped  # one comparison where two bounds would take three passes
        dequantized = clipped.sub_(zero).mul_(scale)
    return _StraightThrough.apply(x, dequantized, inside)


class _StraightThrough(torch.autograd.Function):
    """Forward: the precomputed quantized value. Backward: the gradient unchanged (masked where clipped)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, quantized: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(mask if mask is not None else torch.empty(0))
        ctx.masked = mask is not None
        return quantized

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (mask,) = ctx.saved_tensors
        return (grad * mask if ctx.masked else grad), None, None


def activation_qparams(lo: float, hi: float) -> tuple[float, int]:
    """Affine int8 parameters for the observed range (always including 0)."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = max((hi - lo) / (ACT_QMAX - ACT_QMIN), 1e-12)
    zero = int(round(ACT_QMIN - lo / scale))
    return float(scale), max(ACT_QMIN, min(ACT_QMAX, zero))


def per_channel_weights(layer: nn.Module) -> bool:
    """Conv weights per output channel; Linear (and transformers' Conv1D) weights per tensor: AMCT adapts
    Gemm and MatMul with per-tensor weights only (8.5 and later)."""
    return isinstance(layer, (nn.Conv1d, nn.Conv2d, nn.Conv3d))


def compute(layer: nn.Module, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What ``layer`` computes on ``x`` with ``weight`` in place of its own."""
    if _own_forward(layer):  # a subclass with its own forward (timm's Conv2dSame pads first): run it as written
        return torch.func.functional_call(layer, {"weight": weight}, (x,), strict=False)
    if isinstance(layer, nn.Linear):
        return F.linear(x, weight, layer.bias)
    if isinstance(layer, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        return layer._conv_forward(x, weight, layer.bias)
    # transformers' Conv1D (GPT-2): x @ weight + bias with weight [in, out]
    out = torch.addmm(layer.bias, x.reshape(-1, x.size(-1)), weight)
    return out.reshape(*x.shape[:-1], weight.shape[-1])


def _own_forward(layer: nn.Module) -> bool:
    for base in (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d):
        if isinstance(layer, base):
            return type(layer).forward is not base.forward
    return False


class WrapsLayer(nn.Module):
    """A module around ``self.layer``: what the model's own code reads of the layer it called
    (``conv.stride``, ``kernel_size``, ``in_features``: transformers' MobileNet pads from them) comes from
    the wrapped layer."""

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            layer = self.__dict__.get("_modules", {}).get("layer")
            if layer is None or name.startswith("__"):
                raise
            return getattr(layer, name)


class QuantLayer(WrapsLayer):
    """Wraps a Conv, Linear or transformers Conv1D: observes its input range (min/max while ``observing``
    and training or calibrating), fake-quantizes the input per tensor and the weight (``per_channel_weights``)."""

    def __init__(self, layer: nn.Module, weight_bits: int):
        super().__init__()
        self.layer = layer
        self.weight_bits = weight_bits
        self.per_channel = per_channel_weights(layer)
        self.register_buffer("act_min", torch.tensor(float("inf")))
        self.register_buffer("act_max", torch.tensor(float("-inf")))
        self.observing = True
        self.calibrating = False
        self.checkpointed = False  # recompute this layer in backward (gradient_checkpointing)
        self._ranged: bool | None = False  # None: unknown (buffers loaded), read once from the buffers

    @property
    def calibrated(self) -> bool:
        if self._ranged is None:
            self._ranged = bool(torch.isfinite(self.act_min)) and bool(torch.isfinite(self.act_max))
        return self._ranged

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._ranged = None

    def act_qparams(self) -> tuple[float, int]:
        return activation_qparams(float(self.act_min), float(self.act_max))

    def _act_qparams_tensor(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The same parameters as ``act_qparams`` computed on the device (no host synchronisation)."""
        lo, hi = self.act_min.clamp(max=0.0), self.act_max.clamp(min=0.0)
        scale = ((hi - lo) / (ACT_QMAX - ACT_QMIN)).clamp(min=1e-12).float()
        zero = torch.round(ACT_QMIN - lo / scale).clamp(ACT_QMIN, ACT_QMAX)
        return scale, zero

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpointed and self.training and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint

            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.observing and (self.training or self.calibrating):
            with torch.no_grad():
                low, high = torch.aminmax(x.detach())
                torch.minimum(self.act_min, low.to(self.act_min), out=self.act_min)
                torch.maximum(self.act_max, high.to(self.act_max), out=self.act_max)
            self._ranged = True
        if self.calibrated and not self.calibrating:
            scale, zero = self._act_qparams_tensor()
            x = fake_quant_activation(x, scale, zero)
        w = fake_quant_weight(self.layer.weight, self.weight_bits, self.per_channel)
        return compute(self.layer, x, w)

    def frozen_act_qparams(self) -> tuple[float, int]:
        """The activation scale and zero point exactly as the eval forward uses them (fp32 arithmetic)."""
        scale, zero = self._act_qparams_tensor()
        return float(scale), int(zero)

    def to_float(self) -> nn.Module:
        """The wrapped layer with its weight replaced by the fake-quantized (exactly int8-representable) one: a new
        Parameter, so a weight the export shares with the caller's module is never written."""
        with torch.no_grad():
            self.layer.weight = nn.Parameter(
                fake_quant_weight(self.layer.weight, self.weight_bits, self.per_channel).clone(), requires_grad=False)
        return self.layer


def quant_layers(model: nn.Module) -> dict[str, QuantLayer]:
    return {name: m for name, m in model.named_modules() if isinstance(m, QuantLayer)}


def set_mode(model: nn.Module, *, observing: bool | None = None, calibrating: bool | None = None) -> None:
    for layer in quant_layers(model).values():
        if observing is not None:
            layer.observing = observing
        if calibrating is not None:
            layer.calibrating = calibrating
