"""What an artifact holds (``cann-export inspect``), shown only after the artifact was checked: a bundle
whose manifest does not match its files, graph or ATC options is refused rather than its claims shown."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ValidateError
from . import om_stub
from . import rederive as bundle_check
from . import single_file as bundle_zip
from .read import manifest_sha256, open_artifact


def describe(path: Path) -> dict[str, Any]:
    """What an artifact holds, after checking it (inspect refuses a bundle whose manifest does not match
    its files, graph or ATC options rather than show edited claims)."""
    path = Path(path)
    if not path.exists():
        raise ValidateError("path not found", path=path, stage="inspect")
    header = om_stub.read_header(path) if om_stub.is_om_file(path) else None
    try:
        with open_artifact(path) as directory:
            if directory.is_dir():
                checked = bundle_check.check_bundle(directory, om_header=header)
                info = _describe(directory / checked.manifest["model"]["file"], checked.manifest)
                info["manifest_sha256"] = manifest_sha256(directory)
                info["files"] = sorted(checked.manifest["files"])
                info["atc"] = {**(checked.manifest.get("atc") or {}), "command": checked.command}
            else:
                info = _describe(directory, None)
    except ValidateError as e:
        e.stage = "inspect"
        raise
    info["path"] = str(path)
    if header is not None:
        info.update(kind="om-stub", om={**header, "kind": "stub"})
    elif bundle_zip.is_bundle_archive(path):
        info["container"] = "archive"
    return info


def _describe(onnx_path: Path, manifest: dict[str, Any] | None) -> dict[str, Any]:
    import onnx

    from ..capture.onnx_utils import describe_values, op_histogram, opset_of

    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as e:
        raise ValidateError(f"not a readable ONNX model ({type(e).__name__}); pass an .onnx file or a bundle",
                            path=onnx_path, stage="inspect") from e
    meta = {p.key: p.value for p in model.metadata_props}
    return {
        "path": str(onnx_path),
        "kind": manifest["format"] if manifest else "onnx",
        "opset": opset_of(model),
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "inputs": describe_values(model.graph.input),
        "outputs": describe_values(model.graph.output),
        "ops": op_histogram(model),
        "nodes": len(model.graph.node),
        "metadata": meta,
        "parity": (manifest or {}).get("parity"),
    }
