"""What an artifact holds (``cann-export inspect``), shown only after the artifact was checked: a bundle
whose manifest does not match its files, graph or ATC options is refused rather than its claims shown.
What is particular to a format (an om-stub's header, say) comes from that Format's ``describe``."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ValidateError
from ..hooks.contracts import Container, Format, optional
from . import coverage, om_header, rederive, single_file
from .manifest_schema import has_atc
from .read import manifest_sha256, open_bundle

PLAIN_ONNX = "onnx"  # the kind of a plain .onnx file (no manifest, so no format)


def describe(path: Path) -> dict[str, Any]:
    """What an artifact holds, after checking it (inspect refuses a bundle whose manifest does not match
    its files, graph or ATC options rather than show edited claims)."""
    path = Path(path)
    if not path.exists():
        raise ValidateError("path not found", path=path, stage="inspect")
    if om_header.claims_compiled(path):  # a compiled ATC model: its header (and atc's JSON), no bundle
        return om_header.describe_real_om(path)
    own: dict[str, Any] = {}  # what the artifact's Formats add
    try:
        with open_bundle(path) as (directory, container):
            if directory.is_dir():
                info, own = _describe_bundle(directory, container)
            else:
                info = _describe(directory, None)
    except ValidateError as e:
        e.stage = "inspect"
        raise
    if container is None and single_file.is_bundle_archive(path):
        info["container"] = "archive"
    if path.is_file():  # a single-file bundle, an om-stub or an .onnx file: the file's own size
        info["size_bytes"] = path.stat().st_size
    info["path"] = str(path)
    return {**info, **own}


def _describe_bundle(directory: Path, container: Container | None) -> tuple[dict[str, Any], dict[str, Any]]:
    checked = rederive.check_bundle(directory, container=container)
    manifest = checked.manifest
    info = _describe(directory / manifest["model"]["file"], manifest)
    info["manifest_sha256"] = manifest_sha256(directory)
    info["files"] = sorted(manifest["files"])
    info["size_bytes"] = (directory / "manifest.json").stat().st_size + sum(
        int(f.get("size") or 0) for f in manifest["files"].values() if isinstance(f, dict))
    info["lint"] = manifest.get("lint") or {}
    info["warnings"] = manifest.get("warnings") or {}
    if has_atc(manifest):
        info["atc"] = {**manifest["atc"], "command": checked.command}
        info["atc_cfg"] = {rel: (directory / rel).read_text(encoding="utf-8", errors="replace")[:4000]
                           for rel in info["files"] if rel.startswith("atc/") and rel.endswith(".cfg")}
    own: dict[str, Any] = {}
    for fmt in rederive.artifact_formats(checked):
        extra = optional(fmt, Format, "describe")
        own.update(extra(checked) if extra else {})
    return info, own


def _describe(onnx_path: Path, manifest: dict[str, Any] | None) -> dict[str, Any]:
    import onnx

    from ..graph.onnx_helpers import describe_values, op_histogram, opset_of

    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as e:
        raise ValidateError(f"not a readable ONNX model ({type(e).__name__}); pass an .onnx file or a bundle",
                            path=onnx_path, stage="inspect") from e
    meta = {p.key: p.value for p in model.metadata_props}
    return {
        "path": str(onnx_path),
        "kind": manifest["format"] if manifest else PLAIN_ONNX,
        "opset": opset_of(model),
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "inputs": describe_values(model.graph.input),
        "outputs": describe_values(model.graph.output),
        "ops": op_histogram(model),
        "nodes": len(model.graph.node),
        "metadata": meta,
        "parity": (manifest or {}).get("parity"),
        **({"coverage": covered} if manifest and (covered := coverage.of(manifest)) else {}),
    }
