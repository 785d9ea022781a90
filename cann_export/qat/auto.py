"""The articles' QAT: after ``cann.torch.config(quantization_aware_training=True, quant_config=...)`` the
user's unchanged training loop trains a fake-quantized model.

Where fake quantization goes in: at the first outermost forward call in train mode of a module that has
quantizable layers (Conv/Linear) and none yet. That point comes after the model was built, moved to its
device and given to its optimizer, so the layers are wrapped in place, keeping their Parameter objects
(``prepare.prepare_in_place``); eval-mode calls (validation, export) never prepare anything.
"""
from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator
from typing import Any

_handles: dict[str, Any] = {}
_config: dict[str, Any] = {}
_depth = threading.local()


def install(quant_config: dict[str, Any]) -> None:
    """Prepare models at their first train-mode forward with ``quant_config`` (idempotent)."""
    from torch.nn.modules import module as nn_module

    _config.clear()
    _config.update(quant_config)
    if _handles:
        return

    def pre(module: Any, args: tuple) -> None:
        depth = getattr(_depth, "value", 0)
        _depth.value = depth + 1
        if depth == 0 and module.training:
            _maybe_prepare(module)

    def post(module: Any, args: tuple, *rest: Any) -> None:
        _depth.value = max(getattr(_depth, "value", 1) - 1, 0)

    _handles["pre"] = nn_module.register_module_forward_pre_hook(pre)
    _handles["post"] = nn_module.register_module_forward_hook(post, always_call=True)


def uninstall() -> None:
    for handle in _handles.values():
        handle.remove()
    _handles.clear()


def installed() -> bool:
    return bool(_handles)


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """No global hooks while exporting: torch.export loses the module call stack (and so the PyTorch module
    of every ONNX node) when global module hooks exist."""
    active = installed()
    uninstall()
    try:
        yield
    finally:
        if active:
            install(dict(_config))


def _maybe_prepare(module: Any) -> None:
    from .fake_quant import QuantLayer
    from .wrapping import STATE_ATTR, prepare_in_place, quantizable

    if getattr(module, STATE_ATTR, None) is not None:
        return
    mods = list(module.modules())
    if any(isinstance(m, QuantLayer) for m in mods) or not any(quantizable(m) for m in mods):
        return
    wrapped = prepare_in_place(module, dict(_config), "cann.torch.config: first train-mode forward")
    warnings.warn(f"cann.torch: quantization-aware training: fake quantization inserted into "
                  f"{len(wrapped)} layer(s) of {type(module).__name__} at its first train-mode forward",
                  stacklevel=3)
