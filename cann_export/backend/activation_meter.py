"""How much memory autograd keeps for backward: the bytes of the tensors saved by a forward pass
(``torch.autograd.graph.saved_tensors_hooks``), plus the inputs kept by checkpointed blocks (transformers'
layers with ``gradient_checkpointing`` set, cann-export's recomputed blocks). Each storage counts once;
parameters (leaves that require grad) are not activations and are left out.

    with saved_activations() as meter:
        loss = loss_fn(model(x), y)
    meter.bytes          # what this forward keeps until loss.backward()
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class Meter:
    def __init__(self) -> None:
        self.storages: dict[tuple[str, int], int] = {}

    def add(self, value: Any) -> None:
        import torch

        if not isinstance(value, torch.Tensor) or (value.is_leaf and value.requires_grad):
            return
        storage = value.untyped_storage()
        self.storages[(str(value.device), storage.data_ptr())] = storage.nbytes()

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())


@contextlib.contextmanager
def saved_activations() -> Iterator[Meter]:
    import torch
    from torch.nn.modules import module as nn_module
    from torch.utils import _pytree as pytree

    from .recompute import FLAG

    meter = Meter()

    def pack(t: Any) -> Any:
        meter.add(t)
        return t

    def kept_inputs(module: Any, args: tuple) -> None:
        if (getattr(module, FLAG, False) or getattr(module, "gradient_checkpointing", False) is True) \
                and module.training and torch.is_grad_enabled():
            pytree.tree_map(meter.add, args)

    handle = nn_module.register_module_forward_pre_hook(kept_inputs)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield meter
    finally:
        handle.remove()
