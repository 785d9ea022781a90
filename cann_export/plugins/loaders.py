"""Built-in loaders: .pt2 archives, TorchScript, safetensors and torch.save checkpoints."""
from __future__ import annotations

from ..hooks.specs import hookimpl
from ..load.file_loaders import ExportedProgramLoader, SafetensorsLoader, TorchSaveLoader, TorchScriptLoader


@hookimpl
def register_loaders(register):
    for loader in (ExportedProgramLoader(), TorchScriptLoader(), SafetensorsLoader(), TorchSaveLoader()):
        register(loader)
