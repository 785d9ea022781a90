"""quant_config: the keys users pass (validated, with the list of valid values on any mistake)."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..errors import OptionsError

QUANTIZABLE_TYPES = ("Conv1d", "Conv2d", "Conv3d", "Linear", "Conv1D")  # Conv1D: transformers' (GPT-2)
LOSSES = ("mse", "kl")


@dataclass(frozen=True)
class QuantConfig:
    """Weights: symmetric, ``weight_bits`` (4..8, on the int8 grid), per output channel for convs and per
    tensor for Linear / Conv1D (AMCT's rule for Gemm / MatMul). Activations (each
    quantized layer's input): per-tensor affine int8. ``quantize_types`` picks layers by type and
    ``skip_modules`` keeps module paths (and their children) in float, e.g. the first conv and the head."""

    weight_bits: int = 8
    activation_bits: int = 8
    quantize_types: tuple[str, ...] = QUANTIZABLE_TYPES
    skip_modules: tuple[str, ...] = ()
    loss: str = "mse"  # distillation loss on the outputs: mse, or kl on logits
    batch_size: int = 32  # calibration / fine-tuning batch size (CLI flow)

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


_KEYS = tuple(QuantConfig.__dataclass_fields__)


def parse(raw: dict[str, Any] | QuantConfig | None) -> QuantConfig:
    if isinstance(raw, QuantConfig):
        return raw
    raw = dict(raw or {})
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise OptionsError(f"unknown quant_config key(s) {', '.join(unknown)}; valid keys: {', '.join(_KEYS)}")
    w, a = raw.get("weight_bits", 8), raw.get("activation_bits", 8)
    if not isinstance(w, int) or not 4 <= w <= 8:
        raise OptionsError(f"quant_config weight_bits={w!r} is out of range; valid values: 4, 5, 6, 7, 8")
    if a != 8:
        raise OptionsError(f"quant_config activation_bits={a!r} is not supported; valid values: 8")
    types = tuple(raw.get("quantize_types", QuantConfig.quantize_types))
    bad = [t for t in types if t not in QUANTIZABLE_TYPES]
    if bad:
        raise OptionsError(f"quant_config quantize_types {bad} unknown; valid values: {', '.join(QUANTIZABLE_TYPES)}")
    loss = raw.get("loss", "mse")
    if loss not in LOSSES:
        raise OptionsError(f"quant_config loss={loss!r}; valid values: {', '.join(LOSSES)}")
    batch = raw.get("batch_size", 32)
    if not isinstance(batch, int) or batch < 1:
        raise OptionsError(f"quant_config batch_size={batch!r}; valid values: a positive integer")
    skip = raw.get("skip_modules", ())
    skip = (skip,) if isinstance(skip, str) else tuple(skip)
    return QuantConfig(weight_bits=w, activation_bits=a, quantize_types=types, skip_modules=skip, loss=loss,
                       batch_size=batch)
