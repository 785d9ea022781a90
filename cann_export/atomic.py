"""Atomic writes: everything goes to a temp name beside its target and is renamed into place."""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path

from .errors import WriteError


def staging_dir(target: Path) -> Path:
    """A fresh hidden directory beside ``target`` (same filesystem, so renames are atomic)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.cann-tmp-", dir=target.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)  # mkdtemp's 0700 would follow the artifact into place
    return staging


def write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def check_target(target: Path, overwrite: bool) -> None:
    if target.exists() and not overwrite:
        raise WriteError("output already exists; pass --overwrite (overwrite=True) or choose another path",
                         path=target)


def commit_dir(staging: Path, target: Path, overwrite: bool) -> None:
    """Rename a staged directory onto ``target``; an old target is moved aside first, then removed."""
    check_target(target, overwrite)
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.cann-old-{uuid.uuid4().hex[:8]}")
        os.replace(target, old)
    os.replace(staging, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()


def commit_files(staging: Path, names: list[str], target_dir: Path, overwrite: bool) -> list[Path]:
    """Rename staged files into ``target_dir``; the last name is the primary file and goes last."""
    for name in names:
        check_target(target_dir / name, overwrite)
    placed = []
    for name in names:
        os.replace(staging / name, target_dir / name)
        placed.append(target_dir / name)
    shutil.rmtree(staging, ignore_errors=True)
    return placed


def discard(staging: Path | None) -> None:
    if staging is not None and staging.exists():
        shutil.rmtree(staging, ignore_errors=True)


def is_safe_relpath(rel: str) -> bool:
    """A relative POSIX path that stays inside its root: no absolute path, '..', backslash or empty part."""
    from pathlib import PurePosixPath

    p = PurePosixPath(rel)
    return bool(rel) and not rel.endswith("/") and not p.is_absolute() and "\\" not in rel \
        and all(part not in ("..", "", ".") for part in p.parts)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
