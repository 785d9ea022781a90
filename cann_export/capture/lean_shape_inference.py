"""TorchScript export's shape inference without the weights' values.

torch.onnx's TorchScript exporter runs its ONNX shape inference twice per export, handed every parameter by
value; it serialises each node with the weights it reads into a one-node ONNX model to infer that node's
output, so every weight is copied several times per pass (GPT-2 small: ~2.2 M page faults, ~8 s of CPU in
all per graph). A shape never depends on a large floating-point weight's values, only on its shape, which
the traced graph's inputs already carry; integer tensors and small ones (which shape arithmetic may read)
are still passed by value. The graph written is the same (the goldens and tests/capture check it)."""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

VALUE_LIMIT = 1024  # elements: a floating-point parameter up to this size keeps its value for shape inference


def by_value(tensor: Any) -> bool:
    """Whether shape inference is handed ``tensor``'s value (an integer or small tensor, or no tensor)."""
    import torch

    if not isinstance(tensor, torch.Tensor):
        return True
    return not (tensor.is_floating_point() or tensor.is_complex()) or tensor.numel() <= VALUE_LIMIT


_LOCK = threading.Lock()
_DEPTH = 0  # exports inside the block now: the first installs the lean pass, the last puts torch's back


@contextlib.contextmanager
def lean_shape_inference() -> Iterator[None]:
    """While torch.onnx.export (TorchScript) runs: its shape inference passes see only the parameters
    ``by_value`` accepts. Two exports in threads of one process share one installed pass (blas_threads' rule)."""
    global _DEPTH
    from torch import _C

    with _LOCK:
        if _DEPTH == 0:
            _install(_C)
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0:
                _C._jit_pass_onnx_graph_shape_type_inference = _C._jit_pass_onnx_graph_shape_type_inference.inner


def _install(c: Any) -> None:
    inner = c._jit_pass_onnx_graph_shape_type_inference

    def lean(graph: Any, params_dict: dict[str, Any], opset: int) -> Any:
        return inner(graph, {k: v for k, v in params_dict.items() if by_value(v)}, opset)

    lean.inner = inner  # type: ignore[attr-defined]
    c._jit_pass_onnx_graph_shape_type_inference = lean
