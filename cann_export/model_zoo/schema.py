"""A stored manifest is untrusted input: before any name in it touches a path (the version directory, a
blob in the cache, an S3 key), its digest is re-derived and every content-derived name is validated."""
from __future__ import annotations

import re
from typing import Any

from .zoo_errors import ZooIntegrityError
from .file_copies import manifest_digest
from .names import is_relpath, is_sha256

_TARGET = re.compile(r"^[A-Za-z0-9._+-]{1,200}$")
ARCH_KINDS = ("torch.export", "callable", "diffusers-pipeline")


def _refuse(where: str, what: str) -> ZooIntegrityError:
    return ZooIntegrityError(f"{where}: manifest.json {what}; refused, nothing was read or written. The store "
                             "was edited by hand or forged: restore the version or publish it again")


def _check_files(files: Any, where: str) -> None:
    if not isinstance(files, dict):
        raise _refuse(where, "has no file table")
    for rel, entry in files.items():
        if not is_relpath(rel) or rel == "manifest.json":
            raise _refuse(where, f"lists a path outside the version ({str(rel)[:120]!r})")
        if not isinstance(entry, dict) or not is_sha256(entry.get("sha256")):
            raise _refuse(where, f"gives {rel[:120]!r} a sha256 that is not 64 hex digits "
                                 f"({str((entry or {}).get('sha256') if isinstance(entry, dict) else entry)[:80]!r})")
        size = entry.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise _refuse(where, f"gives {rel[:120]!r} an invalid size")


def _listed(files: dict[str, Any], rel: Any, where: str, what: str) -> None:
    if not is_relpath(rel) or rel not in files:
        raise _refuse(where, f"names a {what} file that is not in its file table ({str(rel)[:120]!r})")


def _check_sections(manifest: dict[str, Any], where: str) -> None:
    files = manifest["files"]
    weights = manifest.get("weights")
    if weights is not None:
        if not isinstance(weights, dict):
            raise _refuse(where, "has a malformed weights section")
        _listed(files, weights.get("file"), where, "weights")
    arch = manifest.get("architecture")
    if arch is not None:
        if not isinstance(arch, dict) or arch.get("kind") not in ARCH_KINDS:
            raise _refuse(where, f"has an unknown architecture kind ({str(arch)[:80]})")
        if arch["kind"] == "torch.export":
            _listed(files, arch.get("file"), where, "torch.export program")
        elif arch["kind"] == "diffusers-pipeline":  # the model_index.json of an artifact's pipeline/ folder
            _listed(files, arch.get("file"), where, "pipeline")
            if arch["file"] != f"artifacts/{arch.get('from_artifact')}/pipeline/model_index.json":
                raise _refuse(where, "names a pipeline outside its artifact's pipeline/ folder")
        elif not isinstance(arch.get("callable"), str) or not isinstance(arch.get("kwargs", {}), dict):
            raise _refuse(where, "has a malformed callable architecture")
    arts = manifest.get("artifacts") or {}
    if not isinstance(arts, dict):
        raise _refuse(where, "has a malformed artifacts section")
    for key, art in arts.items():
        if not isinstance(key, str) or not _TARGET.fullmatch(key) or key in (".", ".."):
            raise _refuse(where, f"has an artifact target that is not a plain name ({str(key)[:80]!r})")
        if not isinstance(art, dict) or art.get("path") != f"artifacts/{key}" or not is_relpath(art.get("model_file")):
            raise _refuse(where, f"gives artifact {key} a path outside artifacts/{key}")


def check_manifest(manifest: Any, where: str, expected: str | None = None, name: str | None = None,
                   version: str | None = None) -> dict[str, Any]:
    """Refuse a manifest edited after publish (its digest no longer matches, or differs from the index), one
    stored under another name/version than it says, or one whose file table, digests or section paths would
    point outside the version directory or the blob store."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict) or "digest" not in manifest:
        raise ZooIntegrityError(f"{where}: manifest.json is not a cann-export zoo manifest; nothing was loaded")
    _check_files(manifest["files"], where)
    actual = manifest_digest(manifest)
    if actual != manifest["digest"] or (expected is not None and expected != actual):
        raise ZooIntegrityError(f"{where}: manifest.json was changed after publish (digest mismatch); nothing was "
                                "loaded. Restore the version or publish it again")
    if ((name is not None and manifest.get("name") != name)
            or (version is not None and manifest.get("version") != version)):
        raise _refuse(where, f"says it is {str(manifest.get('name'))[:80]} version {str(manifest.get('version'))[:80]}")
    _check_sections(manifest, where)
    return manifest
