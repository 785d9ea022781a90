"""Reading existing artifacts: atc_ready / om bundles (directories or single-file archives), om-stubs and
plain .onnx files. Nothing a manifest says is trusted before it is checked: its shape here, its claims in
``bundle_check``."""
from __future__ import annotations

import contextlib
import json
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import ValidateError
from ..fs import digests
from ..fs.atomic import is_safe_relpath
from . import single_file as bundle_zip

MODEL_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.onnx")


def read_bundle(path: Path) -> dict[str, Any]:
    """The manifest of a bundle directory, after checking that it has the shape this tool writes
    (a malformed manifest is a refusal naming every problem, never a KeyError later on)."""
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
                            path=manifest_path) from e
    problems = manifest_problems(manifest)
    if problems:
        raise ValidateError("manifest.json is malformed: " + "; ".join(problems)
                            + ". The bundle is damaged or was edited; export it again", path=manifest_path)
    return manifest


def _is_str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _is_values(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) and isinstance(v.get("name"), str) for v in value)


def manifest_problems(manifest: Any) -> list[str]:
    """Everything about the manifest's shape that differs from what an export writes."""
    if not isinstance(manifest, dict):
        return ["not a JSON object"]
    problems = []
    if not isinstance(manifest.get("schema"), str) or not manifest["schema"].startswith("cann-export/manifest/"):
        problems.append("schema: missing or not a cann-export manifest schema")
    if not isinstance(manifest.get("format"), str):
        problems.append("format: missing or not a string")
    model = manifest.get("model")
    if not isinstance(model, dict):
        problems.append("model: missing or not an object")
    else:
        if not isinstance(model.get("file"), str) or not MODEL_FILE.fullmatch(model["file"]):
            problems.append(f"model.file: {model.get('file')!r} is not a plain .onnx file name")
        for key in ("inputs", "outputs"):
            if not _is_values(model.get(key)):
                problems.append(f"model.{key}: missing or not a list of named values")
        ops = model.get("ops")
        if not isinstance(ops, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in ops.values()):
            problems.append("model.ops: missing or not an op histogram")
    for key in ("metadata", "provenance"):
        if key in manifest and not isinstance(manifest[key], dict):
            problems.append(f"{key}: not an object")
    if isinstance(manifest.get("metadata"), dict) and not _is_str_map(manifest["metadata"]):
        problems.append("metadata: values must be strings")
    files = manifest.get("files")
    if not isinstance(files, dict):
        problems.append("files: the file table is missing or not an object")
    else:
        for rel, entry in files.items():
            if not isinstance(entry, dict) or not digests.is_sha256(entry.get("sha256")) \
                    or not isinstance(entry.get("size"), int) or isinstance(entry.get("size"), bool) \
                    or entry["size"] < 0:
                problems.append(f"files[{rel!r}]: not a {{sha256, size}} entry")
    parity = manifest.get("parity")
    if not isinstance(parity, dict) or not isinstance(parity.get("validated"), bool):
        problems.append("parity: the parity section is missing or has no 'validated' flag")
    elif parity["validated"]:
        if not isinstance(parity.get("passed"), bool):
            problems.append("parity.passed: missing or not true/false")
        if "tolerance" in parity and not (isinstance(parity["tolerance"], dict) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in parity["tolerance"].values())):
            problems.append("parity.tolerance: not an object of numbers")
        if not isinstance(parity.get("outputs", []), list):
            problems.append("parity.outputs: not a list")
        if "precision" in parity and not (isinstance(parity["precision"], dict)
                                          and isinstance(parity["precision"].get("mode"), str)):
            problems.append("parity.precision: not an object with a mode")
    atc = manifest.get("atc")
    if manifest.get("format") in ("atc_ready", "om") or atc is not None:
        if not isinstance(atc, dict):
            problems.append("atc: missing or not an object")
        else:
            for key in ("soc_version", "precision_mode"):
                if not isinstance(atc.get(key), str):
                    problems.append(f"atc.{key}: missing or not a string")
            if not isinstance(atc.get("hints", {}), dict):
                problems.append("atc.hints: not an object")
            command = atc.get("command")
            if command is not None and not (isinstance(command, list) and all(isinstance(a, str) for a in command)):
                problems.append("atc.command: not a list of strings")
    return problems


def verify_files(path: Path, manifest: dict[str, Any]) -> None:
    """Every file listed in the manifest exists with its recorded size and sha256; collect all problems."""
    problems = file_problems(path, manifest)
    if problems:
        raise ValidateError("bundle files do not match the manifest: " + "; ".join(problems)
                            + ". Re-export or restore the bundle", path=path)


def file_problems(path: Path, manifest: dict[str, Any]) -> list[str]:
    """The file table checked against the directory; every path is validated before it touches the disk."""
    problems = []
    files = manifest.get("files")
    if not isinstance(files, dict):
        return ["the manifest lists no valid file table"]
    root = path.resolve()
    for rel, entry in files.items():
        if not isinstance(rel, str) or not is_safe_relpath(rel):
            problems.append(f"{rel!r}: not a path inside the bundle (refused)")
            continue
        if not isinstance(entry, dict) or not digests.is_sha256(entry.get("sha256")):
            problems.append(f"{rel}: malformed file-table entry")
            continue
        f = path / rel
        if f.is_symlink() or (f.exists() and not f.resolve().is_relative_to(root)):
            problems.append(f"{rel}: a link out of the bundle (refused)")
        elif not f.is_file():
            problems.append(f"{rel}: missing")
        elif f.stat().st_size != entry.get("size") or digests.sha256_file(f) != entry["sha256"]:
            problems.append(f"{rel}: contents changed (sha256 mismatch)")
    model_file = (manifest.get("model") or {}).get("file")
    if isinstance(model_file, str) and model_file not in files:
        problems.append(f"{model_file}: the graph is not in the file table")
    return problems


def manifest_sha256(directory: Path) -> str | None:
    f = directory / "manifest.json"
    return digests.sha256_file(f) if f.is_file() else None


def artifact_kind(path: Path) -> str | None:
    """What cann-export artifact ``path`` is, by a cheap look: "bundle" (a directory with manifest.json),
    "archive" (a single-file bundle), "om" (an om file), "onnx", or None for anything else."""
    from . import om_stub

    path = Path(path)
    if path.is_dir():
        return "bundle" if (path / "manifest.json").is_file() else None
    if om_stub.is_om_file(path):
        return "om"
    if bundle_zip.is_bundle_archive(path):
        return "archive"
    return "onnx" if path.suffix == ".onnx" and path.is_file() else None


@contextlib.contextmanager
def open_artifact(path: Path) -> Iterator[Path]:
    """Yield a bundle directory for ``path``: a directory as is; an om-stub or a single-file bundle
    (``x.pth`` / ``x.zip``) unpacked with bounded reads into a temporary directory (removed afterwards).
    Any other file is yielded unchanged. Errors name ``path``, not the temporary directory."""
    from . import om_stub

    path = Path(path)
    kind = artifact_kind(path)
    if kind not in ("om", "archive"):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="cann-export-unpacked-") as tmp:
        directory = Path(tmp)
        if kind == "om":
            om_stub.extract_stub(path, directory)
        else:
            bundle_zip.extract_archive(path, directory)
        try:
            yield directory
        except ValidateError as e:
            if e.path and e.path.startswith(str(directory)):
                e.path = str(path) + e.path[len(str(directory)):]
            raise
