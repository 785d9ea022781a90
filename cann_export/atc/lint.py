"""ATC lint: what Huawei's ``atc`` converter would refuse, found without a CANN install.

Checks the ONNX graph against the target CANN release: the graph opset, every op type against the
published list of ONNX operators ATC parses (``data/atc_onnx_ops.json``, which records its source),
input dtypes and shapes against the dynamic-shape hints, and quantized graphs against AMCT's convert_qat_model
rules (``amct.check_qdq``: AMCT turns their Q/DQ into AscendQuant/AscendDequant before atc), the hints and the
precision mode. Every finding names the ONNX node and the PyTorch module it came from.
"""
from __future__ import annotations

import functools
import json
import re
from typing import Any

from .findings import DEFAULT_DOMAINS, QDQ, _Findings, _graph_opset, _nodes, where  # noqa: F401 - lint's API
from .versions import parse_cann_version  # noqa: F401 - lint's API (plugins/lint_command, tests)

DYNAMIC_HINTS = ("dynamic_batch_size", "dynamic_image_size", "dynamic_dims", "input_shape_range")
HIGH_PRECISION = ("force_fp32", "must_keep_origin_dtype", "origin")
# TensorProto data types (onnx.TensorProto enum values), so this module needs no onnx import to classify
FLOAT, UINT8, INT32, INT64, FLOAT16 = 1, 2, 6, 7, 10
INTEGER_OK = {INT32: "int32", INT64: "int64"}
INDEX_NAME = re.compile(r"(?:^|_)(?:ids?|mask|masks|positions?|indices|index|idx|lengths?|bbox|labels?|tokens?)$",
                        re.IGNORECASE)


@functools.lru_cache(maxsize=1)
def load_table() -> dict[str, Any]:
    """The packaged table of ONNX operators ATC parses (see its ``source`` and ``notes``)."""
    from importlib.resources import files

    return json.loads(files("cann_export.atc.data").joinpath("atc_onnx_ops.json").read_text(encoding="utf-8"))


def opset_range(version: tuple[int, int]) -> tuple[int, int]:
    """The ONNX opsets ATC of this CANN release parses (from the ATC guides the table cites)."""
    for row in load_table()["opset_ranges"]:
        if version[0] >= row["min_major"] and (row["max_major"] is None or version[0] <= row["max_major"]):
            return tuple(row["opsets"])  # type: ignore[return-value]
    return (9, 13)


def _fixed_dims(hints: dict[str, Any]) -> dict[str, list[int]]:
    """``input_shape`` hint ``x:1,3,224,224;y:1~8,10`` -> {name: dims}; a ``LO~HI`` range (CANN >= 8) counts as
    covered (1), -1 as open (-1)."""
    out: dict[str, list[int]] = {}
    for part in str(hints.get("input_shape") or "").split(";"):
        name, sep, dims = part.rpartition(":")
        if sep and name:
            try:
                out[name] = [1 if "~" in d else int(d) for d in dims.split(",")]
            except ValueError:
                continue
    return out


def _covering_hint(hints: dict[str, Any], axis: int | None, rank: int | None) -> str | None:
    """The dynamic-profile hint that lets ATC accept a dynamic dimension at ``axis`` (None: unknown rank)."""
    if "input_shape_range" in hints:
        return "input_shape_range"
    if axis is None:
        return None
    if "dynamic_dims" in hints:
        return "dynamic_dims"
    if "dynamic_batch_size" in hints and axis == 0:
        return "dynamic_batch_size"
    if "dynamic_image_size" in hints and rank == 4 and axis in (1, 2, 3):  # H, W of NCHW or NHWC
        return "dynamic_image_size"
    return None


def index_like(name: str) -> bool:
    """An input named as token ids, a mask, positions, indices or lengths are (input_ids, attention_mask,
    cache_position, bbox): int32/int64 is what ATC takes there, so an integer dtype is no finding. The rule reads
    the graph only, so validate's re-run of the lint agrees with the export's."""
    return bool(INDEX_NAME.search(name))


def _check_inputs(model: Any, hints: dict[str, Any], findings: _Findings) -> None:
    initializers = {i.name for i in model.graph.initializer}
    fixed = _fixed_dims(hints)
    for value in model.graph.input:
        if value.name in initializers:
            continue
        name = value.name
        t = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            findings.add("error", "input-type", f"input {name!r} is not a tensor; ATC takes tensor inputs only")
            continue
        dtype = t.elem_type
        if dtype in (FLOAT, FLOAT16):
            pass
        elif dtype in INTEGER_OK:
            if not index_like(name):
                findings.add("warning", "input-dtype",
                             f"input {name!r} is {INTEGER_OK[dtype]}: ATC accepts it for index-like inputs (token "
                             "ids, masks, positions); any other input must be float32 or float16")
        elif dtype == UINT8:
            if "aipp" not in hints:
                findings.add("error", "input-dtype",
                             f"input {name!r} is uint8: ATC takes uint8 images only through AIPP; pass an aipp hint "
                             "(--atc-hint aipp=...) or take float32/float16 input")
        else:
            findings.add("error", "input-dtype",
                         f"input {name!r} is {_dtype_name(dtype)}: ATC model inputs must be float32 or float16 "
                         "(int32/int64 for index-like inputs); cast inside the model instead")
        if not t.HasField("shape"):
            hint = _covering_hint(hints, None, None)
            if hint is None:
                findings.add("error", "dynamic-shape",
                             f"input {name!r} has no shape (unknown rank): ATC needs a static shape or an "
                             "input_shape_range hint")
            continue
        dims = list(t.shape.dim)
        shown = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]
        for axis, d in enumerate(dims):
            if d.HasField("dim_value") and d.dim_value == 0:
                findings.add("error", "zero-dim",
                             f"input {name!r} has shape {shown} with dimension {axis} equal to 0: ATC refuses "
                             "empty tensors; export with a non-empty example input")
                continue
            if d.HasField("dim_value") and d.dim_value > 0:
                continue
            pinned = fixed.get(name)
            if pinned and axis < len(pinned) and pinned[axis] > 0:
                continue  # the input_shape hint fixes it
            if _covering_hint(hints, axis, len(dims)) is None:
                label = d.dim_param or "-1"
                findings.add("error", "dynamic-shape",
                             f"input {name!r} has shape {shown} with dynamic dimension {axis} ({label}) and no "
                             "dynamic profile covers it: ATC converts static shapes only unless you pass "
                             "dynamic_batch_size (axis 0), dynamic_image_size (H,W), dynamic_dims or "
                             "input_shape_range, or fix it with input_shape")


def _check_input_names(model: Any, hints: dict[str, Any], findings: _Findings) -> None:
    """Every input the input_shape option names must be a graph input: ATC refuses another name (E10016)."""
    from .dynamic_lint import shape_cells

    initializers = {i.name for i in model.graph.initializer}
    names = [v.name for v in model.graph.input if v.name not in initializers]
    for name, _dims in shape_cells(str(hints.get("input_shape") or "")):
        if name not in names:
            findings.add("error", "input-name",
                         f"--input_shape names input {name!r}, which the graph does not have (ATC refuses it: E10016); "
                         f"the graph's inputs are {', '.join(names) or '(none)'}: fix the "
                         "--atc-hint input_shape", atc_code="E10016")


def _dtype_name(dtype: int) -> str:
    try:
        import onnx

        return onnx.TensorProto.DataType.Name(dtype).lower()
    except Exception:  # noqa: BLE001
        return f"dtype {dtype}"


def lint_model(model: Any, cann_version: str = "8.0", hints: dict[str, Any] | None = None,
               precision_mode: str = "force_fp16", module_paths: dict[str, str] | None = None,
               dynamic: list[Any] | None = None) -> dict[str, Any]:
    """Lint an onnx.ModelProto; returns the report (see module docstring). Collects every finding. ``dynamic``:
    the export's dynamic axes, whose ATC form (atc/dynamic_form.py) joins the hints as convert.sh passes them."""
    from . import dynamic_lint, op_traps
    from .dynamic_form import atc_form

    hints = dict(hints or {})
    if dynamic or any(k in hints for k in DYNAMIC_HINTS):
        form = atc_form(model, list(dynamic or []), cann_version, hints)
        hints = {**{k: v for k, v in form["options"].items() if k not in hints},
                 "input_shape": hints.get("input_shape") or form["input_shape"], **hints}
    module_paths = module_paths or {}
    table = load_table()
    findings = _Findings()
    opset = _graph_opset(model)
    _check_opset(cann_version, opset, findings)
    quantized = _check_ops(model, table, module_paths, findings)
    op_traps.check(model, module_paths, findings)
    _check_inputs(model, hints, findings)
    _check_input_names(model, hints, findings)
    if "input_shape" in hints:
        dynamic_lint.check(hints, cann_version, findings)
    if quantized:
        from .amct import check_qdq

        findings.add("info", "qdq-amct",
                     "the graph holds QuantizeLinear/DequantizeLinear, which ATC's ONNX parser does not take: "
                     "atc/convert.sh and `cann-export convert` run AMCT's amct_onnx.convert_qat_model first "
                     "(AscendQuant/AscendDequant in amct/model_deploy_model.onnx), then atc on that deploy model",
                     op_type="QuantizeLinear")
        findings.extend(check_qdq(model, module_paths))
        _check_quantized(hints, precision_mode, findings)
    return {"passed": not any(f["severity"] == "error" for f in findings),
            "cann_version": str(cann_version),
            "opset": opset,
            "table": {"source": table["source"], "cann_version": table["cann_version"]},
            "findings": list(findings)}


def _check_opset(cann_version: str, opset: int | None, findings: _Findings) -> None:
    version = parse_cann_version(cann_version)
    if version is None:
        findings.add("error", "cann-version", f"CANN version {cann_version!r} does not parse; write it like 8.0, "
                                              "7.0.RC1 or 6.3.RC2")
    elif opset is None:
        findings.add("error", "opset", "the graph imports no ai.onnx opset; ATC cannot parse it")
    else:
        low, high = opset_range(version)
        if not low <= opset <= high:
            findings.add("error", "opset",
                         f"the graph is at ONNX opset {opset}, but ATC of CANN {cann_version} parses opset "
                         f"{low}..{high} (E19010 'No parser is registered for Op ... ai.onnx::{opset}::...' at "
                         f"conversion); export with --opset {min(max(opset, low), high)} or target a newer CANN")


def _check_ops(model: Any, table: dict[str, Any], module_paths: dict[str, str], findings: _Findings) -> bool:
    """Every node's op against ATC's parser table; returns whether the graph holds Q/DQ."""
    ops = table["ops"]
    known_domains = set(table.get("known_domains", []))
    quantized = False
    for node in _nodes(model.graph):
        if node.op_type in QDQ and node.domain in DEFAULT_DOMAINS:
            quantized = True
        if node.domain not in DEFAULT_DOMAINS:
            if node.domain not in known_domains:
                findings.add("error", "custom-domain",
                             f"op {node.op_type} is in custom domain {node.domain!r}: ATC parses only ai.onnx ops "
                             f"(E19010 at conversion); rewrite it with standard ops or register a custom ATC ONNX "
                             "parser plugin for it", node, module_paths)
            continue
        if node.op_type in ops or node.op_type in QDQ:  # Q/DQ: AMCT's rules (amct.check_qdq)
            continue
        message = (f"ATC has no parser for ONNX op {node.op_type} (E19010 at conversion); replace the PyTorch op "
                   "with ones ATC supports or register a custom ATC ONNX parser plugin")
        findings.add("error", "unsupported-op", message, node, module_paths)
    return quantized


def _check_quantized(hints: dict[str, Any], precision_mode: str, findings: _Findings) -> None:
    dynamic = [h for h in DYNAMIC_HINTS if h in hints]
    if dynamic:
        findings.add("warning", "quant-dynamic-shape",
                     f"the graph is quantized (QuantizeLinear/DequantizeLinear) and {', '.join(dynamic)} is set: "
                     "int8 kernels with dynamic shapes are limited on Ascend; prefer static shapes for the "
                     "quantized model", op_type="QuantizeLinear")
    precision = hints.get("precision_mode_v2") or hints.get("precision_mode") or precision_mode
    if precision in HIGH_PRECISION:
        findings.add("warning", "quant-precision-mode",
                     f"the graph is quantized but precision mode is {precision}: int8 needs the quantized path, "
                     "which a high-precision mode keeps from running; use force_fp16 or allow_mix_precision",
                     op_type="QuantizeLinear")


def refused_ops(nodes: Any) -> set[tuple[str, str]]:
    """The (domain, op type) pairs among ``nodes`` (an onnx graph's ``_nodes`` or onnx_ir's ``all_nodes()``)
    that ATC's parser refuses: any op outside the ai.onnx domain, or one missing from the table (Q/DQ aside,
    AMCT lowers those)."""
    ops = load_table()["ops"]
    return {(n.domain, n.op_type) for n in nodes
            if n.domain not in DEFAULT_DOMAINS or (n.op_type not in ops and n.op_type not in QDQ)}


def foreign_ops(nodes: Any) -> set[tuple[str, str]]:
    """The (domain, op type) pairs among ``nodes`` outside the ai.onnx domain (contrib ops, custom ops,
    calls of local functions)."""
    return {(n.domain, n.op_type) for n in nodes if n.domain not in DEFAULT_DOMAINS}


def graph_refused_ops(model: Any) -> set[tuple[str, str]]:
    """``refused_ops`` of an onnx.ModelProto, If/Loop/Scan bodies included."""
    return refused_ops(_nodes(model.graph))


def require_standard(before: set[tuple[str, str]], after: set[tuple[str, str]], step: str) -> None:
    """A pass of ours must never write an op ATC refuses that the graph it was given did not hold (a
    ``com.microsoft`` fusion, an op newer than ATC parses): the tool would then refuse its own output. Raises
    RuntimeError, an internal error, naming the step and the ops."""
    added = sorted(after - before)
    if added:
        shown = ", ".join(f"{d}::{o}" if d not in DEFAULT_DOMAINS else o for d, o in added)
        raise RuntimeError(f"{step} wrote op(s) ATC does not parse that the graph did not hold: {shown}; an "
                           "ATC-bound graph must stay standard ONNX (a pass that emits them must be turned off)")


class AtcLint:
    """The ``lint`` stage validator for formats that go to ATC."""

    name = "atc-lint"
    stage = "lint"
    formats = staticmethod(lambda fmt: fmt.lint)  # formats that declare they go to ATC

    def check(self, ctx: Any) -> dict[str, Any]:
        opts = ctx.options

        def lint() -> dict[str, Any]:
            return lint_model(ctx.onnx_model, opts.cann_version, opts.atc_hints, opts.precision_mode, ctx.module_paths,
                              ctx.dynamic_axes)

        if not opts.fix_lint:
            return lint()
        from .lint_fixes import fixed_lint

        return fixed_lint(ctx, lint)
