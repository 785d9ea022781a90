"""cann-export: PyTorch models to ONNX and ATC-ready bundles for Ascend NPUs, with numeric parity.

Heavy libraries (torch, onnx, onnxruntime) load only when an API function runs.
"""
from __future__ import annotations

from typing import Any

from .errors import ExportError
from .hooks.specs import hookimpl

__version__ = "0.1.0"
__all__ = ["ExportError", "ExportResult", "__version__", "errors", "export", "hookimpl", "inspect", "validate"]


def __getattr__(name: str) -> Any:
    if name in ("export", "validate", "inspect", "ExportResult"):
        from . import api

        return getattr(api, name)
    if name == "errors":
        from . import errors

        return errors
    raise AttributeError(f"module 'cann_export' has no attribute {name!r}")
