"""Built-in formats: a plain .onnx file, the atc_ready bundle and the onnx_bundle directory."""
from __future__ import annotations

from ..bundle.format_writers import AtcReadyFormat, OnnxBundleFormat, OnnxFormat
from ..hooks.specs import hookimpl


@hookimpl
def register_formats(register):
    register(OnnxFormat())
    register(AtcReadyFormat())
    register(OnnxBundleFormat())
