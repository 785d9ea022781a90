"""Recording the inputs of a model's most recent forward call, so ``export`` can reuse them."""
from __future__ import annotations

import threading
import weakref
from typing import Any

_last_inputs: weakref.WeakKeyDictionary[Any, tuple[tuple, dict]] = weakref.WeakKeyDictionary()
_handles: dict[str, Any] = {}
_depth = threading.local()


def _detach(value: Any) -> Any:
    """Detached references, not copies: this runs on every forward call of a training loop, and export
    only needs the inputs' shapes, dtypes and (if nothing overwrote them) their values."""
    import torch

    if isinstance(value, tuple) and all(isinstance(x, torch.Tensor) for x in value):
        return tuple(x.detach() for x in value)
    from torch.utils import _pytree as pytree

    return pytree.tree_map(lambda x: x.detach() if isinstance(x, torch.Tensor) else x, value)


def _record(module: Any, args: tuple, kwargs: dict) -> None:
    _last_inputs[module] = (_detach(args), _detach(kwargs) if kwargs else {})


def track(model: Any) -> Any:
    """Record the inputs of every forward call of ``model`` (its last call is kept). Returns ``model``."""
    def hook(module: Any, args: tuple, kwargs: dict) -> None:
        _record(module, args, kwargs)

    if not getattr(model, "_cann_export_tracked", False):
        model.register_forward_pre_hook(hook, with_kwargs=True)
        model._cann_export_tracked = True
    return model


def enable_global() -> None:
    """Record the inputs of every outermost module call in the process (nested calls are ignored)."""
    from torch.nn.modules import module as nn_module

    if _handles:
        return

    def pre(module: Any, args: tuple, kwargs: dict | None = None) -> None:
        depth = getattr(_depth, "value", 0)
        if depth == 0:
            _record(module, args, kwargs or {})
        _depth.value = depth + 1

    def post(module: Any, args: tuple, *rest: Any) -> None:
        _depth.value = max(getattr(_depth, "value", 1) - 1, 0)

    _handles["pre"] = nn_module.register_module_forward_pre_hook(pre)
    _handles["post"] = nn_module.register_module_forward_hook(post, always_call=True)


def disable_global() -> None:
    for handle in _handles.values():
        handle.remove()
    _handles.clear()


def recorded_inputs(model: Any) -> tuple[tuple, dict] | None:
    return _last_inputs.get(model)
