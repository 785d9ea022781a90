"""onnx's full check of a serialised graph without its weights' bytes.

``onnx.checker.check_model(data, full_check=True)`` copies the serialised graph into C++ and parses it whole to
check it and infer its shapes strictly: for GPT-2 small's 500 MB graph, 0.6 CPU-s a graph, of which the weights'
bytes are nearly all and are read for one thing only, that each ``raw_data`` holds at least the bytes its type and
shape need. Here the checker reads the graph with each weight of ``KEPT_BELOW`` bytes or more marked as external
data (a name, type and shape, which it checks without reading data it cannot find), and that one byte count is
checked from the lengths the parse skipped. Smaller weights keep their bytes: shape inference reads the operands
of Reshape, Expand and the like from them. A graph this cannot take as it is (a weight with another data field,
a type of no whole-byte size) gets the checker on ``data`` as before."""
from __future__ import annotations

import math
from typing import Any

KEPT_BELOW = 1024  # bytes: a weight smaller than this keeps its data for the check
PLACE = "weights-left-out.bin"  # the (empty) file the left-out weights point to, alone in a temporary directory

# TensorProto data types of a whole-byte element size (sub-byte and string types take the full check)
ITEMSIZE = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 14: 8, 15: 16, 16: 2,
            17: 1, 18: 1, 19: 1, 20: 1}
OTHER_DATA = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


def full_check(data: bytes) -> None:
    """Raise as ``onnx.checker.check_model(data, full_check=True)`` does when the graph in ``data`` fails it."""
    import onnx

    light = _light(data)
    if light is None:
        onnx.checker.check_model(data, full_check=True)
        return
    _check(light)


def full_check_apart(model: Any, weights: dict[str, bytes]) -> bool:
    """The same check of ``model``, a graph whose weights ``weights`` (by initializer name) are held apart from it
    (each such initializer's ``raw_data`` a placeholder: capture/weights_apart.py); ``model`` is not changed. False
    (nothing checked) when a weight is the checker's alone to judge (a type of no whole-byte size, a dimension of 0
    or less, external data): the caller checks the whole graph."""
    import onnx

    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        return False
    light = onnx.ModelProto()
    light.CopyFrom(model)  # the graph without its weights: small
    for tensor in light.graph.initializer:
        data = weights.get(tensor.name)
        if data is not None and len(data) < KEPT_BELOW:
            tensor.raw_data = data  # shape inference reads it (Slice's starts, TopK's k, Reshape's shape)
        elif data is not None and not _external(tensor, len(data)):
            return False
    _check(light)
    return True


def _check(light: Any) -> None:
    import tempfile
    from pathlib import Path

    import onnx

    with tempfile.TemporaryDirectory(prefix="cann-export-check-") as tmp:
        (Path(tmp) / PLACE).touch()  # the external data's file: the checker asks only that it is one
        path = Path(tmp) / "model.onnx"
        onnx.save_model(light, str(path))
        onnx.checker.check_model(str(path), full_check=True)


def _light(data: bytes) -> Any:
    """The graph in ``data`` with its weights of ``KEPT_BELOW`` bytes or more marked as external data, after their
    byte counts were checked; None when a weight cannot be checked this way."""
    import onnx

    from .onnx_stream import load_bytes

    lengths: dict[str, int] = {}
    light = load_bytes(data, lengths, KEPT_BELOW)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in light.graph.initializer):
        return None  # the checker resolves its files against the working directory: its own judgement
    for tensor in light.graph.initializer:
        if tensor.name in lengths and (any(len(getattr(tensor, f)) for f in OTHER_DATA)
                                       or not _external(tensor, lengths[tensor.name])):
            return None
    return light


def _external(tensor: Any, length: int) -> bool:
    """``tensor`` marked as external data, after its ``length`` bytes were checked against its type and shape; False
    (unchanged) for a tensor whose check is the checker's alone (a type of no whole-byte size, a negative or empty
    dimension)."""
    import onnx

    if tensor.data_type not in ITEMSIZE or any(d <= 0 for d in tensor.dims):
        return False
    needed = math.prod(tensor.dims) * ITEMSIZE[tensor.data_type]
    if length < needed:
        raise onnx.checker.ValidationError(
            f"TensorProto (tensor name: {tensor.name}) raw_data size ({length} bytes) is too small "
            f"for the declared shape and type ({needed} bytes required).")
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", PLACE
    return True
