"""``torch.npu.enable_graph_mode(flag)``: torch_npu 1.x's graph mode, as ``torch.compile``.

While it is on, every outermost module called is compiled in place (``module.compile(backend=...)``) and
runs compiled from then on; modules called inside it are traced with it. Turning it off puts every module
it compiled back to eager. The backend: ``aot_eager`` on npu-sim (inductor has no code generator for it),
torchair's NPU backend on a real Ascend device when torchair imports, else torch.compile's default.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any

_state: dict[str, Any] = {}  # "call": Module.__call__ before graph mode, "backend": the compile backend
_compiled: weakref.WeakSet[Any] = weakref.WeakSet()
_inside = threading.local()


def graph_backend() -> Any:
    import sys

    import torch

    # npu-sim: PrivateUse1 named npu without torch_npu (read from torch, so this module needs no npu_sim import)
    if torch._C._get_privateuse1_backend_name() == "npu" and "torch_npu" not in sys.modules:
        return "aot_eager"
    try:
        import torchair  # Ascend's torch.compile backend, shipped beside torch_npu
    except ImportError:
        return "inductor"
    return torchair.get_npu_backend()


def _graph_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``Module.__call__`` in graph mode: the outermost module is compiled in place (``Module.compile``,
    so its hooks and identity stay as they are) before its first call."""
    import torch

    call = _state["call"]
    if torch.compiler.is_compiling() or getattr(_inside, "active", False):
        return call(self, *args, **kwargs)
    if self._compiled_call_impl is None:
        self.compile(backend=_state["backend"])
        _compiled.add(self)
    _inside.active = True
    try:
        return call(self, *args, **kwargs)
    finally:
        _inside.active = False


def enable_graph_mode(flag: bool = True) -> str:
    """Turn graph mode on or off for this process; returns a sentence saying what changed."""
    import torch

    if flag:
        backend = graph_backend()
        _state["backend"] = backend
        if "call" not in _state:
            _state["call"] = torch.nn.Module.__call__
            torch.nn.Module.__call__ = _graph_call
        name = backend if isinstance(backend, str) else getattr(backend, "__name__", type(backend).__name__)
        return (f"graph mode on: modules called from now on run through torch.compile(backend={name!r}); "
                "torch.npu.enable_graph_mode(False) turns it off")
    if "call" in _state:
        torch.nn.Module.__call__ = _state.pop("call")
    for module in list(_compiled):
        module._compiled_call_impl = None  # back to eager
    _compiled.clear()
    _state.clear()
    return "graph mode off: modules run eagerly"


def is_graph_mode() -> bool:
    return "call" in _state
