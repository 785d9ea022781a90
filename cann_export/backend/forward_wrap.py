"""Replacing one module's ``forward`` (an instance attribute, as accelerate does for mixed precision)
without changing its class, its state_dict keys or its hooks; undone by deleting the attribute.

The wrapper is a method bound to the module, so ``copy.deepcopy`` (export's CPU copy) rebinds it to the
copy; a wrapper reads its module's settings from a registry the copy is not in, and passes straight through.
"""
from __future__ import annotations

import types
import weakref
from typing import Any

_wrapped: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # module -> the wrapper function
SAVED = "_cann_export_forward"  # an instance forward the module had before ours


def wrap(module: Any, fn: Any) -> None:
    """``module.forward`` becomes ``fn(module, *args, **kwargs)``; ``fn`` calls ``inner(module)``."""
    if module in _wrapped:
        raise RuntimeError(f"{type(module).__name__}.forward is wrapped already")
    if "forward" in module.__dict__:
        module.__dict__[SAVED] = module.__dict__["forward"]
    module.forward = types.MethodType(fn, module)
    _wrapped[module] = fn


def unwrap(module: Any) -> None:
    if _wrapped.pop(module, None) is None:
        return
    del module.forward
    if SAVED in module.__dict__:
        module.forward = module.__dict__.pop(SAVED)


def inner(module: Any) -> Any:
    """The forward the wrapper calls: the module's earlier instance forward, else its class's."""
    saved = module.__dict__.get(SAVED)
    return saved if saved is not None else types.MethodType(type(module).forward, module)


def wrapped_in(model: Any) -> list[tuple[Any, Any]]:
    """(module, wrapper) for every wrapped module inside ``model`` (itself included)."""
    return [(m, _wrapped[m]) for m in model.modules() if m in _wrapped]
