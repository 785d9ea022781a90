"""ATC's ``--customize_dtypes`` config: per-op input and output dtypes, one op a line, by node name
(``Opname::InputDtype:float16,float,OutputDtype:float``) or by Ascend IR type
(``OpType::TypeName:InputDtype:...,OutputDtype:...``). Checked before any work; a name entry is checked against
the written graph when the cfg is rendered (a node ATC's fusion may fold away only warns: ATC then ignores it).
Precedence, as ATC documents it: customize_dtypes over keep_dtype, a name entry over an OpType entry.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# ATC dtype names -> what the emulation computes them in ("fp16", "bf16", "fp32"; other dtypes: not float)
DTYPES = {"float": "fp32", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "int8": "int", "uint8": "int",
          "int16": "int", "int32": "int", "int64": "int", "bool": "int", "double": "fp32"}
MAX_LINES = 4096
LINE = re.compile(r"(?P<target>OpType::[A-Za-z_][\w]*|[^:\s][^\n]*?)::?InputDtype:(?P<ins>[\w,]*?),?"
                  r"OutputDtype:(?P<outs>[\w,]+)")


@dataclass(frozen=True)
class Custom:
    """One customize_dtypes line: a node name or ``OpType::X``, and the dtypes of its inputs and outputs."""

    target: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    @property
    def by_type(self) -> bool:
        return self.target.startswith("OpType::")

    def line(self) -> str:
        sep = ":" if self.by_type else "::"
        return f"{self.target}{sep}InputDtype:{','.join(self.inputs)},OutputDtype:{','.join(self.outputs)}"

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "inputs": list(self.inputs), "outputs": list(self.outputs)}


def parse(text: Any) -> list[Custom]:
    """customize_dtypes cfg text (or a list of its lines, or of Custom dicts) -> its entries; raises ValueError
    naming the first bad line and the fix."""
    from .ascend_ir import known_types, onnx_spelling

    if isinstance(text, list) and all(isinstance(e, dict) for e in text):
        text = "\n".join(Custom(str(e.get("target")), tuple(e.get("inputs") or ()),
                                tuple(e.get("outputs") or ())).line() for e in text)
    if isinstance(text, (list, tuple)):
        text = "\n".join(map(str, text))
    if not isinstance(text, str) or not text.strip():
        raise ValueError("expected lines like 'Opname::InputDtype:float,float,OutputDtype:float' or "
                         "'OpType::LayerNorm:InputDtype:float,float,float,OutputDtype:float,float,float'")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    if len(lines) > MAX_LINES:
        raise ValueError(f"more than {MAX_LINES} lines")
    out, known = [], known_types()
    for number, ln in enumerate(lines, 1):
        m = LINE.fullmatch(ln)
        if m is None:
            raise ValueError(f"line {number} {ln[:80]!r} does not parse; write Opname::InputDtype:d1,...,"
                             "OutputDtype:d1,... or OpType::TypeName:InputDtype:d1,...,OutputDtype:d1,...")
        ins = tuple(d for d in m["ins"].split(",") if d)
        outs = tuple(d for d in m["outs"].split(",") if d)
        bad = [d for d in ins + outs if d not in DTYPES]
        if bad:
            raise ValueError(f"line {number}: dtype {bad[0][:40]!r} is not one ATC names; use {', '.join(DTYPES)}")
        entry = Custom(m["target"], ins, outs)
        if entry.by_type:
            name = entry.target[len("OpType::"):]
            ascend = onnx_spelling(name)
            if ascend is not None:
                raise ValueError(f"line {number}: OpType::{name} names an ONNX op type; ATC matches Ascend IR types: "
                                 f"write OpType::{ascend}")
            if name not in known:
                raise ValueError(f"line {number}: OpType::{name[:60]} is not an Ascend IR op type this tool knows; "
                                 "name the type as the op info library spells it (atc/data/ascend_ir_ops.json)")
        out.append(entry)
    return out


def for_node(entries: list[Custom], name: str, ascend_type: str | None) -> Custom | None:
    """The entry that applies to a node: its name's, else its Ascend IR type's."""
    by_name = next((e for e in entries if e.target == name), None)
    if by_name is not None:
        return by_name
    return next((e for e in entries if ascend_type and e.target == f"OpType::{ascend_type}"), None)


def check_names(entries: list[Custom], model: Any) -> list[str]:
    """Name entries against the written graph: a name the graph lacks raises ValueError; a node ATC's fusions
    usually fold away is returned as a warning (ATC then ignores the entry)."""
    from .ascend_ir import likely_fused

    nodes = {n.name: n.op_type for n in model.graph.node if n.name}
    fused = likely_fused(model)
    warnings = []
    for e in entries:
        if e.by_type:
            continue
        if e.target not in nodes:
            raise ValueError(f"{e.target[:80]!r} is not a node of the written graph; name a node of model.onnx or "
                             "use OpType::<Ascend IR type>")
        if e.target in fused:
            warnings.append(f"customize_dtypes: {e.target} ({nodes[e.target]}) is {fused[e.target]} by ATC, "
                            "which then ignores its entry (ATC's documented rule): name the op it fuses into or "
                            "use an OpType:: entry")
    return warnings


# ONNX element types -> the dtype names customize_dtypes lines use (a kept node reads and writes them as they are)
ONNX_DTYPES = {1: "float", 10: "float16", 16: "bfloat16", 11: "double", 7: "int64", 6: "int32", 5: "int16", 3: "int8",
               2: "uint8", 9: "bool"}


def kept_in_fp32(lines: list[str], model: Any, given: list[Custom] | None = None) -> list[Custom]:
    """keep_dtype.cfg's ``lines`` (node names, ``OpType::<Ascend IR type>``) as customize_dtypes entries under
    which those nodes read and write fp32: every input and output of a float type as ``float``, the others as
    their own type (an ``OpType::`` line with the signature of its first node in the graph). ``given``: the
    customize_dtypes hint's entries, first; a target they name keeps their dtypes."""
    from ..graph.onnx_helpers import inferred_values
    from .ascend_ir import node_types

    types = {v.name: v.type.tensor_type.elem_type for v in inferred_values(model)}
    ascend = node_types(model) if any(ln.startswith("OpType::") for ln in lines) else {}
    nodes = {n.name: n for n in model.graph.node if n.name}

    def dtypes(values: list[str]) -> tuple[str, ...]:
        return tuple(ONNX_DTYPES.get(types.get(v, 1), "float") for v in values)

    out = list(given or [])
    named = {e.target for e in out}
    for line in lines:
        if line.startswith("OpType::"):
            node = next((nodes[n] for n, t in ascend.items() if f"OpType::{t}" == line and n in nodes), None)
        else:
            node = nodes.get(line)
        if node is None or line in named:
            continue
        inputs = list(node.input)
        while inputs and not inputs[-1]:  # absent trailing optional inputs are not listed
            inputs.pop()
        out.append(Custom(line, dtypes(inputs), dtypes(list(node.output))))
        named.add(line)
    return out
