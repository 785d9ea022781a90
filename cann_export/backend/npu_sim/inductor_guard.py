"""torch.compile's default backend (inductor) generates code for real devices only: refuse npu graphs
with a message, installed when inductor is imported (importing it in ``enable()`` would add over a
second to scripts that never compile). Eager backends ("eager", "aot_eager") never run inductor passes."""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any

import torch

from .device import NAME, NpuSimError

_state: dict[str, Any] = {}  # "finder": the pending import hook; "config"/"previous": the installed pass


def _refuse_inductor(inductor_config: Any) -> None:
    from torch._inductor.custom_graph_pass import CustomGraphPass

    previous = inductor_config.pre_grad_custom_pass

    class RefuseNpuGraphs(CustomGraphPass):
        def __call__(self, graph: Any) -> None:
            for node in graph.nodes:
                value = node.meta.get("example_value", node.meta.get("val"))
                if isinstance(value, torch.Tensor) and value.device.type == NAME:
                    raise NpuSimError("torch.compile with the inductor backend does not run on npu-sim (it "
                                      "generates code for real devices); use torch.compile(model, "
                                      "backend='eager') or backend='aot_eager', or run without torch.compile")
            if previous is not None:
                previous(graph)

        def uuid(self) -> Any:  # inductor caches compiled graphs by their passes; ours never changes one
            inner = previous.uuid() if isinstance(previous, CustomGraphPass) else None
            return None if previous is not None and inner is None else f"cann-export-npu-sim-refusal:{inner}"

    inductor_config.pre_grad_custom_pass = RefuseNpuGraphs()
    _state.update(config=inductor_config, previous=previous, installed=inductor_config.pre_grad_custom_pass)


def _when_imported(name: str, callback: Any) -> None:
    """Call ``callback(module)`` once module ``name`` is imported: now if it is, else right after its import."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            _state.pop("finder", None)
            spec = importlib.util.find_spec(fullname)
            if spec is not None and spec.loader is not None:
                exec_module = spec.loader.exec_module

                def exec_then_call(module: Any) -> None:
                    exec_module(module)
                    callback(module)

                spec.loader.exec_module = exec_then_call
            return spec

    finder = Finder()
    _state["finder"] = finder
    sys.meta_path.insert(0, finder)


def install() -> None:
    _when_imported("torch._inductor.config", _refuse_inductor)


def uninstall() -> None:
    """Remove the pending import hook, or put inductor's previous pre-grad pass back."""
    finder = _state.pop("finder", None)
    if finder is not None and finder in sys.meta_path:
        sys.meta_path.remove(finder)
    config = _state.pop("config", None)
    if config is not None and config.pre_grad_custom_pass is _state.get("installed"):
        config.pre_grad_custom_pass = _state.get("previous")
    _state.clear()
