"""File helpers: hashed copies with fsync, file tables, stale staging clean-up."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any

BLOCK = 8 << 20
STALE_SECONDS = 6 * 3600
_HOST = socket.gethostname().replace("-", "_")[:40] or "host"


def _writeback_starter() -> Any:
    """Linux ``sync_file_range(fd, offset, n, SYNC_FILE_RANGE_WRITE)``: start writing a range to disk without
    waiting, so the closing fsync overlaps with the copy instead of following it. None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.sync_file_range
        fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        return lambda fd, off, n: fn(fd, off, n, 2)  # SYNC_FILE_RANGE_WRITE
    except (OSError, AttributeError):
        return None


_START_WRITEBACK = _writeback_starter()


def copy_hashed(src: Path, dst: Path) -> dict[str, Any]:
    """Copy ``src`` to ``dst`` in one pass, hashing as it goes; fsync before returning (writeback is started
    block by block, so most of the fsync happens during the copy)."""
    h = hashlib.sha256()
    dst.parent.mkdir(parents=True, exist_ok=True)
    size = 0
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    with open(src, "rb", buffering=0) as fin, open(dst, "wb", buffering=0) as fout:
        while True:
            n = fin.readinto(buf)
            if not n:
                break
            h.update(view[:n])
            fout.write(view[:n])
            if _START_WRITEBACK is not None:
                _START_WRITEBACK(fout.fileno(), size, n)
            size += n
        os.fsync(fout.fileno())
    return {"sha256": h.hexdigest(), "size": size}


def hash_file(path: Path) -> dict[str, Any]:
    from ..fs.digests import sha256_file

    return {"sha256": sha256_file(path), "size": path.stat().st_size}


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def manifest_bytes(data: Any) -> bytes:
    """The bytes a manifest is stored as (the same in every store, so its sha256 can be pinned)."""
    return (json.dumps(data, indent=2, default=str) + "\n").encode("utf-8")


def write_json(path: Path, data: Any) -> str:
    """Write JSON to a temp name beside ``path``, fsync, os.replace; returns the sha256 of the bytes."""
    body = manifest_bytes(data)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "wb") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return hashlib.sha256(body).hexdigest()


def file_table(root: Path, known: dict[str, dict[str, Any]], exclude: tuple[str, ...] = ("manifest.json",)) -> dict:
    table = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel in exclude:
            continue
        table[rel] = known.get(rel) or hash_file(path)
    return table


def new_staging(tmp_root: Path) -> Path:
    """A fresh staging directory named after this host and process, so stale ones can be recognised."""
    tmp_root.mkdir(parents=True, exist_ok=True)
    path = tmp_root / f"{_HOST}-{os.getpid()}-{int(time.time())}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    return path


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(tmp_root: Path) -> list[str]:
    """Remove staging entries left by dead publishers (same host: the pid is gone; else older than 6 h)."""
    removed = []
    if not tmp_root.is_dir():
        return removed
    now = time.time()
    for entry in tmp_root.iterdir():
        parts = entry.name.split("-")
        stale = False
        if len(parts) >= 3 and parts[0] == _HOST and parts[1].isdigit():
            stale = int(parts[1]) != os.getpid() and not pid_alive(int(parts[1]))
        if not stale:
            try:
                stale = now - entry.stat().st_mtime > STALE_SECONDS
            except OSError:
                continue
        if stale:
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
            removed.append(entry.name)
    return removed


VOLATILE = ("name", "version", "digest", "created_utc", "created_by", "tools", "source", "signature")


def manifest_digest(manifest: dict[str, Any]) -> str:
    """The content digest: everything but who/when/where (those are set at commit)."""
    return canonical_digest({k: v for k, v in manifest.items() if k not in VOLATILE})


def canonical_digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str, separators=(",", ":")).encode()).hexdigest()
