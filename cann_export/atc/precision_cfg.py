"""The precision files of ``atc/`` in ATC's own vocabulary: ``OpType::`` entries of keep_dtype.cfg written as
Ascend IR types (atc/ascend_ir.py), modify_mixlist.json (atc/mixlists.py) and customize_dtypes.cfg
(atc/customize.py), each with the convert.sh argument that reads it and the warnings ATC's rules call for."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .mixlists import BF16_MIXED, FP16_MIXED

NO_KEEP_MODES = ("must_keep_origin_dtype", "origin")  # modes under which ATC ignores keep_dtype
FIX_CUSTOMIZE = "customize_dtypes.fix.cfg"  # --fix-precision's keep set as customize_dtypes entries
FIX_CUSTOMIZE_HEAD = (
    "# keep_dtype.cfg (with --fix-precision's keep set) as --customize_dtypes entries, the form Huawei's own recipes\n"
    "# write: each kept node reads and writes float. ATC takes it in place of keep_dtype.cfg: in atc/convert.sh,\n"
    "# replace --keep_dtype=atc/keep_dtype.cfg (and --customize_dtypes=..., whose entries lead this file) with\n"
    "# --customize_dtypes=atc/customize_dtypes.fix.cfg\n")


def ascend_keep_lines(lines: list[str], model: Any) -> tuple[list[str], list[str]]:
    """keep_dtype lines with each ``OpType::<ONNX type>`` rewritten to the Ascend IR type(s) the graph's nodes of
    that type become (ATC matches Ascend IR types), and a warning per rewritten entry."""
    from .ascend_ir import node_types, onnx_spelling

    out, warnings, types = [], [], None
    for line in lines:
        name = line[len("OpType::"):] if line.startswith("OpType::") else None
        if name is None or onnx_spelling(name) is None:
            out.append(line)
            continue
        if types is None:
            types = node_types(model)
        found = sorted({types[n.name] for n in model.graph.node if n.op_type == name and n.name in types})
        written = [f"OpType::{t}" for t in found] or [f"OpType::{t}" for t in onnx_spelling(name).split(" or ")]
        out.extend(written)
        warnings.append(f"keep_dtype entry OpType::{name} names an ONNX op type; ATC matches Ascend IR types, so "
                        f"keep_dtype.cfg says {', '.join(written)} (write that to silence this warning)")
    return list(dict.fromkeys(out)), warnings


def fused_name_warnings(entries: list[str], model: Any) -> list[str]:
    """keep_dtype name entries (the user's) of nodes ATC's fusions likely fold away: a warning each."""
    from .ascend_ir import likely_fused

    names = {n.name for n in model.graph.node}
    fused = likely_fused(model) if any(e in names for e in entries) else {}
    return [f"keep_dtype: {e} is {fused[e]} by ATC, so the name may not exist in the built model; keep the op it "
            "fuses into, the PyTorch module, or an OpType:: entry" for e in entries if e in fused]


def mode_warnings(hints: dict[str, Any], mode: str, soc: str) -> list[str]:
    """What ATC ignores or what the emulation only approximates, for the precision hints and mode given."""
    from .mixlists import bf16_supported

    warnings = []
    if "modify_mixlist" in hints and mode not in FP16_MIXED + BF16_MIXED:
        warnings.append(f"modify_mixlist has no effect under precision mode {mode}: ATC applies the lists only in "
                        "the mixed modes (allow_mix_precision*, mixed_float16, mixed_bfloat16)")
    if mode in BF16_MIXED and not bf16_supported(soc):
        warnings.append(f"precision mode {mode} is documented for Atlas A2/A3 (Ascend910B*, Ascend910_93*) only; "
                        f"ATC may refuse it for {soc}")
    if mode == "mixed_hif8":
        warnings.append("mixed_hif8: device parity emulates the fp16 mixed lists (white-list ops rounded to fp16); "
                        "HiFloat8's 8-bit rounding is not emulated, so the device is likely less precise than the "
                        "verdict says")
    if "customize_dtypes" in hints and mode in NO_KEEP_MODES:
        warnings.append(f"customize_dtypes under {mode}: the emulation does not model it (no op is reduced there)")
    return warnings


def render(ctx: Any, atc_dir: Path, write: Any) -> tuple[list[Path], list[str], dict[str, Any], list[str]]:
    """modify_mixlist.json and customize_dtypes.cfg for the hints that ask for them: the files, the convert.sh
    arguments, what the manifest's atc section records and the warnings. Raises WriteError for a customize_dtypes
    name the written graph lacks."""
    from ..errors import WriteError
    from .customize import check_names, parse

    hints = ctx.options.atc_hints
    files, args, report, warnings = [], [], {}, []
    if "modify_mixlist" in hints:
        files.append(write(atc_dir / "modify_mixlist.json", json.dumps(hints["modify_mixlist"], indent=2) + "\n"))
        args.append("--modify_mixlist=atc/modify_mixlist.json")
    if "customize_dtypes" in hints:
        entries = parse(hints["customize_dtypes"])
        try:
            warnings += check_names(entries, ctx.onnx_model)
        except ValueError as e:
            raise WriteError(f"customize_dtypes: {e}") from e
        files.append(write(atc_dir / "customize_dtypes.cfg", "\n".join(e.line() for e in entries) + "\n"))
        args.append("--customize_dtypes=atc/customize_dtypes.cfg")
        report["customize_dtypes"] = [e.line() for e in entries]
    return files, args, report, warnings


def fix_entries(kept: list[str], model: Any) -> tuple[list[str], dict[str, list[str]]]:
    """--fix-precision's keep set as keep_dtype lines: a node of an op ATC's fusion may fold away (whose name may
    then vanish) is written as ``OpType::<Ascend IR type>`` when every node of that type is kept (the same set,
    in a form fusion cannot rename); every other node by name. Also says which was chosen for which."""
    from .ascend_ir import likely_fused, node_types

    if not kept:
        return [], {"op_types": [], "names": []}
    types = node_types(model)
    fused = likely_fused(model)
    by_type: dict[str, set[str]] = {}
    for name, kind in types.items():
        by_type.setdefault(kind, set()).add(name)
    chosen = set(kept)
    as_type = sorted({types[n] for n in kept if n in fused and n in types and by_type[types[n]] <= chosen})
    covered = set().union(*(by_type[t] for t in as_type)) if as_type else set()
    names = [n for n in kept if n not in covered]
    return names + [f"OpType::{t}" for t in as_type], {"op_types": as_type, "names": names}


def fix_customize(lines: list[str], model: Any, hint: Any = None) -> str:
    """customize_dtypes.fix.cfg: keep_dtype.cfg's ``lines`` as customize_dtypes entries that keep each node in fp32,
    after the customize_dtypes ``hint``'s own entries (one file ATC can take instead of both flags)."""
    from .customize import kept_in_fp32, parse

    entries = kept_in_fp32(lines, model, parse(hint) if hint else None)
    return FIX_CUSTOMIZE_HEAD + "\n".join(e.line() for e in entries) + "\n"
