"""ONNX op types in ATC's own vocabulary: the Ascend IR op type ATC's ONNX parser writes for each ONNX node.

keep_dtype / customize_dtypes ``OpType::X`` entries and modify_mixlist lists name Ascend IR types (Conv2D,
MatMulV2, SoftmaxV2 ...), not ONNX ones; ``data/ascend_ir_ops.json`` maps them and records its source. Names of
nodes ATC's graph fusions likely fold into a neighbour (``likely_fused``) may not exist in the built model.
"""
from __future__ import annotations

import json
from functools import lru_cache
from importlib.resources import files
from typing import Any

CUBE = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})  # ops a bias add / activation fuses into
NORM_PIECES = frozenset({"ReduceMean", "Pow", "Sqrt"})  # a decomposed LayerNorm / RMSNorm


@lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    return json.loads(files("cann_export.atc.data").joinpath("ascend_ir_ops.json").read_text(encoding="utf-8"))


def ascend_type(op_type: str, rank: int | None = None, attrs: dict[str, Any] | None = None) -> str:
    """The Ascend IR type of an ONNX node of ``op_type`` (``rank``: its first input's rank, where the parser or
    a fusion picks the type by rank); an ONNX type the table lacks keeps its name."""
    entry = table()["ops"].get(op_type)
    if entry is None:
        return op_type
    if rank is not None and f"rank{rank}" in entry:
        return entry[f"rank{rank}"]
    if attrs and attrs.get("mode") == b"linear" and "linear" in entry:
        return entry["linear"]
    return entry["ascend_ir"]


def ascend_types(op_type: str) -> set[str]:
    """Every Ascend IR type an ONNX op may become."""
    entry = table()["ops"].get(op_type)
    if entry is None:
        return {op_type}
    return {v for k, v in entry.items() if k in ("ascend_ir", "rank2", "rank5", "linear")}


def known_types() -> set[str]:
    """The Ascend IR types this tool knows (the map's targets and the mixed-precision lists' entries)."""
    lists = json.loads(files("cann_export.atc.data").joinpath("mixlists.json").read_text(encoding="utf-8"))
    listed = {t for fam in lists["families"].values() for key in ("white", "black") for t in fam[key]}
    return {t for op in table()["ops"] for t in ascend_types(op)} | listed


def onnx_spelling(entry: str) -> str | None:
    """For an ONNX op type that ATC spells differently, the Ascend IR type(s) to name instead, else None."""
    types = ascend_types(entry) if entry in table()["ops"] else set()
    if not types or entry in types:
        return None
    return " or ".join(sorted(types))


def node_types(model: Any) -> dict[str, str]:
    """Node name -> the Ascend IR type ATC gives it (by its first input's rank where that picks the type)."""
    from ..graph.onnx_helpers import inferred_values

    ranks = {}
    for v in inferred_values(model):
        t = v.type.tensor_type
        if t.HasField("shape"):
            ranks[v.name] = len(t.shape.dim)
    out = {}
    for node in model.graph.node:
        first = ranks.get(node.input[0]) if node.input else None
        second = ranks.get(node.input[1]) if len(node.input) > 1 else None
        rank = first
        if node.op_type == "MatMul":  # MatMulV2 only when both operands are matrices
            rank = 2 if first == 2 and second == 2 else None
        attrs = {a.name: a.s for a in node.attribute if a.type == a.STRING}
        out[node.name] = ascend_type(node.op_type, rank, attrs)
    return out


def likely_fused(model: Any) -> dict[str, str]:
    """Node name -> why ATC's documented fusions likely fold it into a neighbour: a bias Add/Sub or an activation
    right after a cube op, a BatchNorm after a Conv, the pieces of a decomposed norm or of GELU (Erf and the
    elementwise ops beside it), an Identity/Dropout."""
    g = model.graph
    producer = {o: n for n in g.node for o in n.output if o}
    consumers: dict[str, list[Any]] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    consts = {i.name for i in g.initializer} | {o for n in g.node if n.op_type == "Constant" for o in n.output}
    out = {}
    for n in g.node:
        before = [producer[i].op_type for i in n.input if i in producer]
        if n.op_type in ("Add", "Sub") and any(i in consts for i in n.input) and any(b in CUBE for b in before):
            out[n.name] = "a bias add, fused into the cube op before it"
        elif n.op_type == "BatchNormalization" and "Conv" in before:
            out[n.name] = "a BatchNorm, folded into the Conv before it"
        elif n.op_type in ("Relu", "LeakyRelu", "Sigmoid", "Clip") and any(b in CUBE for b in before):
            out[n.name] = "an activation, fused into the cube op before it"
        elif n.op_type in NORM_PIECES:
            out[n.name] = "a piece of a decomposed norm, fused into one norm op"
        elif n.op_type == "Erf" or (n.op_type in ("Div", "Add", "Mul") and (
                "Erf" in before or any(c.op_type == "Erf" for o in n.output for c in consumers.get(o, [])))):
            out[n.name] = "a piece of GELU, fused into one Gelu op"
        elif n.op_type in ("Identity", "Dropout"):
            out[n.name] = "an Identity/Dropout, removed"
    return out
