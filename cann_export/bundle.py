"""Reading existing artifacts: atc_ready / om bundles, om-stubs and plain .onnx files."""
from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .atomic import sha256_file
from .errors import ValidateError


def read_bundle(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ValidateError("bundle not found; pass the directory an atc_ready export wrote", path=path)
    manifest_path = path / "manifest.json"
    if not path.is_dir() or not manifest_path.is_file():
        raise ValidateError("not an atc_ready bundle (no manifest.json); pass the directory an atc_ready "
                            "export wrote", path=path)
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValidateError(f"manifest.json is not valid JSON ({e}); the bundle is damaged, export it again",
                            path=manifest_path) from None
    if not isinstance(manifest, dict):
        raise ValidateError("manifest.json is not a cann-export manifest (not an object); the bundle is damaged",
                            path=manifest_path)
    return manifest


def verify_files(path: Path, manifest: dict[str, Any]) -> None:
    """Every file listed in the manifest exists with its recorded sha256; collect all problems."""
    from .atomic import is_safe_relpath

    problems = []
    files = manifest.get("files") or {}
    if not isinstance(files, dict):
        raise ValidateError("manifest.json lists no valid file table; the bundle is damaged", path=path)
    for rel, entry in files.items():
        if not is_safe_relpath(str(rel)):
            problems.append(f"{rel!r}: not a path inside the bundle (refused)")
            continue
        f = path / rel
        if not f.is_file():
            problems.append(f"{rel}: missing")
        elif f.stat().st_size != entry["size"] or sha256_file(f) != entry["sha256"]:
            problems.append(f"{rel}: contents changed (sha256 mismatch)")
    if problems:
        raise ValidateError("bundle files do not match the manifest: " + "; ".join(problems)
                            + ". Re-export or restore the bundle", path=path)


@contextlib.contextmanager
def open_artifact(path: Path) -> Iterator[Path]:
    """Yield a bundle directory for ``path``: a directory as is, an om-stub unpacked into a temporary
    directory (verified first; removed afterwards). Any other file is yielded unchanged."""
    from . import om_stub

    path = Path(path)
    if not om_stub.is_om_file(path):
        yield path
        return
    with om_stub.extracted(path) as directory:
        try:
            yield directory
        except ValidateError as e:  # name the stub, not the temporary directory it was unpacked into
            if e.path and e.path.startswith(str(directory)):
                e.path = str(path) + e.path[len(str(directory)):]
            raise


def describe(path: Path) -> dict[str, Any]:
    from . import om_stub

    if not path.exists():
        raise ValidateError("path not found", path=path, stage="inspect")
    if om_stub.is_om_file(path):
        import tempfile

        with tempfile.TemporaryDirectory(prefix="cann-export-om-") as tmp:
            try:
                header = om_stub.extract_stub(path, tmp)
                info = _describe(Path(tmp))
            except ValidateError as e:
                e.stage = "inspect"
                raise
        info.update({"path": str(path), "kind": "om-stub", "om": header})
        return info
    return _describe(path)


def _describe(path: Path) -> dict[str, Any]:
    import onnx

    from .onnx_utils import describe_values, op_histogram, opset_of

    manifest = None
    onnx_path = path
    if path.is_dir():
        manifest = read_bundle(path)
        onnx_path = path / (manifest.get("model", {}).get("file") or "model.onnx")
    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf raises DecodeError and friends
        raise ValidateError(f"not a readable ONNX model ({type(e).__name__}); pass an .onnx file or a bundle",
                            path=onnx_path, stage="inspect") from None
    meta = {p.key: p.value for p in model.metadata_props}
    info = {
        "path": str(path),
        "kind": (manifest.get("format") or "atc_ready") if manifest else "onnx",
        "opset": opset_of(model),
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "inputs": describe_values(model.graph.input),
        "outputs": describe_values(model.graph.output),
        "ops": op_histogram(model),
        "nodes": len(model.graph.node),
        "metadata": meta,
        "parity": (manifest or {}).get("parity"),
    }
    if manifest:
        info["atc"] = manifest.get("atc")
        info["files"] = sorted(manifest.get("files", {}))
    return info
