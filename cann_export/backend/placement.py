"""Where the pipeline runs the model (the QAT loop and the parity reference): ``--backend``.

``auto`` is the real Ascend NPU when torch_npu reports one, else the CPU; npu-sim (an emulation for
running NPU code in CI) is used only when asked for by name.
"""
from __future__ import annotations

from typing import Any


def pipeline_device(backend: str) -> str:
    """Activate the chosen backend for this process and return its torch device string."""
    from .registry import auto_backend, resolve

    return (auto_backend() if backend in ("auto", None) else resolve(backend)).activate()


def to_device(value: Any, device: str) -> Any:
    """Move a module, a tensor or a dict/list of tensors to ``device``."""
    import torch

    if isinstance(value, (torch.nn.Module, torch.Tensor)):
        return value.to(device)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_device(v, device) for v in value)
    return value
