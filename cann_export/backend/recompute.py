"""``gradient_checkpointing=True`` for the user's tracked model: activations of its repeated blocks are
recomputed in backward instead of saved.

transformers models use their own switch (``activation_checkpointing_enable``, formerly
``gradient_checkpointing_enable``, non-reentrant). Other models: the blocks are the submodule entries of
the outermost ``nn.ModuleList`` / ``nn.Sequential`` holding at least two modules that have submodules of
their own (a ResNet stage's blocks, a transformer's layers); each block's forward runs under
``torch.utils.checkpoint.checkpoint(use_reentrant=False)`` in training with gradients on. The
recomputation restores the block's buffers afterwards, so BatchNorm's running statistics (and QAT
observers) are updated once per step, as without checkpointing. A model without such blocks (a few
layers side by side) has nothing worth recomputing: ``apply`` says so and changes nothing.
"""
from __future__ import annotations

import weakref
from typing import Any

from . import forward_wrap

FLAG = "_cann_export_recompute"  # set on each block (the activation meter counts the inputs kept for it)
_blocks: weakref.WeakSet[Any] = weakref.WeakSet()


def _hf_switch(model: Any) -> tuple[Any, Any] | None:
    """transformers' own (enable, disable), where the model supports checkpointing."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        return None
    if hasattr(model, "activation_checkpointing_enable"):
        return (lambda: model.activation_checkpointing_enable(
                    activation_checkpointing_kwargs={"use_reentrant": False}),
                model.activation_checkpointing_disable)
    if hasattr(model, "gradient_checkpointing_enable"):
        return (lambda: model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False}),
                model.gradient_checkpointing_disable)
    return None


def find_blocks(model: Any) -> list[Any]:
    from torch import nn

    found: list[Any] = []

    def walk(module: Any) -> None:
        if isinstance(module, (nn.ModuleList, nn.Sequential)):
            composite = [m for m in module if next(m.children(), None) is not None]
            if len(composite) >= 2:
                found.extend(composite)
                return
        for child in module.children():
            walk(child)

    walk(model)
    return found


def _checkpointed_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    import torch
    from torch.utils.checkpoint import checkpoint

    run_inner = forward_wrap.inner(self)
    if self not in _blocks or not (self.training and torch.is_grad_enabled()):
        return run_inner(*args, **kwargs)
    calls = [0]

    def run(*a: Any, **k: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            return run_inner(*a, **k)
        saved = [b.detach().clone() for b in self.buffers()]  # the recomputation must not update them again
        try:
            return run_inner(*a, **k)
        finally:
            with torch.no_grad():
                for b, s in zip(self.buffers(), saved, strict=True):
                    b.copy_(s)

    return checkpoint(run, *args, use_reentrant=False, **kwargs)


def apply(model: Any) -> tuple[str, Any]:
    """Turn recomputation on for ``model``; returns (what was done, the undo callable, or None)."""
    switch = _hf_switch(model)
    if switch is not None:
        enable, disable = switch
        enable()
        return f"transformers' own activation checkpointing on {type(model).__name__}", disable
    blocks = find_blocks(model)
    if not blocks:
        return (f"{type(model).__name__} has no repeated blocks (an nn.ModuleList / nn.Sequential of modules "
                "with submodules) to recompute: nothing is checkpointed"), None
    for block in blocks:
        forward_wrap.wrap(block, _checkpointed_forward)
        setattr(block, FLAG, True)
        _blocks.add(block)

    def undo() -> None:
        for block in blocks:
            forward_wrap.unwrap(block)
            block.__dict__.pop(FLAG, None)
            _blocks.discard(block)

    return f"{len(blocks)} block(s) of {type(model).__name__} recomputed in backward", undo
