"""Built-in ONNX exporters: torch.onnx's dynamo exporter first, the TorchScript exporter as fallback."""
from __future__ import annotations

from ..capture.exporters import DynamoExporter, TorchScriptExporter
from ..hooks.specs import hookimpl


@hookimpl
def register_exporters(register):
    register(DynamoExporter())
    register(TorchScriptExporter())
