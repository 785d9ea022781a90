"""``--fix-lint``: the per-op traps (atc/op_traps.py) whose fix is mechanical and value-preserving, applied to the
graph before it is written, so parity (fp32 and the device verdict) judges the fixed graph.

Fixed (each a graph onnxruntime runs, computing the same values):
- ``empty-slice-concat``: a Slice whose output is statically empty along the Concat's axis adds nothing to it; the
  Concat input is dropped (when another input is left), and the Slice with whatever fed only it goes.
- ``avgpool-ksize``: an AveragePool whose window covers its whole static spatial input (no padding, no dilation)
  computes the global mean: it becomes GlobalAveragePool. A window wider than the input counts when ``ceil_mode``
  is set and the output is 1 per axis (transformers' EfficientNet pooler): onnxruntime and PyTorch clip the window
  to the input and divide by the input's size, with ``count_include_pad`` either way (nothing is padded).
- ``reflect-pad`` of a rank > 4 tensor padding its last two axes only, at a static shape: the leading axes are merged
  by a Reshape to rank 4 (what ATC's PadV3 reflect kernel takes), padded, and reshaped back.

Not fixed (``NOT_FIXED`` says why, in the finding's own words): TopK's int64 K, the other traps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from . import op_traps
from .findings import DEFAULT_DOMAINS

NOT_FIXED = {
    "topk-int64": "ONNX's TopK takes an int64 K only, so msit's cast of K to int32 is not a graph onnxruntime (or "
                  "parity) can run, and a graph for ATC alone would be one nothing here checks",
}
UNMET = {  # a finding of a fixed rule that stays: the fix's condition it misses
    "empty-slice-concat": "the Slice is not statically empty along the Concat's axis, or no other Concat input is left",
    "avgpool-ksize": "the window does not cover the whole static input without padding (only a global pool is a "
                     "GlobalAveragePool; two smaller pools would not compute the same values)",
    "reflect-pad": "a leading axis is padded, the shape or pads are not static, or the Pad has an axes input",
}
FIX_TAG = "_fix_lint"  # the suffix of the names a fix adds (new nodes, initializers)


def fix_graph(model: Any, module_paths: dict[str, str]) -> list[dict[str, Any]]:
    """Apply every fix that applies to ``model`` (an onnx.ModelProto, changed in place); one record per fix:
    ``{"rule", "node", "module", "before", "after"}``. Nodes inside If/Loop/Scan bodies are left as they are."""
    shapes, _types = op_traps._static_info(model)
    graph = Graph(model, shapes, op_traps._constants(model), {out: n for n in model.graph.node for out in n.output})
    fixes: list[dict[str, Any]] = []
    ordered: list[Any] = []  # the graph's nodes with the ones a fix adds around a node
    for node in model.graph.node:
        around: tuple[list[Any], list[Any]] = ([], [])
        fix = _fix_node(graph, node, around) if node.domain in DEFAULT_DOMAINS else None
        ordered.extend([*around[0], node, *around[1]])
        if fix is not None:
            fixes.append({"rule": fix.pop("rule"), "node": node.name, "module": module_paths.get(node.name), **fix})
    if len(ordered) != len(model.graph.node):  # a fix added nodes: the graph's order with them in place
        copies = [type(n)() for n in ordered]
        for copy, n in zip(copies, ordered, strict=True):
            copy.CopyFrom(n)
        del model.graph.node[:]
        model.graph.node.extend(copies)
    if graph.unlinked:
        from ..graph.onnx_helpers import prune_initializers

        prune_initializers(model)  # onnx_ir's RemoveUnusedNodesPass: the Slices (and what fed only them) go
    return fixes


@dataclass
class Graph:
    """What the fixes read of the graph: the model, static shapes, small int64 constants, each value's producer,
    and the values a fix stopped reading."""

    model: Any
    shapes: dict[str, list[int | None]]
    consts: dict[str, Any]
    producers: dict[str, Any]
    unlinked: list[str] = field(default_factory=list)


def _fix_node(graph: Graph, node: Any, around: tuple[list[Any], list[Any]]) -> dict[str, Any] | None:
    if node.op_type == "Concat":
        return _drop_empty_slices(graph, node)
    if node.op_type == "AveragePool":
        return _global_avgpool(node, graph.shapes)
    if node.op_type == "Pad":
        return _reflect_pad_rank4(graph, node, around)
    return None


def _drop_empty_slices(graph: Graph, node: Any) -> dict[str, Any] | None:
    producers = graph.producers
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    empty = []
    for name in node.input:
        dims = graph.shapes.get(name)
        source = producers.get(name)
        if not dims or source is None or source.op_type != "Slice":
            continue
        if dims[axis % len(dims)] == 0:
            empty.append(name)
    kept = [name for name in node.input if name not in empty]
    if not empty or not kept:
        return None
    before = list(node.input)
    del node.input[:]
    node.input.extend(kept)
    graph.unlinked.extend(empty)
    return {"rule": "empty-slice-concat",
            "before": {"op": "Concat", "inputs": before, "axis": axis},
            "after": {"op": "Concat", "inputs": kept, "axis": axis,
                      "removed": [producers[name].name for name in empty]}}


def _global_avgpool(node: Any, shapes: dict[str, list[int | None]]) -> dict[str, Any] | None:
    attrs = {a.name: a for a in node.attribute}
    kernel = op_traps._ints(attrs.get("kernel_shape"))
    if not any(k > op_traps.AVGPOOL_MAX_KSIZE for k in kernel):
        return None  # no trap here
    dims = shapes.get(node.input[0]) if node.input else None
    if not dims or len(dims) != len(kernel) + 2 or any(d is None or d <= 0 for d in dims[2:]):
        return None
    pads = op_traps._ints(attrs.get("pads"))
    dilations = op_traps._ints(attrs.get("dilations"))
    strides = op_traps._ints(attrs.get("strides")) or [1] * len(kernel)
    auto_pad = attrs["auto_pad"].s if "auto_pad" in attrs else b"NOTSET"
    ceil_mode = attrs["ceil_mode"].i if "ceil_mode" in attrs else 0
    if any(pads) or any(d != 1 for d in dilations) or auto_pad not in (b"NOTSET", b"VALID"):
        return None
    for k, side, stride in zip(kernel, dims[2:], strides, strict=True):
        wider = k > side and ceil_mode and math.ceil((side - k) / stride) + 1 == 1
        if k != side and not wider:
            return None
    before = {"op": "AveragePool", "input_shape": dims,
              **{a.name: _attr_value(a) for a in node.attribute}}
    node.op_type = "GlobalAveragePool"
    del node.attribute[:]
    return {"rule": "avgpool-ksize", "before": before, "after": {"op": "GlobalAveragePool"}}


def _reflect_pad_rank4(graph: Graph, node: Any, around: tuple[list[Any], list[Any]]) -> dict[str, Any] | None:
    from onnx import helper

    attrs = {a.name: a for a in node.attribute}
    if "mode" not in attrs or attrs["mode"].s != b"reflect" or len(node.input) < 2 or len(node.input) > 3:
        return None  # a Pad with an axes input (opset 18) is left as it is
    dims = graph.shapes.get(node.input[0])
    pads = graph.consts.get(node.input[1])
    if not dims or len(dims) <= 4 or any(d is None for d in dims) or pads is None or len(pads) != 2 * len(dims):
        return None
    rank = len(dims)
    if any(pads[axis] or pads[axis + rank] for axis in range(rank - 2)):
        return None  # a leading axis is padded: merging it away would change the values
    merged = [math.prod(dims[:rank - 3]), dims[rank - 3], dims[rank - 2], dims[rank - 1]]
    padded = [*dims[:rank - 2], dims[-2] + pads[rank - 2] + pads[-2], dims[-1] + pads[rank - 1] + pads[-1]]
    pads4 = [0, 0, pads[rank - 2], pads[rank - 1], 0, 0, pads[-2], pads[-1]]
    base = f"{node.name or node.output[0]}{FIX_TAG}"
    for suffix, values in (("_shape4", merged), ("_pads4", pads4), ("_shape", padded)):
        _add_int64(graph.model, base + suffix, values)
    into = helper.make_node("Reshape", [node.input[0], f"{base}_shape4"], [f"{base}_in"], name=f"{base}_in")
    back = helper.make_node("Reshape", [f"{base}_out", f"{base}_shape"], [node.output[0]], name=f"{base}_out")
    for added in (into, back):
        added.metadata_props.extend(node.metadata_props)  # the pad's PyTorch module and source line
    before = {"op": "Pad", "mode": "reflect", "input_shape": dims, "pads": pads}
    node.input[0], node.input[1] = f"{base}_in", f"{base}_pads4"
    node.output[0] = f"{base}_out"
    around[0].append(into)
    around[1].append(back)
    return {"rule": "reflect-pad", "before": before,
            "after": {"op": "Reshape -> Pad -> Reshape", "pad_input_shape": merged, "pads": pads4}}


def _add_int64(model: Any, name: str, values: list[int]) -> None:
    import numpy as np
    from onnx import numpy_helper

    model.graph.initializer.append(numpy_helper.from_array(np.array(values, dtype=np.int64), name))


def _attr_value(attr: Any) -> Any:
    from onnx import helper

    value = helper.get_attribute_value(attr)
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


FIXED_RULES = ("empty-slice-concat", "avgpool-ksize", "reflect-pad")


def fixed_lint(ctx: Any, lint: Any) -> dict[str, Any]:
    """``--fix-lint`` in the lint stage: lint, fix what applies in ``ctx.onnx_model`` (the graph the write stage
    writes and parity then judges), lint the fixed graph. The report is the fixed graph's (what validate re-derives)
    with ``fixes`` (each fix) and ``not_fixed`` (each finding of a rule that has a fix elsewhere but not here, and
    why)."""
    report = lint()
    rules = {f["rule"] for f in report["findings"]}
    if rules & set(FIXED_RULES):
        if ctx.large_graph is not None:
            report["fix_lint"] = ("not applied: the graph lives on disk (weights past external_data_threshold), "
                                  "and the fixes rewrite the graph in memory")
        elif fixes := fix_graph(ctx.onnx_model, ctx.module_paths):
            report = lint()
            report["fixes"] = fixes
    reasons = {**NOT_FIXED, **UNMET}
    not_fixed = [{"rule": f["rule"], "node": f["node"], "reason": reasons[f["rule"]]}
                 for f in report["findings"] if f["rule"] in reasons]
    if not_fixed:
        report["not_fixed"] = not_fixed
    return report
