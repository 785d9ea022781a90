"""ATC hints (the options of Huawei's ``atc`` converter) and their rendering into ``atc/``.

Each hint is a HintSpec: a name ATC knows, a normaliser that refuses bad values with the accepted
ones, and the options ATC refuses alongside it. ``render`` writes ``atc/convert.sh`` and the config
files ATC reads (keep_dtype.cfg, fusion_switch.cfg, aipp.cfg), mapping PyTorch module paths in
``keep_dtype`` to the ONNX node names that implement them.
"""
from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..hooks.manager import registry
from ..options import PRECISION_MODES

PRECISION_MODES_V2 = ("fp16", "origin", "cube_fp16in_fp32out", "mixed_float16", "mixed_bfloat16", "mixed_hif8")
IMPL_MODES = ("high_precision", "high_performance", "high_precision_for_all", "high_performance_for_all")
INPUT_FORMATS = ("NCHW", "NHWC", "ND", "NCDHW", "NDHWC")
LOG_LEVELS = ("debug", "info", "warning", "error", "null")
DYNAMIC = ("dynamic_batch_size", "dynamic_image_size", "dynamic_dims", "input_shape_range")


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def normalize(value: Any) -> str:
        if str(value) not in options:
            raise ValueError(f"accepted values: {', '.join(options)}")
        return str(value)
    return normalize


def _text(value: Any) -> str:
    if not isinstance(value, (str, int)) or str(value).strip() == "":
        raise ValueError("expected a non-empty string")
    return str(value).strip()


def _pattern(regex: str, example: str) -> Callable[[Any], str]:
    def normalize(value: Any) -> str:
        text = _text(value).replace(" ", "")
        if not re.fullmatch(regex, text):
            raise ValueError(f"expected a value like {example}")
        return text
    return normalize


def _name_list(value: Any) -> list[str]:
    items = value.split(",") if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if not items or not all(isinstance(i, str) and i.strip() for i in items):
        raise ValueError("expected a list of names (or a comma-separated string)")
    return [i.strip() for i in items]


def _fusion_switch(value: Any) -> dict[str, dict[str, str]]:
    """``{"Pass": "off"}`` (graph fusion), ``{"GraphFusion": {...}, "UBFusion": {...}}`` or ``"Pass:off,..."``."""
    if isinstance(value, str):
        value = json.loads(value) if value.strip().startswith("{") else dict(
            part.split(":", 1) for part in value.split(",") if ":" in part)
    if not isinstance(value, dict) or not value:
        raise ValueError('expected {"PassName": "on"|"off"} or {"GraphFusion": {...}, "UBFusion": {...}}')
    nested = {k: v for k, v in value.items() if k in ("GraphFusion", "UBFusion")}
    groups = nested if nested else {"GraphFusion": value}
    for group in groups.values():
        for name, state in group.items():
            if str(state).lower() not in ("on", "off"):
                raise ValueError(f"fusion pass {name}: state must be on or off, not {state!r}")
    return {g: {k: str(v).lower() for k, v in group.items()} for g, group in groups.items()}


def _mixlist(value: Any) -> dict[str, dict[str, list[str]]]:
    from .mixlists import check_edits

    return check_edits(value)


def _customize(value: Any) -> list[str]:
    from .customize import parse

    return [e.line() for e in parse(value)]


def _aipp(value: Any) -> list[dict[str, Any]]:
    """One aipp_op block (a dict) or several (a list of dicts); JSON text is accepted from the CLI."""
    if isinstance(value, str):
        value = json.loads(value)
    blocks = [value] if isinstance(value, dict) else value
    if not isinstance(blocks, list) or not blocks or not all(isinstance(b, dict) for b in blocks):
        raise ValueError("expected a dict of aipp_op fields, e.g. "
                         "{'input_format': 'RGB888_U8', 'src_image_size_w': 224}")
    for block in blocks:
        for key in block:
            if not re.fullmatch(r"[a-z][a-z0-9_]*", str(key)):
                raise ValueError(f"aipp field {key!r} is not an aipp_op field name")
    return [{"aipp_mode": "static", **b} for b in blocks]


@dataclass(frozen=True)
class HintSpec:
    """An ATC hint (see contracts.AtcHint). ``custom``: this plugin renders it itself (an option of its own,
    a cfg file); otherwise a non-advisory hint becomes ``--name=value`` in convert.sh, as a plugin's does."""

    name: str
    normalize: Callable[[Any], Any]
    conflicts: tuple[str, ...] = ()
    advisory: bool = False
    custom: bool = False


BUILTIN_HINTS = (
    HintSpec("soc_version", _text, custom=True),
    HintSpec("precision_mode", _choice(PRECISION_MODES), conflicts=("precision_mode_v2",), custom=True),
    HintSpec("precision_mode_v2", _choice(PRECISION_MODES_V2), conflicts=("precision_mode",)),
    HintSpec("keep_dtype", _name_list, custom=True),
    HintSpec("modify_mixlist", _mixlist, custom=True),
    HintSpec("customize_dtypes", _customize, custom=True),
    HintSpec("op_select_implmode", _choice(IMPL_MODES)),
    HintSpec("optypelist_for_implmode", _name_list),
    HintSpec("fusion_switch", _fusion_switch, custom=True),
    HintSpec("input_format", _choice(INPUT_FORMATS)),
    HintSpec("input_shape", _pattern(r"[\w./:-]+:(-1|\d+(~\d+)?)(,(-1|\d+(~\d+)?))*"
                                     r"(;[\w./:-]+:(-1|\d+(~\d+)?)(,(-1|\d+(~\d+)?))*)*",
                                     "x:1,3,224,224;y:1,10 (-1 or LO~HI for a dynamic dimension)"),
             custom=True),
    HintSpec("dynamic_batch_size", _pattern(r"\d+(,\d+)+", "1,2,4,8"),
             conflicts=("dynamic_image_size", "dynamic_dims", "input_shape_range")),
    HintSpec("dynamic_image_size", _pattern(r"\d+,\d+(;\d+,\d+)+", "224,224;448,448"),
             conflicts=("dynamic_batch_size", "dynamic_dims", "input_shape_range")),
    HintSpec("dynamic_dims", _pattern(r"\d+(,\d+)*(;\d+(,\d+)*)+", "20,20;40,40"),
             conflicts=("dynamic_batch_size", "dynamic_image_size", "input_shape_range", "aipp")),
    HintSpec("input_shape_range", _text,
             conflicts=("dynamic_batch_size", "dynamic_image_size", "dynamic_dims")),
    HintSpec("out_nodes", _pattern(r"[^;:]+:\d+(;[^;:]+:\d+)*", "node_a:0;node_b:1")),
    HintSpec("aipp", _aipp, conflicts=("dynamic_dims",), custom=True),
    HintSpec("log", _choice(LOG_LEVELS)),
    HintSpec("insert_teacache", _name_list, advisory=True),
    HintSpec("memory_layout", _text, advisory=True),
)


def hint_args(spec: Any, value: Any) -> list[str]:
    """The convert.sh arguments of a pass-through hint: the spec's own ``render(value)`` when it has one,
    else ``--name=value`` (lists comma-joined)."""
    from ..hooks.contracts import AtcHint, optional

    render = optional(spec, AtcHint, "render")
    if render is not None:
        return [str(a) for a in render(value)]
    return [f"--{spec.name}={','.join(map(str, value)) if isinstance(value, (list, tuple)) else value}"]


def input_shape_arg(inputs: list[dict[str, Any]]) -> str:
    return ";".join(f"{i['name']}:{','.join(str(d) if isinstance(d, int) and d > 0 else '-1' for d in i['shape'])}"
                    for i in inputs)


def dynamic_axes(ctx: Any) -> list[Any]:
    """The export's dynamic axes (the ones the graph kept), or for a re-render the options' (the manifest's)."""
    axes = getattr(ctx, "dynamic_axes", None)
    return list(axes) if axes is not None else list(getattr(ctx.options, "dynamic", None) or [])


def keep_dtype_nodes(entries: list[str], model: Any, module_paths: dict[str, str]) -> tuple[list[str], dict]:
    """ATC keep_dtype lines: ``OpType::X`` and ONNX node names pass through; a PyTorch module path
    becomes the names of every node it (or a child module) produced."""
    names = {n.name for n in model.graph.node}
    lines, mapping = [], {}
    for entry in entries:
        if "::" in entry or entry in names:
            lines.append(entry)
            continue
        matched = [node for node, path in module_paths.items()
                   if node in names and (path == entry or path.startswith(entry + "."))]
        if not matched:
            from ..errors import WriteError

            raise WriteError(f"keep_dtype entry {entry!r} is neither a node of the written graph, an OpType::X "
                             "entry nor the path of a PyTorch module that produced nodes; pass one of those "
                             "(onnxsim renames and merges nodes: name a module or an op type to be safe)")
        mapping[entry] = matched
        lines.extend(matched)
    return list(dict.fromkeys(lines)), mapping


def aipp_prototxt(blocks: list[dict[str, Any]]) -> str:
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        text = str(v)
        return text if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text) else json.dumps(text)

    out = []
    for block in blocks:
        out.append("aipp_op {")
        out.extend(f"    {k}: {value(v)}" for k, v in block.items())
        out.append("}")
    return "\n".join(out) + "\n"


def render(ctx: Any, bundle: Path, model_file: str = "model.onnx", output_stem: str = "model") -> list[Path]:
    """Write atc/convert.sh and the cfg files the hints need; record the ATC options in ctx.reports.atc."""
    from ..graph.onnx_helpers import describe_values
    from . import amct_run, precision_cfg
    from .dynamic_form import atc_form
    from .hints import effective_precision

    opts, hints = ctx.options, ctx.options.atc_hints
    atc_dir = bundle / "atc"
    atc_dir.mkdir(exist_ok=True)
    files: list[Path] = []
    quantized = amct_run.is_quantized(ctx.onnx_model)  # Q/DQ: atc converts AMCT's deploy model instead
    args = ["atc", "--framework=5", f"--model={amct_run.DEPLOY_MODEL if quantized else model_file}",
            f"--output={output_stem}",
            f"--soc_version={opts.soc_version}"]
    axes = dynamic_axes(ctx)
    form = atc_form(ctx.onnx_model, axes, opts.cann_version, hints) if axes or any(k in hints for k in DYNAMIC) \
        else None
    args.append(f"--input_shape={hints.get('input_shape') or (form or {}).get('input_shape') or input_shape_arg(describe_values(ctx.onnx_model.graph.input))}")  # noqa: E501
    if "precision_mode_v2" not in hints:
        args.append(f"--precision_mode={opts.precision_mode}")
    specs = registry().atc_hints()
    args += [arg for k in hints if not (specs[k].advisory or getattr(specs[k], "custom", False))
             for arg in hint_args(specs[k], hints[k])]
    args += [f"--{k}={v}" for k, v in ((form or {}).get("options") or {}).items() if k not in hints]
    report: dict[str, Any] = {"soc_version": opts.soc_version, "precision_mode": effective_precision(ctx.options),
                              "hints": dict(hints), "advisory": {k: hints[k] for k in hints if specs[k].advisory}}
    if axes:  # what validate re-renders the command from (with the graph's symbolic dims)
        report["dynamic"] = {"cann_version": str(opts.cann_version), "form": form["form"],
                             "axes": [a.to_dict() for a in axes]}
    if quantized:
        report["amct"] = {"command": amct_run.command(model_file), "model": model_file,
                          "deploy_model": amct_run.DEPLOY_MODEL, "record_file": amct_run.RECORD_FILE}
    for write in (_keep_dtype, precision_cfg.render):  # keep_dtype.cfg, modify_mixlist.json, customize_dtypes.cfg
        more_files, more_args, more_report, warnings = write(ctx, atc_dir, _write)
        files += more_files
        args += more_args
        report.update(more_report)
        _warn(ctx, warnings)
    if "fusion_switch" in hints:
        files.append(_write(atc_dir / "fusion_switch.cfg", json.dumps({"Switch": hints["fusion_switch"]}, indent=4)))
        args.append("--fusion_switch_file=atc/fusion_switch.cfg")
    if "aipp" in hints:
        files.append(_write(atc_dir / "aipp.cfg", aipp_prototxt(hints["aipp"])))
        args.append("--insert_op_conf=atc/aipp.cfg")
    if "insert_teacache" in hints:
        report["insert_teacache_nodes"] = {
            path: sorted(n for n, p in ctx.module_paths.items() if p == path or p.startswith(path + "."))
            for path in hints["insert_teacache"]}
    script = _write(atc_dir / "convert.sh", convert_script(args, report["amct"]["command"] if quantized else None))
    os.chmod(script, 0o755)
    report["command"] = args
    ctx.reports.atc = report
    return [script, *files]


def _keep_dtype(ctx: Any, atc_dir: Path, write: Any) -> tuple[list[Path], list[str], dict[str, Any], list[str]]:
    """keep_dtype.cfg: the hint's entries and --fix-precision's set, ``OpType::`` entries in Ascend IR types."""
    from . import precision_cfg

    fixed = ctx.reports.precision_fix
    fixed_lines = precision_cfg.fix_entries(list(fixed.kept), ctx.onnx_model)[0] if fixed is not None else []
    keep = list(ctx.options.atc_hints.get("keep_dtype", [])) + fixed_lines
    if not keep:
        return [], [], {}, []
    lines, mapping = keep_dtype_nodes(keep, ctx.onnx_model, ctx.module_paths)
    lines, warnings = precision_cfg.ascend_keep_lines(lines, ctx.onnx_model)
    warnings += precision_cfg.fused_name_warnings(list(ctx.options.atc_hints.get("keep_dtype", [])), ctx.onnx_model)
    files = [write(atc_dir / "keep_dtype.cfg", "\n".join(lines) + "\n")]
    report: dict[str, Any] = {"keep_dtype": {"nodes": lines, "module_paths": mapping}}
    if fixed_lines:  # the same set in the form Huawei's recipes write (offered beside keep_dtype.cfg)
        custom = precision_cfg.fix_customize(lines, ctx.onnx_model, ctx.options.atc_hints.get("customize_dtypes"))
        files.append(write(atc_dir / precision_cfg.FIX_CUSTOMIZE, custom))
        report["keep_dtype"]["customize_dtypes"] = f"atc/{precision_cfg.FIX_CUSTOMIZE}"
    return files, ["--keep_dtype=atc/keep_dtype.cfg"], report, warnings


def _warn(ctx: Any, messages: list[str]) -> None:
    """Render-time warnings beside the hints' own (reports.warnings.atc_hints), each once."""
    warnings = getattr(getattr(ctx, "reports", None), "warnings", None)
    if warnings is None or not messages:
        return
    known = list(warnings.atc_hints or [])
    warnings.atc_hints = known + [m for m in messages if m not in known]


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def convert_script(args: list[str], amct: list[str] | None = None) -> str:
    """convert.sh: ``atc`` with ``args`` from the bundle root; for a Q/DQ graph, AMCT's ``amct`` step first."""
    from .amct_run import MODULE

    head = ["#!/usr/bin/env bash",
            "# Converts model.onnx to an Ascend offline model (.om). Run on a machine with CANN installed."]
    steps = []
    if amct is not None:
        head += ["# The graph is int8 QuantizeLinear/DequantizeLinear (QAT), which atc takes only as AMCT's",
                 "# deploy model: AMCT's convert_qat_model first writes amct/model_deploy_model.onnx",
                 "# (AscendQuant/AscendDequant). AMCT comes with CANN's Ascend-cann-amct package: pip3 install its",
                 "# amct_onnx wheel, then build its custom ops (amct_onnx_op: python3 setup.py build)."]
        probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec(\"{MODULE}\") is None)"
        missing = (f"convert.sh: AMCT (the Python module {MODULE}) is not installed; install the amct_onnx wheel of "
                   "the Ascend-cann-amct package and build its custom ops")
        steps += [f"python3 -c {shlex.quote(probe)} || {{ echo {shlex.quote(missing)} >&2; exit 2; }}",
                  "mkdir -p amct",
                  " ".join(shlex.quote(a) for a in amct)]
    return "\n".join([*head, "set -euo pipefail", 'cd "$(dirname "$0")/.."', *steps,
                      " ".join(shlex.quote(a) for a in args) + ' "$@"']) + "\n"
