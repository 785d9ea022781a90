"""The TorchScript exporter's graph with its weights handed over apart from it.

``torch.onnx.export`` (TorchScript) has its C++ encoder copy every weight into the ModelProto, serialise that
(another copy), hand the bytes to Python (another) where ``_add_onnxscript_fn`` parses them whole to look for
functions, then writes them to the file object; capture parses them once more. For GPT-2 small's 500 MB that was
2.4 CPU-s a graph. The encoder's own ``defer_weight_export`` (used by torch's old archive formats) keeps each
initializer's bytes out of the proto (``raw_data`` the placeholder ``__EXTERNAL``) and returns them by name; here
``Graph._export_onnx`` is called with it set, the weights kept aside, and ``attach`` puts them into the parsed graph,
whose serialised bytes are then the same as the plain export's. Used only where the graph fits one proto (capture's
in-memory path); a torch whose private call differs gets the plain export (``supported``)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

PLACEHOLDER = b"__EXTERNAL"


def supported() -> bool:
    """Whether this torch's ``Graph._export_onnx`` takes ``defer_weight_export`` as its fifth argument."""
    import re

    import torch

    doc = getattr(getattr(getattr(torch._C, "Graph", None), "_export_onnx", None), "__doc__", None) or ""
    names = re.findall(r"[(,]\s*(\w+):", doc.split("->")[0])  # pybind11's signature line: (self: T, name: T = v, ...)
    return names[:5] == ["self", "initializers", "onnx_opset_version", "dynamic_axes", "defer_weight_export"]


@contextlib.contextmanager
def held_apart(weights: dict[str, bytes]) -> Iterator[None]:
    """Within the block, the TorchScript exporter writes its graph without the weights' bytes; ``weights`` gets them
    by initializer name."""
    import threading

    import torch

    graph = torch._C.Graph
    original = graph._export_onnx
    ours = threading.get_ident()

    def export_onnx(self: Any, initializers: Any, opset: Any, axes: Any, defer: bool, *rest: Any, **named: Any) -> Any:
        if threading.get_ident() != ours or named:  # another thread's export, or a call this does not know
            return original(self, initializers, opset, axes, defer, *rest, **named)
        proto, export_map, *tail = original(self, initializers, opset, axes, True, *rest)
        if not all(type(data) is bytes for data in export_map.values()):  # a torch that hands over other objects
            return original(self, initializers, opset, axes, defer, *rest)
        weights.update(export_map)
        return (proto, {}, *tail)  # torch's writer accepts no export map for a plain file: it was taken here

    graph._export_onnx = export_onnx
    try:
        yield
    finally:
        graph._export_onnx = original


def attach(model: Any, weights: dict[str, bytes]) -> None:
    """Each placeholder of ``model``'s initializers replaced by its weight's bytes (``weights`` emptied as they go)."""
    for tensor in model.graph.initializer:
        if tensor.raw_data == PLACEHOLDER and tensor.name in weights:
            tensor.raw_data = weights.pop(tensor.name)
    if weights:
        raise ValueError(f"the exporter handed over weights its graph does not hold: {sorted(weights)[:5]}")
