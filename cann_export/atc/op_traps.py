"""Per-op traps ATC users hit with graphs its parser takes: each finding names the ATC error code it predicts
(``atc_code``; none where ATC converts the graph and the op only runs slower), the PyTorch module and source line
(``findings.where``) and the fix.

The traps and where they come from:
- TopK: ONNX gives TopK an int64 ``K`` and int64 indices; the Ascend TopK kernel takes int32 (msit surgeon's
  KnowledgeTopkFix casts K to int32 and the indices back to int64 because "ATC didn't handle this correctly in
  some cases"). Predicted: EZ3002 (no kernel for the dtype) or an AI CPU fallback.
- an empty tensor (a Slice whose static output has a 0 dimension) feeding Concat: ATC refuses empty tensors
  (the lint's zero-dim rule for inputs); predicted EZ9999 from the Concat kernel's compile.
- AveragePool with a kernel side over 255: the Ascend IR AvgPool's ksize is limited to [1, 255] per side.
  Predicted EZ3002 (the AI Core kernel refuses it).
- Conv over 1-D data (kernel_shape of length 1): ATC lowers it to Conv2D over (N, C, 1, L) and inserts
  TransData/Reshape around it; it converts, slower (no code).
- Pad with mode ``reflect``: ATC maps it to PadV3, whose AI Core kernel covers the last two axes of a
  rank <= 4 tensor; elsewhere it runs on AI CPU (no code) or, past rank 4, is refused (EZ3002).
- a long int64 shape subgraph (Shape -> Gather -> Unsqueeze -> Concat -> Reshape ... over dynamic dimensions):
  int64 arithmetic runs on AI CPU with a host sync per op; it converts, slower (no code).
- attributes ATC's ONNX parser rejects (``PARSER_REJECTS``): the parse fails, predicted E19999 (ATC's parser
  reports an unsupported attribute value as an inner error).
The codes besides E19010/E10001/E10016 are predictions from CANN's error-code families, not reproduced with an
``atc`` here: the docs say so.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from .findings import DEFAULT_DOMAINS, _Findings, _nodes

INT64 = 7
AVGPOOL_MAX_KSIZE = 255
INT64_SUBGRAPH_MIN = 12  # int64 shape nodes in one connected subgraph before it is worth a finding
SHAPE_OPS = {"Shape", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast", "Add", "Sub", "Mul", "Div",
             "Range", "ConstantOfShape", "Equal", "Where", "Reshape", "Expand", "ReduceProd", "Min", "Max",
             "Size", "Neg", "Mod", "Identity"}
# (op type, attribute, values ATC's parser rejects, the fix)
PARSER_REJECTS = (
    ("Resize", "coordinate_transformation_mode", ("tf_crop_and_resize",),
     "crop first (a Slice), then resize with align_corners or half_pixel"),
    ("Resize", "antialias", (1,), "resize without antialias (F.interpolate(antialias=False)), or blur first"),
    ("Resize", "keep_aspect_ratio_policy", ("not_larger", "not_smaller"),
     "compute the output size in the model and pass sizes (the default 'stretch' policy)"),
    ("Pad", "mode", ("wrap",), "pad with 'constant', 'reflect' or 'edge' (or concatenate slices yourself)"),
    ("ReduceMean", "noop_with_empty_axes", (1,), "pass the axes to reduce explicitly"),
    ("ReduceSum", "noop_with_empty_axes", (1,), "pass the axes to reduce explicitly"),
    ("ReduceMax", "noop_with_empty_axes", (1,), "pass the axes to reduce explicitly"),
    ("ReduceMin", "noop_with_empty_axes", (1,), "pass the axes to reduce explicitly"),
)


def check(model: Any, module_paths: dict[str, str], findings: _Findings) -> None:
    """Add a finding for every per-op trap in ``model`` (an onnx.ModelProto)."""
    shapes, types = _static_info(model)
    consts = _constants(model)
    consumers: dict[str, list[Any]] = defaultdict(list)
    for node in _nodes(model.graph):
        for name in node.input:
            consumers[name].append(node)
    for node in _nodes(model.graph):
        if node.domain not in DEFAULT_DOMAINS:
            continue
        attrs = {a.name: a for a in node.attribute}
        if node.op_type == "TopK":
            _topk(node, module_paths, findings)
        elif node.op_type == "Slice":
            _empty_slice(node, shapes, consumers, module_paths, findings)
        elif node.op_type == "AveragePool":
            _avgpool(node, attrs, module_paths, findings)
        elif node.op_type == "Conv":
            _conv1d(node, attrs, shapes, module_paths, findings)
        elif node.op_type == "Pad":
            _reflect_pad(node, attrs, shapes, consts, module_paths, findings)
        _parser_rejects(node, attrs, module_paths, findings)
    _int64_subgraphs(model, types, module_paths, findings)


def _static_info(model: Any) -> tuple[dict[str, list[int | None]], dict[str, int]]:
    """``({value name: dims (None where unknown)}, {value name: elem type})`` from ONNX shape inference; empty
    when inference fails (a graph over 2 GiB, an op it does not know)."""
    from ..graph.onnx_helpers import inferred_graph

    try:
        graph = inferred_graph(model)
    except Exception:  # noqa: BLE001 - no shapes: the shape-based traps are skipped, the others still run
        graph = model.graph
    shapes: dict[str, list[int | None]] = {}
    types: dict[str, int] = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        t = value.type.tensor_type
        types[value.name] = t.elem_type
        if t.HasField("shape"):
            shapes[value.name] = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
    for init in model.graph.initializer:
        types[init.name] = init.data_type
        shapes[init.name] = list(init.dims)
    return shapes, types


def _topk(node: Any, module_paths: dict[str, str], findings: _Findings) -> None:
    findings.add("warning", "topk-int64",
                 "TopK takes its K as int64 and gives int64 indices (ONNX's only types), while the Ascend TopK "
                 "kernel takes int32: ATC may find no kernel for it (EZ3002) or run it on AI CPU. Fix: cast K to "
                 "int32 before TopK and the indices back to int64 after it, as msit surgeon's KnowledgeTopkFix "
                 "does (torch.topk cannot take int32 itself; --fix-lint does not apply it: ONNX's TopK takes an "
                 "int64 K only, so onnxruntime and parity could not run the cast graph)", node, module_paths,
                 atc_code="EZ3002")


def _empty_slice(node: Any, shapes: dict[str, list[int | None]], consumers: dict[str, list[Any]],
                 module_paths: dict[str, str], findings: _Findings) -> None:
    out = node.output[0] if node.output else ""
    dims = shapes.get(out)
    if not dims or 0 not in dims:
        return
    concat = next((c for c in consumers.get(out, []) if c.op_type == "Concat"), None)
    if concat is None:
        return
    findings.add("error", "empty-slice-concat",
                 f"Slice gives an empty tensor (shape {dims}) that feeds Concat {concat.name!r}: ATC refuses empty "
                 "tensors and the Concat kernel fails to compile (EZ9999). Fix: drop the empty piece in PyTorch "
                 "(skip the torch.cat operand when its length is 0, e.g. a past cache of length 0)",
                 node, module_paths, atc_code="EZ9999")


def _ints(attr: Any) -> list[int]:
    return list(attr.ints) if attr is not None else []


def _avgpool(node: Any, attrs: dict[str, Any], module_paths: dict[str, str], findings: _Findings) -> None:
    kernel = _ints(attrs.get("kernel_shape"))
    if not any(k > AVGPOOL_MAX_KSIZE for k in kernel):
        return
    # a warning, not an error: the refusal is predicted from the AvgPool ksize range, not seen from atc, and the
    # global pools of common architectures (transformers' EfficientNet pooler: kernel = hidden_dim) hit it
    findings.add("warning", "avgpool-ksize",
                 f"AveragePool kernel {kernel} has a side over {AVGPOOL_MAX_KSIZE}, past the Ascend AvgPool's ksize "
                 "range [1, 255] (EZ3002 expected). Fix: use nn.AdaptiveAvgPool2d(1) / x.mean(dim=(-2, -1)) for a "
                 "global pool (ReduceMean), or pool in two smaller steps", node, module_paths, atc_code="EZ3002")


def _conv1d(node: Any, attrs: dict[str, Any], shapes: dict[str, list[int | None]], module_paths: dict[str, str],
            findings: _Findings) -> None:
    kernel = _ints(attrs.get("kernel_shape"))
    rank = len(shapes.get(node.input[0], [])) if node.input else 0
    if len(kernel) != 1 and rank != 3:
        return
    findings.add("info", "conv1d-transdata",
                 "Conv over 1-D data: ATC lowers it to Conv2D over (N, C, 1, L) with TransData/Reshape around it, "
                 "which converts (no error) but moves the data between layouts at each conv. Fix, if it is hot: "
                 "write the block with nn.Conv2d on x.unsqueeze(2) so consecutive convs share one layout",
                 node, module_paths)


def _reflect_pad(node: Any, attrs: dict[str, Any], shapes: dict[str, list[int | None]], consts: dict[str, Any],
                 module_paths: dict[str, str], findings: _Findings) -> None:
    mode = attrs.get("mode")
    if mode is None or mode.s != b"reflect":
        return
    rank = len(shapes.get(node.input[0], [])) if node.input else 0
    if rank > 4:
        findings.add("error", "reflect-pad",
                     f"reflect Pad of a rank-{rank} tensor: ATC's PadV3 reflect kernel covers rank <= 4 (EZ3002). "
                     "Fix: pad with mode='replicate' or 'constant', or reshape to rank 4 around the pad",
                     node, module_paths, atc_code="EZ3002")
        return
    pads = consts.get(node.input[1]) if len(node.input) > 1 else None
    if pads is not None and rank:
        padded = {axis for axis in range(rank) if pads[axis] or pads[axis + rank]}
        if padded <= {rank - 2, rank - 1}:
            return  # the last two axes: what the AI Core kernel pads
    findings.add("warning", "reflect-pad",
                 "reflect Pad over other axes than the last two (or pads not known before run time): ATC's PadV3 "
                 "AI Core kernel pads the last two axes only, the rest runs on AI CPU (converts, slower). Fix: pad "
                 "only the last two axes, or use mode='replicate' where the edge values allow it", node, module_paths)


def _constants(model: Any) -> dict[str, Any]:
    """Small int64 initializers and Constant outputs (pads, axes) as lists: what the traps read."""
    from onnx import numpy_helper

    out: dict[str, Any] = {}
    tensors = [(t.name, t) for t in model.graph.initializer]
    tensors += [(n.output[0], a.t) for n in model.graph.node if n.op_type == "Constant" and n.output
                for a in n.attribute if a.name == "value" and a.HasField("t")]
    for name, tensor in tensors:
        small = len(tensor.dims) <= 1 and (not tensor.dims or tensor.dims[0] <= 64)
        if tensor.data_type == INT64 and small and not tensor.external_data:
            out[name] = numpy_helper.to_array(tensor).reshape(-1).tolist()
    return out


def _parser_rejects(node: Any, attrs: dict[str, Any], module_paths: dict[str, str], findings: _Findings) -> None:
    for op, name, bad, fix in PARSER_REJECTS:
        attr = attrs.get(name)
        if node.op_type != op or attr is None:
            continue
        value = attr.s.decode("utf-8", "replace") if attr.type == attr.STRING else attr.i
        if value in bad:
            findings.add("error", "parser-attribute",
                         f"{op} with {name}={value!r}: ATC's ONNX parser does not take this value and the parse "
                         f"fails (E19999). Fix: {fix}", node, module_paths, atc_code="E19999")


def _int64_subgraphs(model: Any, types: dict[str, int], module_paths: dict[str, str], findings: _Findings) -> None:
    """Connected groups of int64 shape arithmetic grown from Shape nodes; one finding per group over the bound."""
    nodes = [n for n in model.graph.node if n.domain in DEFAULT_DOMAINS]
    producer = {out: n for n in nodes for out in n.output}
    shape_nodes: dict[int, Any] = {}
    for node in nodes:  # graph order is topological: a node joins when an int64 input comes from the group
        int_out = bool(node.output) and types.get(node.output[0]) == INT64
        if node.op_type == "Shape" or (node.op_type in SHAPE_OPS and int_out
                                       and any(id(producer.get(i)) in shape_nodes for i in node.input)):
            shape_nodes[id(node)] = node
    parent = {key: key for key in shape_nodes}

    def root(key: int) -> int:
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    for key, node in shape_nodes.items():
        for name in node.input:
            up = producer.get(name)
            if up is not None and id(up) in shape_nodes:
                parent[root(id(up))] = root(key)
    groups: dict[int, list[Any]] = defaultdict(list)
    for key, node in shape_nodes.items():
        groups[root(key)].append(node)
    for group in groups.values():
        if len(group) < INT64_SUBGRAPH_MIN:
            continue
        first = group[0]
        findings.add("info", "int64-shape-subgraph",
                     f"{len(group)} int64 shape ops (Shape, Gather, Concat, ... over dynamic dimensions) in one "
                     "subgraph: ATC runs int64 arithmetic on AI CPU with a host sync per op (converts, slower). Fix: "
                     "export with static shapes (--input-shape, no dynamic axes) so the optimize stage folds them, "
                     "or compute the shapes from constants in the model", first, module_paths)
