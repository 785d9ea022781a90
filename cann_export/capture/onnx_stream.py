"""Write a ModelProto with its weights inline to a file, one piece at a time. ``SerializeToString`` (and
``ByteSize``, which protobuf's upb computes by serialising) holds the whole graph's bytes and protobuf's own
buffer at once: two copies of every weight, the write stage's peak RSS. Here each field goes out on its own,
a weight's ``raw_data`` as the only copy, sizes added up from the pieces: the same bytes as
``onnx.save_model`` (field-number order, as protobuf writes them), with at most one weight's bytes extra."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

Piece = tuple[int, Callable[[], bytes]]  # (size, bytes when written)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _header(number: int, size: int) -> bytes:
    """The tag and length of a length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(size)


def _repeated(field: Any) -> bool:
    repeated = getattr(field, "is_repeated", None)  # protobuf >= 5.28; ``label`` before (gone in 7)
    return bool(repeated) if repeated is not None else field.label == field.LABEL_REPEATED


def _field(message: Any, field: Any, value: Any) -> bytes:
    """One field of ``message`` as it serialises, alone."""
    part = type(message)()
    if _repeated(field):
        getattr(part, field.name).extend(value)
    elif field.message_type is not None:
        getattr(part, field.name).CopyFrom(value)
    else:
        setattr(part, field.name, value)
    return part.SerializeToString()


def _fixed(data: bytes) -> Piece:
    return len(data), lambda: data


def _tensor(tensor: Any, number: int) -> list[Piece]:
    """An initializer: its small fields serialised now, its ``raw_data`` read when written."""
    pieces: list[Piece] = []
    for field, value in tensor.ListFields():
        if field.name == "raw_data":
            size = len(value)
            pieces += [_fixed(_header(field.number, size)), (size, lambda t=tensor: t.raw_data)]
        else:
            pieces.append(_fixed(_field(tensor, field, value)))
    return [_fixed(_header(number, sum(s for s, _ in pieces))), *pieces]


def _graph(graph: Any, number: int) -> list[Piece]:
    pieces: list[Piece] = []
    for field, value in graph.ListFields():
        if field.name == "initializer":
            for tensor in value:
                pieces += _tensor(tensor, field.number)
        else:
            pieces.append(_fixed(_field(graph, field, value)))
    return [_fixed(_header(number, sum(s for s, _ in pieces))), *pieces]


def _pieces(model: Any) -> Iterator[Piece]:
    for field, value in model.ListFields():
        yield from (_graph(value, field.number) if field.name == "graph" else [_fixed(_field(model, field, value))])


def streamable(model: Any) -> bool:
    """Whether ``save`` writes ``model`` as ``onnx.save_model`` would: every weight in the file, no field
    protobuf does not know (those the walk over known fields would drop)."""
    import onnx
    from google.protobuf.unknown_fields import UnknownFieldSet

    inits = model.graph.initializer
    return (not any(t.data_location == onnx.TensorProto.EXTERNAL for t in inits)
            and not any(len(UnknownFieldSet(m)) for m in (model, model.graph, *inits)))


def save(model: Any, path: Path) -> None:
    """``model`` (see ``streamable``) to ``path``."""
    with open(path, "wb") as out:
        _write(_pieces(model), out)


def _write(pieces: Iterator[Piece], out: BinaryIO) -> None:
    for size, data in pieces:
        chunk = data()
        if len(chunk) != size:  # a weight changed while written: nothing sensible to leave
            raise RuntimeError("the graph changed while it was written")
        out.write(chunk)
