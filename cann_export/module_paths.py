"""Which PyTorch module each ONNX node came from, so findings can name ``encoder.layer.1.output.LayerNorm``.

Exporters stamp ``cann_export.module`` on each node right after capture (dynamo: from torch's
``pkg.torch.onnx.name_scopes``; TorchScript: from the scoped node name). onnxsim drops node metadata,
so the capture stage keeps the mapping by node name and the annotate stage stamps it again.
"""
from __future__ import annotations

import ast
from typing import Any

KEY = "cann_export.module"


def _from_name_scopes(value: str) -> str | None:
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
        if parts and seg.startswith(parts[-1].rsplit(".", 1)[-1] + ".") and "." not in parts[-1]:
            parts[-1] = seg
        elif parts and seg.startswith(parts[-1] + "."):
            parts[-1] = seg
        else:
            parts.append(seg)
    return ".".join(parts)


def stamp_from_exporter(model: Any, strip_prefix: str | None = None) -> None:
    """Write ``cann_export.module`` on every node whose origin the exporter recorded."""
    for node in model.graph.node:
        props = {p.key: p.value for p in node.metadata_props}
        if KEY in props:
            continue
        path = None
        if "pkg.torch.onnx.name_scopes" in props:
            path = _from_name_scopes(props["pkg.torch.onnx.name_scopes"])
        if path is None:
            path = _from_scoped_name(node.name, strip_prefix)
        if path is not None:
            node.metadata_props.add(key=KEY, value=path)


def collect(model: Any) -> dict[str, str]:
    """``{node name: module path}`` from the stamps."""
    out = {}
    for node in model.graph.node:
        for p in node.metadata_props:
            if p.key == KEY and node.name:
                out[node.name] = p.value
    return out


def stamp(model: Any, mapping: dict[str, str]) -> None:
    """Stamp a mapping kept by node name back onto the graph (after passes that drop metadata)."""
    for node in model.graph.node:
        if node.name in mapping and not any(p.key == KEY for p in node.metadata_props):
            node.metadata_props.add(key=KEY, value=mapping[node.name])


def describe(node: Any, mapping: dict[str, str] | None = None) -> str:
    """``module.path (OpType)`` or ``node name (OpType)`` when the origin is unknown."""
    path = (mapping or {}).get(node.name)
    if path is None:
        path = next((p.value for p in node.metadata_props if p.key == KEY), None)
    where = path if path else (f"<root> {node.name}" if path == "" else node.name or "<unnamed>")
    return f"{where} ({node.op_type})"
