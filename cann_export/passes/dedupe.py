"""Tied and repeated weights stored once. torch.onnx writes a tied weight once per use: a decoder's LM head shares
the token embedding (``Gather`` of ``wte``, ``MatMul`` with ``wte`` transposed), and the exporter's constant folding
makes the transposed use a second initializer (GPT-2 small: 154 MB of its 650 MB graph). An initializer equal to
another (dtype, shape, bytes) is replaced by it; one equal to another's transpose becomes a ``Transpose`` of it, as
Optimum's ``_deduplicate_gather_matmul`` does (onnxruntime folds or fuses it when it builds a session; ATC folds
constant Transposes). The one a ``Gather`` reads is the one kept. Only main-graph initializers held in the graph
(``raw_data``), of at least ``MIN_BYTES``, neither graph inputs nor outputs nor read inside a subgraph, take part.

``hidden`` weights: onnxsim would fold the new ``Transpose`` back into a copy, so the optimize stage hands onnxsim
the graph with each transposed weight as a graph input (``hide``) and puts it back afterwards (``restore``)."""
from __future__ import annotations

from typing import Any

MIN_BYTES = 1 << 16  # smaller initializers are not worth comparing
SAMPLE = 64  # elements compared before the whole tensor
_BLOCK = 1 << 18  # bytes of a transposed pair's mate compared at a time (cache-sized)


class DedupeInitializersPass:
    """The optimize stage's initializer dedupe, before onnxsim (which then runs on the smaller graph). A graph
    whose weights are on disk (the large-graph path) is left as it is: its weights are the module's own."""

    name = "dedupe-initializers"
    order = 60

    def apply_graph(self, model: Any, ctx: Any) -> Any:
        from ..capture import large_graph

        if large_graph.state(ctx) is None:
            record = dedupe(model)
            if record["replaced"]:
                ctx.optimize["initializers_deduplicated"] = record
        return model


def dedupe(model: Any) -> dict[str, Any]:
    """Deduplicate ``model``'s main-graph initializers in place; the record (which were replaced, bytes saved,
    and ``transposed``: the kept names a new Transpose reads)."""
    graph = model.graph
    candidates = _candidates(graph)
    by_shape: dict[tuple[int, tuple[int, ...]], list[Any]] = {}
    for t in candidates:
        by_shape.setdefault((t.data_type, tuple(t.dims)), []).append(t)
    gathered = {n.input[0] for n in graph.node if n.op_type == "Gather" and n.domain in ("", "ai.onnx")}
    replaced: dict[str, tuple[str, bool]] = {}  # removed name -> (kept name, transposed)
    paired = {k for k in by_shape if len(k[1]) == 2 and k[1][0] != k[1][1] and (k[0], k[1][::-1]) in by_shape}
    signs = {t.name: _signature(t) for k, group in by_shape.items()  # a lone one of a pair's first shape is signed
             if len(group) > 1 or (k in paired and k[1] > k[1][::-1]) for t in group}  # when compared (one read)
    for group in by_shape.values():  # equal copies first, so no kept tensor is replaced by a transposed pairing later
        if len(group) > 1:
            _same(group, signs, replaced)
    for (dtype, dims), group in by_shape.items():
        if (dtype, dims) in paired and dims < dims[::-1]:  # each pair of transposed groups once
            _transposed([t for t in group if t.name not in replaced],
                        [t for t in by_shape[(dtype, dims[::-1])] if t.name not in replaced], signs, gathered, replaced)
    if not replaced:
        return {"replaced": {}, "bytes_saved": 0, "transposed": []}
    return _rewire(graph, replaced)


def _candidates(graph: Any) -> list[Any]:
    import onnx

    inputs = {i.name for i in graph.input} | {o.name for o in graph.output}
    inner = set()
    for node in graph.node:
        for attr in node.attribute:
            for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                inner |= {x for n in _all_nodes(g) for x in n.input}
    return [t for t in graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL and t.HasField("raw_data")
            and t.name not in inputs and t.name not in inner and _nbytes(t) >= MIN_BYTES]


def _all_nodes(graph: Any) -> list[Any]:
    import onnx

    nodes = list(graph.node)
    for node in graph.node:
        for attr in node.attribute:
            for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                nodes += _all_nodes(g)
    return nodes


def _nbytes(t: Any) -> int:
    n = 1
    for d in t.dims:
        n *= d
    return n * _itemsize(t)


def _itemsize(t: Any) -> int:
    import onnx

    return onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize if t.data_type else 0


def _array(t: Any, data: bytes | None = None) -> Any:
    import numpy as np
    import onnx

    dtype = onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
    return np.frombuffer(t.raw_data if data is None else data, dtype=dtype).reshape(tuple(t.dims))


def _signature(t: Any, data: bytes | None = None) -> tuple[bytes, bytes, bytes]:
    """A few of ``t``'s elements (``data``: its ``raw_data`` already read): its first and last ones, and (2-D) its
    first column and first row (each access to ``raw_data`` copies the tensor, so it is read once here and again
    only for a full comparison)."""
    import numpy as np

    data = t.raw_data if data is None else data
    if len(data) != _nbytes(t):
        return b"", b"", b""
    x = _array(t, data)
    edges = bytes(data[:SAMPLE * 8]) + bytes(data[-SAMPLE * 8:])
    if x.ndim != 2:
        return edges, b"", b""
    return edges, np.ascontiguousarray(x[:SAMPLE, 0]).tobytes(), np.ascontiguousarray(x[0, :SAMPLE]).tobytes()


def _same(group: list[Any], signs: dict[str, tuple[bytes, bytes, bytes]],
          replaced: dict[str, tuple[str, bool]]) -> None:
    """Within one dtype and shape: each initializer equal to an earlier one is replaced by it. Each read of
    ``raw_data`` copies the tensor: the kept one last compared is held, so copies of one tensor read it once."""
    kept: dict[bytes, list[Any]] = {}
    held: list[Any] = [None, b""]  # the kept initializer last read, and its bytes
    for t in group:
        edges = signs[t.name][0]
        if not edges:
            continue
        match = None
        if edges in kept:
            data = t.raw_data
            match = next((k for k in kept[edges] if _held(held, k) == data), None)
        if match is None:
            kept.setdefault(edges, []).append(t)
        else:
            replaced[t.name] = (match.name, False)


def _held(held: list[Any], t: Any) -> bytes:
    if held[0] is not t:
        held[:] = [t, t.raw_data]
    return held[1]


def _transposed(group: list[Any], mates: list[Any], signs: dict[str, tuple[bytes, bytes, bytes]],
                gathered: set[str], replaced: dict[str, tuple[str, bool]]) -> None:
    """Pairs across two 2-D groups of transposed shapes: the one a Gather reads (else the earlier group's) is
    kept, the other replaced by its Transpose. A pair is compared in full only when its sampled first row and
    column agree, and then without a transposed copy (``equal_transposed``). ``group``'s members without a
    signature are signed here, from the bytes a full comparison reuses."""
    for a in group:
        if a.name in replaced:
            continue
        data = None if a.name in signs else a.raw_data  # signed already (it has equal copies), else read once here
        _, col, row = signs[a.name] if data is None else _signature(a, data)
        if not col:
            continue
        for b in mates:
            if b.name in replaced or signs[b.name][2] != col or signs[b.name][1] != row:
                continue
            data = a.raw_data if data is None else data  # read (copied) once, whichever mates it is compared to
            if not equal_transposed(data, b.raw_data, tuple(a.dims), _itemsize(a)):
                continue
            keep, drop = (b, a) if b.name in gathered and a.name not in gathered else (a, b)
            replaced[drop.name] = (keep.name, True)
            break


def equal_transposed(data: bytes, mate: bytes, dims: tuple[int, int], itemsize: int) -> bool:
    """Whether ``mate`` holds exactly the bytes of the ``dims`` matrix ``data`` transposed (-0.0 is not 0.0, a NaN
    is its own bytes): elements compared as unsigned integers of their size, a block of columns at a time."""
    import numpy as np

    rows, cols = dims
    if itemsize <= 0 or len(data) != rows * cols * itemsize or len(mate) != len(data):
        return False
    word = next(w for w in (8, 4, 2, 1) if itemsize % w == 0)
    uint = np.dtype(f"<u{word}")
    x = np.frombuffer(data, uint).reshape(rows, cols, itemsize // word)
    y = np.frombuffer(mate, uint).reshape(cols, rows, itemsize // word)
    step = max(1, _BLOCK // max(1, rows * itemsize))
    return all(np.array_equal(x[:, j:j + step], y[j:j + step].transpose(1, 0, 2)) for j in range(0, cols, step))


def _rewire(graph: Any, replaced: dict[str, tuple[str, bool]]) -> dict[str, Any]:
    """Point every use of a replaced initializer at the kept one (through one new Transpose per transposed kept
    initializer, placed before its first user) and drop the replaced ones."""
    import onnx

    names = ({n for node in graph.node for n in node.output} | {t.name for t in graph.initializer}
             | {i.name for i in graph.input})
    replaced = {r: _final(replaced, r) for r in replaced}
    transposes: dict[str, str] = {}
    for keep, flipped in replaced.values():
        if flipped and keep not in transposes:
            out = f"{keep}_transposed"
            while out in names:
                out += "_"
            names.add(out)
            transposes[keep] = out
    nodes = list(graph.node)
    first_use: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for j, name in enumerate(node.input):
            if name in replaced:
                keep, flipped = replaced[name]
                node.input[j] = transposes[keep] if flipped else keep
                if flipped:
                    first_use.setdefault(keep, i)
    for keep, index in sorted(first_use.items(), key=lambda kv: -kv[1]):
        node = onnx.helper.make_node("Transpose", [keep], [transposes[keep]], name=f"{transposes[keep]}_node",
                                     perm=[1, 0])
        nodes.insert(index, node)
    del graph.node[:]
    graph.node.extend(nodes)  # nodes are small; initializers are deleted in place (extend would copy them)
    saved = sum(_nbytes(t) for t in graph.initializer if t.name in replaced)
    for k in reversed([k for k, t in enumerate(graph.initializer) if t.name in replaced]):
        del graph.initializer[k]
    for k in reversed([k for k, v in enumerate(graph.value_info) if v.name in replaced]):
        del graph.value_info[k]
    return {"replaced": {r: k for r, (k, _) in replaced.items()}, "bytes_saved": saved,
            "transposed": sorted(first_use)}


def _final(replaced: dict[str, tuple[str, bool]], name: str) -> tuple[str, bool]:
    """Where ``name``'s replacement chain ends (the kept initializer) and whether the chain transposes it."""
    keep, flipped = replaced[name]
    seen = {name}
    while keep in replaced and keep not in seen:
        seen.add(keep)
        keep, again = replaced[keep]
        flipped ^= again
    return keep, flipped


def shared_transposed(model: Any) -> list[str]:
    """Initializers of at least ``MIN_BYTES`` that a Transpose reads and another node reads too (a tied weight):
    folded, the Transpose would be a second copy of them beside the first."""
    inputs = {i.name for i in model.graph.input}
    names = {t.name for t in model.graph.initializer if t.HasField("raw_data") and _nbytes(t) >= MIN_BYTES
             and t.name not in inputs and t.data_type in HIDEABLE}
    users: dict[str, set[str]] = {}
    for node in model.graph.node:
        for x in node.input:
            if x in names:
                users.setdefault(x, set()).add(node.op_type if node.domain in ("", "ai.onnx") else "?")
    return sorted(n for n, ops in users.items() if "Transpose" in ops and len(ops) > 1)


HIDEABLE = {1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13}  # TensorProto types numpy holds natively (onnxruntime feeds)


def unfoldable_weights(model: Any, min_bytes: int = MIN_BYTES) -> list[str]:
    """Initializers held in the graph, of at least ``min_bytes`` and a type onnxruntime takes from numpy, that no
    constant-foldable node reads (each reader also reads a value computed from the graph's inputs: a MatMul's or a
    Gather's weight, not a weight-norm's or a cast's), neither graph inputs (overridable) nor read in a subgraph:
    onnxsim needs their shapes, never their bytes."""
    import onnx

    graph = model.graph
    inputs = {i.name for i in graph.input}
    constant = {t.name for t in graph.initializer if t.name not in inputs}
    readers: dict[str, list[bool]] = {}
    for node in graph.node:
        nested = any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)
        folds = not nested and all(x in constant for x in node.input if x)
        if folds:
            constant |= set(node.output)
        for x in node.input:
            readers.setdefault(x, []).append(folds or nested)
    return [t.name for t in graph.initializer
            if t.name in readers and not any(readers[t.name]) and t.name not in inputs
            and t.data_type in HIDEABLE and t.HasField("raw_data") and _nbytes(t) >= min_bytes]


def without(model: Any, names: list[str]) -> Any:
    """A copy of ``model`` with the initializers ``names`` as graph inputs of their type and shape instead (onnxsim
    cannot fold what reads them). Only the rest is copied: ``model`` keeps the weights, nothing holds them twice."""
    import onnx

    wanted = set(names)
    copy = onnx.ModelProto()
    for field, value in model.ListFields():
        if field.name != "graph":
            _copy_field(copy, field, value)
    for field, value in model.graph.ListFields():
        if field.name == "initializer":
            copy.graph.initializer.extend(t for t in value if t.name not in wanted)
        else:
            _copy_field(copy.graph, field, value)
    copy.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                            for t in model.graph.initializer if t.name in wanted)
    return copy


def graft(base: Any, simplified: Any, names: list[str]) -> Any:
    """``simplified`` (a ``without(base, names)`` graph, transformed) with ``base``'s initializers ``names`` put
    back: built in ``base``, whose weights stay where they are (protobuf would copy each one added elsewhere)."""
    wanted = set(names)
    for field, _ in base.ListFields():
        if field.name != "graph":
            base.ClearField(field.name)
    for field, value in simplified.ListFields():
        if field.name != "graph":
            _copy_field(base, field, value)
    graph = base.graph
    for k in reversed([k for k, t in enumerate(graph.initializer) if t.name not in wanted]):
        del graph.initializer[k]
    for field, _ in graph.ListFields():
        if field.name != "initializer":
            graph.ClearField(field.name)
    for field, value in simplified.graph.ListFields():
        if field.name == "input":
            graph.input.extend(i for i in value if i.name not in wanted)
        elif field.name == "initializer":
            graph.initializer.extend(t for t in value if t.name not in wanted)
        else:
            _copy_field(graph, field, value)
    return base


def _copy_field(message: Any, field: Any, value: Any) -> None:
    from ..graph.onnx_stream import copy_field

    copy_field(message, field, value)


def feeds(model: Any, names: list[str]) -> dict[str, Any]:
    """The initializers ``names`` of ``model`` as onnxruntime feeds (each a copy of its bytes)."""
    wanted = set(names)
    return {t.name: _array(t) for t in model.graph.initializer if t.name in wanted}
