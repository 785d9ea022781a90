"""Small ONNX graph helpers shared by the stages (imports onnx lazily through callers)."""
from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

_ELEM_TYPE_NAMES = {v: k.lower() for k, v in onnx.TensorProto.DataType.items()}


def opset_of(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 0


def weights_bytes(model: onnx.ModelProto) -> int:
    return sum(len(t.raw_data) or t.ByteSize() for t in model.graph.initializer)


def check_graph(model: onnx.ModelProto, path: Path | None = None) -> None:
    """Full ONNX check plus an onnxruntime load; raises with the checker's/runtime's message."""
    import onnxruntime as ort

    if path is not None:
        onnx.checker.check_model(str(path), full_check=True)
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    else:
        onnx.checker.check_model(model, full_check=True)
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def describe_values(values: Any) -> list[dict[str, Any]]:
    out = []
    for v in values:
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
        out.append({"name": v.name, "shape": dims, "dtype": _ELEM_TYPE_NAMES.get(t.elem_type, str(t.elem_type))})
    return out


def op_histogram(model: onnx.ModelProto) -> dict[str, int]:
    counts = collections.Counter(
        (f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type) for n in model.graph.node)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def set_metadata(model: onnx.ModelProto, items: dict[str, str]) -> None:
    existing = {p.key: p for p in model.metadata_props}
    for key, value in items.items():
        if key in existing:
            existing[key].value = str(value)
        else:
            model.metadata_props.add(key=key, value=str(value))


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    users: dict[str, list[onnx.NodeProto]] = collections.defaultdict(list)
    for node in graph.node:
        for name in node.input:
            users[name].append(node)
    return users


def fold_conv_batchnorm(model: onnx.ModelProto) -> int:
    """Fold each BatchNormalization whose input comes only from a Conv with constant weights.

    W' = W * g / sqrt(var + eps) per output channel; b' = (b - mean) * g / sqrt(var + eps) + beta.
    Returns the number of folded pairs.
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    users = _consumers(graph)
    graph_outputs = {o.name for o in graph.output}
    folded, removed = 0, []
    for bn in list(graph.node):
        if bn.op_type != "BatchNormalization" or len(bn.output) != 1:
            continue
        conv = producers.get(bn.input[0])
        if conv is None or conv.op_type != "Conv" or len(users[conv.output[0]]) != 1 \
                or conv.output[0] in graph_outputs:
            continue
        if not all(n in inits for n in bn.input[1:5]) or conv.input[1] not in inits:
            continue
        if len(conv.input) > 2 and conv.input[2] and conv.input[2] not in inits:
            continue
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        scale, beta, mean, var = (numpy_helper.to_array(inits[n]).astype(np.float64) for n in bn.input[1:5])
        w_init = inits[conv.input[1]]
        w = numpy_helper.to_array(w_init)
        factor = scale / np.sqrt(var + eps)
        has_bias = len(conv.input) > 2 and bool(conv.input[2])
        b = numpy_helper.to_array(inits[conv.input[2]]).astype(np.float64) if has_bias else np.zeros_like(mean)
        new_w = (w.astype(np.float64) * factor.reshape(-1, *([1] * (w.ndim - 1)))).astype(w.dtype)
        new_b = ((b - mean) * factor + beta).astype(w.dtype)
        # Weights may be shared with another Conv: write fresh initializers instead of editing in place.
        w_name, b_name = f"{conv.name or conv.output[0]}_bnfold_W", f"{conv.name or conv.output[0]}_bnfold_B"
        graph.initializer.extend([numpy_helper.from_array(new_w, w_name), numpy_helper.from_array(new_b, b_name)])
        del conv.input[1:]
        conv.input.extend([w_name, b_name])
        conv.output[0] = bn.output[0]
        removed.append(bn)
        folded += 1
    for node in removed:
        graph.node.remove(node)
    if folded:
        prune_initializers(model)
    return folded


def remove_identities(model: onnx.ModelProto) -> int:
    """Bypass Identity nodes that do not produce a graph output."""
    graph = model.graph
    graph_outputs = {o.name for o in graph.output}
    removed = 0
    for node in list(graph.node):
        if node.op_type != "Identity" or node.output[0] in graph_outputs:
            continue
        src, dst = node.input[0], node.output[0]
        for other in graph.node:
            for i, name in enumerate(other.input):
                if name == dst:
                    other.input[i] = src
        graph.node.remove(node)
        removed += 1
    return removed


def prune_initializers(model: onnx.ModelProto) -> None:
    used = {name for node in model.graph.node for name in node.input} | {o.name for o in model.graph.output}
    keep = [t for t in model.graph.initializer if t.name in used]
    if len(keep) != len(model.graph.initializer):
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)


def save_model(model: onnx.ModelProto, path: Path, external: bool) -> list[Path]:
    """Save a graph; with ``external`` the weights go to ``<name>.data`` beside it."""
    if external:
        data_name = path.name + ".data"
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_name, size_threshold=1024)
        return [path, path.with_name(data_name)]
    onnx.save_model(model, str(path))
    return [path]
