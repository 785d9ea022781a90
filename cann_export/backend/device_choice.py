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


def cpu_copy(value: Any, memo: dict[int, Any] | None = None) -> Any:
    """A CPU copy of a module (parameters and buffers copied straight to the CPU, tied ones kept tied,
    gradients left behind), or of a tensor / dict / list of tensors that are not on the CPU already. The
    original stays where it is, untouched: export captures on the CPU, wherever the model trained. ``memo``:
    deepcopy entries to reuse for CPU tensors (aliases that share the caller's storage)."""
    import copy

    import torch

    if isinstance(value, torch.nn.Module):
        memo = {k: v for k, v in (memo or {}).items() if v.device.type == "cpu"}  # shared CPU weights, if given
        for t in [*value.parameters(), *value.buffers()]:
            if t.device.type != "cpu" and id(t) not in memo:
                host = t.detach().to("cpu", copy=True)
                memo[id(t)] = torch.nn.Parameter(host, t.requires_grad) if isinstance(t, torch.nn.Parameter) \
                    else host
        clone = copy.deepcopy(value, memo)
        clone._cann_export_private = True  # not a model cann.torch.resume(path) should pick
        return clone.to("cpu")  # tensors the module holds outside its parameters and buffers stay put
    if isinstance(value, torch.Tensor):
        return value if value.device.type == "cpu" else value.detach().cpu()
    if isinstance(value, dict):
        return {k: cpu_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(cpu_copy(v) for v in value)
    return value


def shared_weights_memo(module: Any) -> dict[int, Any]:
    """A deepcopy memo that gives each parameter and buffer a new tensor over the same storage."""
    import torch

    memo: dict[int, Any] = {}
    for p in module.parameters():
        memo.setdefault(id(p), torch.nn.Parameter(p.detach(), requires_grad=p.requires_grad))
    for b in module.buffers():
        memo.setdefault(id(b), b.detach())
    return memo
