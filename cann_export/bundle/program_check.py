"""A bundle's ``torch/program.pt2`` checked as a model file is, without ever loading it: the .pt2 checker
(load.archive_safety, as for an untrusted model: no pickle, no guards_code, no IO operator, no native code)
and its graph signature, read from the archive's model JSON within bounds, against the manifest's (and so
the ONNX graph's) inputs and outputs: input names in order, output count, and each value's dtype and rank
and static dimensions (a symbolic dimension, the free batch the program is captured with, matches any)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .torch_program import PROGRAM_FILE

MAX_MODEL_JSON_BYTES = 256 << 20  # an export writes a few KiB per graph node
MODEL_JSON = "models/model.json"  # torch.export.save's MODELS_FILENAME_FORMAT for the model named "model"
# torch.export's serialized ScalarType codes (torch/_export/serde/schema.py) -> the ONNX dtype names the
# manifest uses (lower-case TensorProto names)
_DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float16", 7: "float", 8: "double",
           10: "complex64", 11: "complex128", 12: "bool", 13: "bfloat16", 28: "uint16", 29: "float8e4m3fn",
           30: "float8e5m2", 31: "float8e4m3fnuz", 32: "float8e5m2fnuz", 34: "uint32", 35: "uint64"}


def program_differences(directory: Path, manifest: dict[str, Any]) -> list[str]:
    """Why the bundle's program is refused or disagrees with the manifest ([] when it has none, or it passes)."""
    path = directory / PROGRAM_FILE
    if PROGRAM_FILE not in (manifest.get("files") or {}) and not path.exists():
        return []
    if path.is_symlink() or not path.is_file():
        return []  # read.file_problems names a missing file or a link
    from ..errors import LoadError
    from ..load.archive_safety import check_export_archive

    try:
        check_export_archive(path, trust_pickle=False)
        program = _model_json(path)
    except LoadError as e:
        return [f"{PROGRAM_FILE}: refused by the .pt2 checker that model files pass ({e.message})"]
    return [f"{PROGRAM_FILE}: {d}" for d in signature_differences(program, manifest.get("model") or {})]


def _model_json(path: Path) -> Any:
    from ..errors import LoadError
    from ..load.archives import open_checked

    with open_checked(path) as archive:
        names = archive.names
        root = names[0].split("/", 1)[0] if names and "/" in names[0] else ""
        member = f"{root}/{MODEL_JSON}"
        if member not in archive.infos:
            raise LoadError(f"it holds no {MODEL_JSON}, the layout torch.export.save writes", path=path)
        size = archive.infos[member].file_size
        if size > MAX_MODEL_JSON_BYTES:
            raise LoadError(f"{member} declares {size} bytes, past the {MAX_MODEL_JSON_BYTES}-byte bound", path=path)
        try:
            return json.loads(archive.read(member))
        except (ValueError, RecursionError) as e:
            raise LoadError(f"{member} is not readable JSON ({type(e).__name__})", path=path) from e


def _values(program: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | str:
    """The program's user tensor inputs and outputs as {name, dtype, shape} (a dimension: int or None), or
    why the JSON does not say."""
    try:
        module = program["graph_module"]
        signature, tensors = module["signature"], module["graph"]["tensor_values"]
        found: tuple[list, list] = ([], [])
        for specs, kind, out in ((signature["input_specs"], "user_input", found[0]),
                                 (signature["output_specs"], "user_output", found[1])):
            for spec in specs:
                arg = spec.get(kind, {}).get("arg", {}) if isinstance(spec, dict) else {}
                name = arg.get("as_tensor", {}).get("name") if isinstance(arg, dict) else None
                if isinstance(name, str):
                    meta = tensors[name]
                    out.append({"name": name, "dtype": _DTYPES.get(meta["dtype"], f"dtype code {meta['dtype']}"),
                                "shape": [size.get("as_int") if isinstance(size, dict) else None
                                          for size in meta["sizes"]]})
        return found
    except (KeyError, TypeError, AttributeError):
        return "its model JSON has no graph signature with tensor metadata where torch.export.save writes one"


def signature_differences(program: Any, model: dict[str, Any]) -> list[str]:
    """The program's signature against the manifest's ``model`` section (inputs by name, outputs by position:
    the ONNX graph names its outputs, the program its nodes)."""
    values = _values(program)
    if isinstance(values, str):
        return [values]
    diffs = []
    for kind, ours, theirs in (("inputs", values[0], model.get("inputs") or []),
                               ("outputs", values[1], model.get("outputs") or [])):
        if kind == "inputs" and [v["name"] for v in ours] != [v.get("name") for v in theirs]:
            diffs.append(f"its inputs are {[v['name'] for v in ours]}, the graph's {[v.get('name') for v in theirs]}")
            continue
        if len(ours) != len(theirs):
            diffs.append(f"it has {len(ours)} {kind}, the graph {len(theirs)}")
            continue
        for i, (mine, graph) in enumerate(zip(ours, theirs, strict=True)):
            label = f"{kind[:-1]} {graph.get('name')!r}" if kind == "inputs" else f"output {i} ({graph.get('name')!r})"
            if mine["dtype"] != graph.get("dtype"):
                diffs.append(f"{label} is {mine['dtype']}, in the graph {graph.get('dtype')}")
            if not _shapes_agree(mine["shape"], graph.get("shape")):
                shown = [d if d is not None else "*" for d in mine["shape"]]
                diffs.append(f"{label} has shape {shown}, in the graph {graph.get('shape')}")
    return diffs


def _shapes_agree(program: list[int | None], graph: Any) -> bool:
    if not isinstance(graph, list) or len(graph) != len(program):
        return False
    return all(p is None or not isinstance(g, int) or p == g for p, g in zip(program, graph, strict=True))
