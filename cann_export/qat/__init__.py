"""Quantization-aware training to int8: prepare, calibrate, fine-tune, and the ONNX Q/DQ lowering."""
from __future__ import annotations

from .config import QuantConfig, parse
from .prepare import prepare, qat_state
from .train import calibrate, finetune

__all__ = ["QuantConfig", "parse", "prepare", "qat_state", "calibrate", "finetune"]
