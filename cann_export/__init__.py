"""cann-export: PyTorch models to ONNX and ATC-ready bundles for Ascend NPUs, with numeric parity.

The names below are the public API, for users (``export``, ``validate``, ``inspect``) and for plugin
authors (the contracts of each extension point, the context they receive, ``hookimpl`` and a few helpers a
format needs to write a bundle validate and inspect can read). Everything else is internal. Heavy
libraries (torch, onnx, onnxruntime) load only when an API function runs.
"""
from __future__ import annotations

import importlib
from typing import Any

from .errors import ExportError
from .hooks.specs import hookimpl

__version__ = "0.1.0"

# public name -> (module, attribute); imported on first use
_LAZY: dict[str, tuple[str, str]] = {
    # the Python API
    "export": (".api", "export"), "validate": (".api", "validate"), "inspect": (".api", "inspect"),
    "export_multi": (".api", "export_multi"),
    "ExportResult": (".api", "ExportResult"),
    # the vocabulary of an export
    "ExportOptions": (".options", "ExportOptions"), "Tolerance": (".options", "Tolerance"),
    "InputSpec": (".options", "InputSpec"),
    "ExportContext": (".context", "ExportContext"), "LoadedModel": (".context", "LoadedModel"),
    # the extension points' contracts (cann_export.hooks.contracts)
    "Loader": (".hooks.contracts", "Loader"), "Pass": (".hooks.contracts", "Pass"),
    "Exporter": (".hooks.contracts", "Exporter"), "Format": (".hooks.contracts", "Format"),
    "Validator": (".hooks.contracts", "Validator"), "Backend": (".hooks.contracts", "Backend"),
    "AtcHint": (".hooks.contracts", "AtcHint"), "InputProvider": (".hooks.contracts", "InputProvider"),
    "CheckedBundle": (".hooks.contracts", "CheckedBundle"),
    "Container": (".hooks.contracts", "Container"), "ResultInfo": (".hooks.contracts", "ResultInfo"),
    # helpers a format uses to write an artifact the way the built-ins do
    "save_model": (".graph.onnx_helpers", "save_model"),
    "write_atomic": (".fs.atomic", "write_text"),
    "commit_dir": (".fs.atomic", "commit_dir"),
    "write_manifest": (".bundle.manifest_build", "write_manifest"),
    "write_parity_data": (".bundle.parity_store", "write_parity_data"),
}

__all__ = ["ExportError", "__version__", "errors", "hookimpl", "load", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module, __name__), attr)
        globals()[name] = value
        return value
    if name == "load":  # load(BUNDLE): the loading package, callable (cann_export/load/__init__.py)
        return importlib.import_module(".load", __name__)
    if name == "errors":
        from . import errors

        return errors
    raise AttributeError(f"module 'cann_export' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
