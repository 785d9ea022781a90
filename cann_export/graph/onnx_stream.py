"""Write a ModelProto with its weights inline to a file, one piece at a time. ``SerializeToString`` (and
``ByteSize``, which protobuf's upb computes by serialising) holds the whole graph's bytes and protobuf's own
buffer at once: two copies of every weight, the write stage's peak RSS. Here each field goes out on its own,
a weight's ``raw_data`` as the only copy, sizes added up from the pieces: the same bytes as
``onnx.save_model`` (field-number order, as protobuf writes them), with at most one weight's bytes extra.
``load`` reads one the same way: the ModelProto ``onnx.load`` returns, without the whole file's bytes beside it."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

Piece = tuple[int, Callable[[], bytes]]  # (size, bytes when written)
WEIGHT_BYTES = 1 << 16  # a weight this large is read from the file by ``referring_to``; smaller ones stay inline


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


def copy_field(message: Any, field: Any, value: Any) -> None:
    """Set ``field`` of ``message`` to ``value`` (a repeated field extended, a message copied)."""
    if _repeated(field):
        getattr(message, field.name).extend(value)
    elif field.message_type is not None:
        getattr(message, field.name).CopyFrom(value)
    else:
        setattr(message, field.name, value)


def _field(message: Any, field: Any, value: Any) -> bytes:
    """One field of ``message`` as it serialises, alone."""
    part = type(message)()
    copy_field(part, field, value)
    return part.SerializeToString()


def _fixed(data: bytes) -> Piece:
    return len(data), lambda: data


class _RawData:
    """A weight's bytes, read when written (the tensor named, so ``save`` can say where they went)."""

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor

    def __call__(self) -> bytes:
        return self.tensor.raw_data


def _tensor(tensor: Any, number: int) -> list[Piece]:
    """An initializer: its small fields serialised now, its ``raw_data`` read when written."""
    pieces: list[Piece] = []
    for field, value in tensor.ListFields():
        if field.name == "raw_data":
            size = len(value)
            pieces += [_fixed(_header(field.number, size)), (size, _RawData(tensor))]
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

    try:
        from google.protobuf.unknown_fields import UnknownFieldSet  # protobuf >= 4.24
    except ImportError:  # an older protobuf: onnx's own save
        return False
    inits = model.graph.initializer
    return (not any(t.data_location == onnx.TensorProto.EXTERNAL for t in inits)
            and not any(len(UnknownFieldSet(m)) for m in (model, model.graph, *inits)))


def save(model: Any, path: Path) -> dict[str, tuple[int, int]]:
    """``model`` (see ``streamable``) to ``path``; where each initializer's ``raw_data`` lies in the file (name ->
    offset, length)."""
    with open(path, "wb") as out:
        return _write(_pieces(model), out)


def _write(pieces: Iterator[Piece], out: BinaryIO) -> dict[str, tuple[int, int]]:
    placed, at = {}, 0
    for size, data in pieces:
        chunk = data()
        if len(chunk) != size:  # a weight changed while written: nothing sensible to leave
            raise RuntimeError("the graph changed while it was written")
        out.write(chunk)
        tensor = getattr(data, "tensor", None)
        if tensor is not None:
            placed[tensor.name] = (at, size)
        at += size
    return placed


def referring_to(model: Any, path: Path, placed: dict[str, tuple[int, int]]) -> Any:
    """A copy of ``model`` whose weights of ``WEIGHT_BYTES`` or more are external data at their bytes in ``path``
    (the file ``save`` wrote them to, ``placed`` its answer), the rest as they are: what stays in memory of a
    written graph. Stages after write read the graph's structure; a value they need is read from the file
    (validators/parity.py:written_graph), so the weights are not held beside onnxruntime's copy while parity runs
    (ViT-small's peak RSS at its batch-16 set: 845-1012 -> 808-811 MiB). The location is the file's full path: onnx's
    own readers refuse it (they resolve a relative one against the working directory, where another model.onnx
    may lie), so a plugin reading a weight another way fails loudly rather than reading other bytes."""
    import onnx

    slim = type(model)()
    for field, value in model.ListFields():
        if field.name != "graph":
            copy_field(slim, field, value)
    for field, value in model.graph.ListFields():
        if field.name != "initializer":
            copy_field(slim.graph, field, value)
            continue
        for tensor in value:
            where = placed.get(tensor.name)
            if where is None or where[1] < WEIGHT_BYTES or not tensor.HasField("raw_data"):
                slim.graph.initializer.add().CopyFrom(tensor)
                continue
            kept = slim.graph.initializer.add()
            for part in tensor.DESCRIPTOR.fields:  # its bytes never read: each read of raw_data copies them
                if part.name == "raw_data":
                    continue
                content = getattr(tensor, part.name)
                if (len(content) if _repeated(part) else tensor.HasField(part.name)):
                    copy_field(kept, part, content)
            kept.data_location = onnx.TensorProto.EXTERNAL
            for key, text in (("location", str(path.resolve())), ("offset", str(where[0])), ("length", str(where[1]))):
                entry = kept.external_data.add()
                entry.key, entry.value = key, text
    return slim


def _read_varint(f: BinaryIO) -> int | None:
    shift = value = 0
    while True:
        b = f.read(1)
        if not b:
            if shift:
                raise ValueError("an ONNX file cut short inside a varint")
            return None
        value |= (b[0] & 0x7F) << shift
        if not b[0] & 0x80:
            return value
        shift += 7


def _exact(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise ValueError("an ONNX file cut short")
    return data


def _fields(f: BinaryIO, end: int) -> Iterator[tuple[int, bytes, int]]:
    """(field number, the field's raw header bytes, content length or -1) for each field up to offset ``end``;
    a length-delimited field's content is left for the caller to read, any other is in the header bytes."""
    while f.tell() < end:
        start = f.tell()
        tag = _read_varint(f)
        if tag is None:
            return
        wire = tag & 7
        if wire == 2:
            size = _read_varint(f)
            if size is None:
                raise ValueError("an ONNX file cut short")
            yield tag >> 3, b"", size
            continue
        if wire == 0:
            _read_varint(f)
        elif wire in (1, 5):
            f.seek(8 if wire == 1 else 4, 1)
        else:
            raise ValueError(f"an ONNX file with wire type {wire}")
        here = f.tell()
        f.seek(start)
        yield tag >> 3, _exact(f, here - start), -1


def load(path: Path, weights: bool = True, external_data: bool = True,
         divert: Callable[[Any], bool] | None = None) -> Any:
    """The ModelProto in ``path`` as ``onnx.load`` reads it (external data included unless not
    ``external_data``), parsed one weight at a time: ``onnx.load`` holds the file's bytes and the parsed graph at
    once (two copies of every weight). ``weights=False``: the graph without its main graph's initializers'
    ``raw_data`` (their bytes are skipped, never read) and without external data, for the checks that read a graph's
    interface, ops and metadata, and its weights' names, types and shapes. ``divert``: called with each weight as it
    is read; one it took (True) stays in the model as its name, type and dims alone (its bytes are the caller's)."""
    import os

    from onnx.external_data_helper import load_external_data_for_model, uses_external_data

    with open(path, "rb") as f:
        model = _parsed(f, os.fstat(f.fileno()).st_size, weights, divert)
    if weights and external_data and any(uses_external_data(t) for t in model.graph.initializer):
        load_external_data_for_model(model, os.path.dirname(str(path)))
    return model


def load_bytes(data: bytes, lengths: dict[str, int], kept_below: int = 0) -> Any:
    """The ModelProto serialised in ``data`` without its main graph's initializers' ``raw_data`` of ``kept_below``
    bytes or more (as ``load`` with ``weights=False``; the bytes are skipped, never copied); ``lengths`` gets each
    left-out ``raw_data``'s byte count by the initializer's name."""
    import io

    return _parsed(io.BytesIO(data), len(data), False, None, lengths, kept_below)


def _parsed(f: BinaryIO, size: int, weights: bool, divert: Callable[[Any], bool] | None,
            lengths: dict[str, int] | None = None, kept_below: int = 0) -> Any:
    import onnx

    model, rest, graph_rest = onnx.ModelProto(), bytearray(), bytearray()
    for number, raw, length in _fields(f, size):
        if number != 7 or length < 0:  # not the graph: kept as it is in the file
            rest += raw if length < 0 else _header(number, length) + _exact(f, length)
            continue
        end = f.tell() + length
        for inner, inner_raw, inner_length in _fields(f, end):
            if inner == 5 and inner_length >= 0 and not weights:
                skipped: list[int] = []
                tensor = model.graph.initializer.add()
                tensor.ParseFromString(_without_raw_data(f, f.tell() + inner_length, skipped, kept_below))
                if lengths is not None and skipped:
                    lengths[tensor.name] = skipped[-1]
            elif inner == 5 and inner_length >= 0 and divert is not None:
                _diverted(model.graph.initializer.add(), _exact(f, inner_length), divert)
            elif inner == 5 and inner_length >= 0:
                model.graph.initializer.add().ParseFromString(_exact(f, inner_length))
            else:
                graph_rest += (inner_raw if inner_length < 0 else
                               _header(inner, inner_length) + _exact(f, inner_length))
        model.graph.MergeFromString(bytes(graph_rest))
        graph_rest.clear()
    model.MergeFromString(bytes(rest))
    return model


_RAW_DATA = 9  # TensorProto.raw_data's field number


def _without_raw_data(f: BinaryIO, end: int, skipped: list[int] | None = None, kept_below: int = 0) -> bytes:
    """A TensorProto's bytes up to ``end`` with its ``raw_data`` field of ``kept_below`` bytes or more left out
    (skipped over, not read; its length appended to ``skipped``)."""
    kept = bytearray()
    for number, raw, length in _fields(f, end):
        if length < 0:
            kept += raw
        elif f.tell() + length > end:
            raise ValueError("an ONNX file with a tensor field past its tensor")
        elif number == _RAW_DATA and length >= kept_below:
            f.seek(length, 1)
            if skipped is not None:
                skipped.append(length)
        else:
            kept += _header(number, length) + _exact(f, length)
    if f.tell() != end:
        raise ValueError("an ONNX file with a tensor cut short")
    return bytes(kept)


def _diverted(target: Any, data: bytes, divert: Callable[[Any], bool]) -> None:
    """The weight in ``data`` into ``target``, or only its name, type and dims when ``divert`` took it (a protobuf
    message frees a cleared field's bytes only with the whole message: the weight is parsed on its own)."""
    import onnx

    tensor = onnx.TensorProto()
    tensor.ParseFromString(data)
    if not divert(tensor):
        target.CopyFrom(tensor)
        return
    target.name, target.data_type = tensor.name, tensor.data_type
    target.dims.extend(tensor.dims)
