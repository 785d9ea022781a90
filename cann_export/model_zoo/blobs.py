"""Reading a stored blob: streamed, hashed as it is read, bounded by the size the manifest records, and
compared with the manifest's sha256 before anything uses the bytes (a copy is renamed into place only
when it matched, so what a loader opens is exactly what was hashed)."""
from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from .zoo_errors import ZooIntegrityError

BLOCK = 8 << 20


def open_regular(path: Path, rel: str) -> BinaryIO:
    """``path`` opened for reading, refused unless it is a regular file (no symlink, FIFO or device: a
    planted FIFO would block the reader, /dev/zero would never end)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError as e:
        raise ZooIntegrityError(f"{rel}: missing") from e
    except OSError as e:
        raise ZooIntegrityError(f"{rel}: cannot be opened ({type(e).__name__}: {e}); not a regular file") from e
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ZooIntegrityError(f"{rel}: not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb", buffering=0)


def _blocks(src: BinaryIO, size: int, rel: str) -> Any:
    """The first ``size`` bytes of ``src`` in blocks; raises when it holds fewer or more (one byte past
    ``size`` is all that is ever read beyond it)."""
    left = size
    while left > 0:
        block = src.read(min(BLOCK, left))
        if not block:
            raise ZooIntegrityError(f"{rel}: size {size - left} < {size} recorded (file changed)")
        left -= len(block)
        yield block
    if src.read(1):
        raise ZooIntegrityError(f"{rel}: longer than the {size} bytes recorded (file changed)")


def stream_problem(src: BinaryIO, rel: str, entry: dict[str, Any]) -> str | None:
    """Why ``src`` is not the file ``entry`` records (size, sha256), or None when it is."""
    h = hashlib.sha256()
    try:
        for block in _blocks(src, entry["size"], rel):
            h.update(block)
    except ZooIntegrityError as e:
        return e.message
    return None if h.hexdigest() == entry["sha256"] else f"{rel}: sha256 mismatch (file changed)"


def copy_checked(src: BinaryIO, dst: Path, rel: str, entry: dict[str, Any]) -> None:
    """Stream ``src`` into ``dst`` (a temp name beside it, renamed only when size and sha256 match ``entry``);
    raises ZooIntegrityError otherwise, leaving nothing at ``dst``."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.{os.urandom(4).hex()}.part")
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            for block in _blocks(src, entry["size"], rel):
                h.update(block)
                out.write(block)
        if h.hexdigest() != entry["sha256"]:
            raise ZooIntegrityError(f"{rel}: sha256 mismatch (file changed)")
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def copy_tree_checked(root: Path, files: dict[str, dict[str, Any]], dest: Path) -> list[str]:
    """Copy each of ``files`` (rel -> entry) from ``root`` into ``dest``, verified while streaming; the
    problems (one line per refused file)."""
    problems = []
    for rel, entry in sorted(files.items()):
        try:
            with open_regular(root / rel, rel) as src:
                copy_checked(src, dest / rel, rel, entry)
        except ZooIntegrityError as e:
            problems.append(e.message)
    return problems
