"""Quantization-aware training to int8: prepare, calibrate, fine-tune, and the ONNX Q/DQ lowering.

The names below load torch on first use, so importing a submodule (the Q/DQ lowering plugin) stays light."""
from __future__ import annotations

import importlib
from typing import Any

_NAMES = {"QuantConfig": "quant_config", "parse": "quant_config", "prepare": "wrapping", "qat_state": "wrapping",
          "calibrate": "train", "finetune": "train"}
__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
