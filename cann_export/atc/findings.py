"""Lint findings and graph walking shared by the ATC lint (``lint``) and AMCT's rules (``amct``): each finding
names the ONNX node and the PyTorch module it came from."""
from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ..graph import module_paths as mp

DEFAULT_DOMAINS = ("", "ai.onnx")
QDQ = ("QuantizeLinear", "DequantizeLinear")
ATC_CODE = re.compile(r"\b(E[0-9A-Z]\d{4})\b")  # E19010, E10001, EZ3002 ... as ATC prints them


class _Findings(list):
    def add(self, severity: str, rule: str, message: str, node: Any = None, module_paths: dict | None = None,
            op_type: str | None = None, atc_code: str | None = None) -> None:
        """One finding; ``atc_code`` is the error code ATC is predicted to give (default: the first one the
        message names, as ``(E10001)``), absent where ATC converts the graph and only runs it slower."""
        code = atc_code or next(iter(ATC_CODE.findall(message)), None)
        module = None
        if node is not None:
            module = (module_paths or {}).get(node.name)
            if module is None:
                module = next((p.value for p in node.metadata_props if p.key == mp.KEY), None)
            message = f"{where(node, module_paths)}: {message}"
        source = next((p.value for p in node.metadata_props if p.key == mp.SOURCE), None) if node is not None else None
        self.append({"severity": severity, "rule": rule, "node": node.name if node is not None else None,
                     "module": module, "op_type": op_type or (node.op_type if node is not None else None),
                     "message": message, **({"source": source} if source else {}),
                     **({"atc_code": code} if code else {})})


def where(node: Any, module_paths: dict[str, str] | None) -> str:
    """``module encoder.layer.0.attn (Softmax), node 'n'``: the PyTorch module and the ONNX node."""
    path = (module_paths or {}).get(node.name)
    if path is None:
        path = next((p.value for p in node.metadata_props if p.key == mp.KEY), None)
    name = node.name or "<unnamed>"
    props = {p.key: p.value for p in node.metadata_props}
    op = f"{node.op_type} + folded {props[mp.FOLDED]}" if mp.FOLDED in props else node.op_type
    line = f" at {props[mp.SOURCE]}" if mp.SOURCE in props else ""
    if path is None:
        return f"node {name!r} ({op}), PyTorch module unknown{line}"
    root = f"the root module {props[mp.ROOT]}" if mp.ROOT in props else "the root module"
    return f"{root if path == '' else 'module ' + path} ({op}), node {name!r}{line}"


def _nodes(graph: Any) -> Iterator[Any]:
    """Every node, including those in If/Loop/Scan bodies."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _nodes(attr.g)
            for g in attr.graphs:
                yield from _nodes(g)


def _graph_opset(model: Any) -> int | None:
    for imp in model.opset_import:
        if imp.domain in DEFAULT_DOMAINS:
            return imp.version
    return None
