"""``pull``: copy a verified version into a directory, atomically; ``--overwrite`` replaces only a
directory that is an earlier pull (a zoo manifest we can read, holding only the files it lists)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .zoo_errors import ZooError
from .resolve import copy_verified, open_store, parse_ref, pick_target


def _is_pulled_bundle(out: Path) -> str | None:
    """None when ``out`` is a directory a pull wrote (its files are exactly its manifest's); else why not."""
    from .schema import check_manifest

    manifest_path = out / "manifest.json"
    if not out.is_dir():
        return "it is not a directory"
    if (out / "index.sqlite").exists() or (out / "models").is_dir() or (out / "blobs").is_dir():
        return "it looks like a model zoo root"
    try:
        manifest = check_manifest(json.loads(manifest_path.read_bytes()), str(out))
    except (OSError, ValueError, ZooError):
        return "it holds no zoo manifest.json we can read"
    listed = set(manifest["files"]) | {"manifest.json"}
    present = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() or p.is_symlink()}
    extra = sorted(present - listed)
    if extra:
        return f"it holds files the pulled version does not list ({', '.join(extra[:3])})"
    return None


def _check_output(given_path: Path, overwrite: bool, store: Any, given: Any) -> None:
    if given_path.is_symlink():
        raise ZooError("output is a symbolic link; pull into a real directory", path=given)
    out = given_path.resolve()
    cwd = Path.cwd().resolve()
    if out == cwd or out in cwd.parents or out.parent == out:
        raise ZooError("refusing to replace the current directory or one of its parents; pull into a new "
                       "directory, e.g. -o ./model", path=given)
    if not store.remote:
        zoo_root = Path(store.root).resolve()
        if out == zoo_root or out in zoo_root.parents or zoo_root in out.parents:
            raise ZooError("refusing to write into or over the model zoo itself; pull into a directory outside "
                           f"the zoo ({zoo_root})", path=given)
    if not (out.exists() or out.is_symlink()):
        return
    if not overwrite:
        raise ZooError("output already exists; pass --overwrite or choose another directory", path=out)
    why = _is_pulled_bundle(out)
    if why:
        raise ZooError(f"--overwrite replaces only a directory an earlier pull wrote, and {why}; nothing was "
                       "changed. Pull into a new directory, or remove it yourself if it is yours to remove",
                       path=out)


def pull(ref: str, output: str | os.PathLike, version: str | None = None, target: str | None = None,
         overwrite: bool = False, zoo: Any = None, verify_signature: Any = None,
         trust_state: str | os.PathLike | None = None) -> dict[str, Any]:
    """Copy a verified version (only ``target``'s artifact when given) into ``output``, atomically.
    ``verify_signature``: an ed25519 public key the version (and an alias's record) must be signed with;
    ``trust_state``: the client's trusted alias state (see trust.py)."""
    from ..fs import atomic
    from .aliases import resolve_checked
    from .verify import selected

    store = open_store(zoo)
    name, ref_v = parse_ref(ref, version)
    chosen, manifest, manifest_sha, alias = resolve_checked(store, name, ref_v, verify_signature, trust_state)
    only, key = None, None
    if target is not None:
        key = pick_target(name, chosen, manifest, target, required=True)
        only = [p for p in manifest["files"] if not p.startswith("artifacts/")] + [manifest["artifacts"][key]["path"]]
    out = Path(os.path.abspath(output))
    _check_output(out, overwrite, store, output)
    staging = atomic.staging_dir(out)
    try:  # each file hashed while it is copied: what lands in the output is what was checked
        copy_verified(store, name, chosen, manifest, only, staging)
        (staging / "manifest.json").write_bytes(store.raw_manifest(name, chosen))
        atomic.commit_dir(staging, out, overwrite)
    except BaseException:
        atomic.discard(staging)
        raise
    files = sorted(selected(manifest, only))
    return {"ok": True, "name": name, "version": chosen, "digest": manifest["digest"],
            "manifest_sha256": manifest_sha, "output": str(out), "files": files, "target": key,
            **({"alias": alias} if alias else {})}
