"""Which PyTorch module each ONNX node came from, so findings can name ``encoder.layer.1.output.LayerNorm``.

Exporters stamp ``cann_export.module`` on each node right after capture (dynamo: from torch's
``pkg.torch.onnx.name_scopes``; TorchScript: from the scoped node name). onnxsim drops node metadata,
so the capture stage keeps the mapping by node name and the annotate stage stamps it again.
"""
from __future__ import annotations

import ast
import os
import re
from typing import Any

KEY = "cann_export.module"
SOURCE = "cann_export.source"  # "file.py:LINE" of the innermost frame outside torch (dynamo's stack_trace)
FOLDED = "cann_export.folded"  # module path of a BatchNorm folded into this Conv/Gemm
ROOT = "cann_export.root"  # class of the root module, for ops that belong to no submodule


def from_name_scopes(value: str) -> str | None:
    try:
        scopes = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return None
    # [..., module path, fx node name]: the module is the second to last entry ("" is the root module)
    return scopes[-2] if isinstance(scopes, list) and len(scopes) >= 2 else None


def _from_scoped_name(name: str, strip_prefix: str | None) -> str | None:
    if not name.startswith("/"):
        return None
    segments = name.strip("/").split("/")[:-1]  # the last part is the op
    if strip_prefix and segments and segments[0] == strip_prefix:
        segments = segments[1:]
    parts: list[str] = []
    for seg in segments:  # a Sequential's child is scoped "stem/stem.0": the child repeats its parent's name
        if (parts and seg.startswith(parts[-1].rsplit(".", 1)[-1] + ".") and "." not in parts[-1]
                or parts and seg.startswith(parts[-1] + ".")):
            parts[-1] = seg
        else:
            parts.append(seg)
    return ".".join(parts)


def _source_line(stack_trace: str) -> str | None:
    """The innermost ``File "...", line N`` frame that is model code, not torch's own."""
    frames = re.findall(r'File "([^"]+)", line (\d+)', stack_trace)
    outside = [(f, n) for f, n in frames if f"{os.sep}torch{os.sep}" not in f]
    if not outside:
        return None
    file, line = outside[-1]
    return f"{_short(file)}:{line}"


def _short(file: str) -> str:
    """A path relative to site-packages when it is an installed library; else the path as recorded."""
    marker = f"site-packages{os.sep}"
    return file.split(marker, 1)[1] if marker in file else file


def _root_class(value: str) -> str | None:
    try:
        classes = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return None
    return classes[0].rsplit(".", 1)[-1] if isinstance(classes, list) and classes else None


def stamp_from_exporter(model: Any, strip_prefix: str | None = None) -> None:
    """Write ``cann_export.module`` (and the source line, where recorded) on every node whose origin the
    exporter recorded."""
    for node in model.graph.node:
        props = {p.key: p.value for p in node.metadata_props}
        if SOURCE not in props and "pkg.torch.onnx.stack_trace" in props:
            line = _source_line(props["pkg.torch.onnx.stack_trace"])
            if line:
                node.metadata_props.add(key=SOURCE, value=line)
        if ROOT not in props and "pkg.torch.onnx.class_hierarchy" in props:
            root = _root_class(props["pkg.torch.onnx.class_hierarchy"])
            if root:
                node.metadata_props.add(key=ROOT, value=root)
        if KEY in props:
            continue
        path = None
        if "pkg.torch.onnx.name_scopes" in props:
            path = from_name_scopes(props["pkg.torch.onnx.name_scopes"])
        if path is None:
            path = _from_scoped_name(node.name, strip_prefix)
        if path is not None:
            node.metadata_props.add(key=KEY, value=path)


def collect(model: Any, key: str = KEY) -> dict[str, str]:
    """``{node name: module path}`` from the stamps (``key=SOURCE`` / ``FOLDED`` / ``ROOT``: those stamps)."""
    out = {}
    for node in model.graph.node:
        for p in node.metadata_props:
            if p.key == key and node.name:
                out[node.name] = p.value
    return out


def collect_origins(model: Any) -> dict[str, dict[str, str]]:
    """``{key: {node name: value}}`` for every stamp, to carry across passes that drop node metadata."""
    return {key: collect(model, key) for key in (KEY, SOURCE, FOLDED, ROOT)}


def stamp(model: Any, mapping: dict[str, str], key: str = KEY) -> None:
    """Stamp a mapping kept by node name back onto the graph (after passes that drop metadata)."""
    for node in model.graph.node:
        if node.name in mapping and not any(p.key == key for p in node.metadata_props):
            node.metadata_props.add(key=key, value=mapping[node.name])


def stamp_origins(model: Any, origins: dict[str, dict[str, str]]) -> None:
    for key, mapping in origins.items():
        stamp(model, mapping, key)


def describe(node: Any, mapping: dict[str, str] | None = None) -> str:
    """``module.path (OpType) at file.py:LINE``; a Conv with a folded BatchNorm names both; an op of no
    submodule names the root class and the node; ``node name (OpType)`` when the origin is unknown."""
    props = {p.key: p.value for p in node.metadata_props}
    path = (mapping or {}).get(node.name, props.get(KEY))
    if path:
        where = path
    elif path == "":
        where = f"{props.get(ROOT, '<root>')}.forward {node.name}"
    else:
        where = node.name or "<unnamed>"
    op = f"{node.op_type} + folded {props[FOLDED]}" if FOLDED in props else node.op_type
    line = f" at {props[SOURCE]}" if SOURCE in props else ""
    return f"{where} ({op}){line}"


_FOLDABLE = ("Conv", "ConvTranspose", "Gemm")
_ORIGIN_KEYS = ("pkg.torch.onnx.name_scopes", "pkg.torch.onnx.stack_trace", "pkg.torch.onnx.class_hierarchy",
                KEY, SOURCE, ROOT)


def remember_folds(graph: Any) -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    """Before a BatchNorm-folding rewrite of an onnx_ir graph: ``{BN output: (conv's metadata, BN's)}``."""
    folds = {}
    for node in graph:
        producer = node.inputs[0].producer() if node.op_type == "BatchNormalization" and node.inputs else None
        if producer is not None and producer.op_type in _FOLDABLE:
            folds[node.outputs[0].name] = (dict(producer.metadata_props), dict(node.metadata_props))
    return folds


def restore_folds(graph: Any, folds: dict[str, tuple[dict[str, str], dict[str, str]]]) -> int:
    """After the rewrite: the fused Conv/Gemm (onnxscript keeps the BN's metadata on it) gets the Conv's origin
    back and names the BatchNorm it absorbed. Returns how many nodes were renamed."""
    count = 0
    for node in graph:
        if node.op_type not in _FOLDABLE or not node.outputs or node.outputs[0].name not in folds:
            continue
        conv, bn = folds[node.outputs[0].name]
        for key in _ORIGIN_KEYS:
            if key in conv:
                node.metadata_props[key] = conv[key]
            else:
                node.metadata_props.pop(key, None)
        bn_path = bn.get(KEY) or from_name_scopes(bn.get("pkg.torch.onnx.name_scopes", ""))
        if bn_path:
            node.metadata_props[FOLDED] = bn_path
        count += 1
    return count
