"""Built-in formats: a plain .onnx file and the atc_ready bundle."""
from __future__ import annotations

from ..bundle.formats import AtcReadyFormat, OnnxFormat
from ..hooks.specs import hookimpl


@hookimpl
def register_formats(register):
    register(OnnxFormat())
    register(AtcReadyFormat())
