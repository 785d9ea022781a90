"""sha256 of files and streams, and the file table a manifest lists (one helper for the whole code)."""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

_BLOCK = 1 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")
# the digests of the innermost remembered() block of this thread / task (a ContextVar: a new thread starts empty)
_REMEMBERED: contextvars.ContextVar[dict[tuple[int, ...], str] | None] = contextvars.ContextVar("digests_remembered",
                                                                                                default=None)


def sha256_stream(f: BinaryIO, limit: int | None = None, h: Any = None) -> str:
    """sha256 of what ``f`` yields from its position (at most ``limit`` bytes); ``h`` continues a digest."""
    h = h or hashlib.sha256()
    left = limit
    while left is None or left > 0:
        block = f.read(_BLOCK if left is None else min(_BLOCK, left))
        if not block:
            break
        h.update(block)
        if left is not None:
            left -= len(block)
    return h.hexdigest()


def sha256_file(path: str | Path) -> str:
    with open(path, "rb") as f:
        memo = _REMEMBERED.get()
        if memo is None:
            return sha256_stream(f)
        st = os.fstat(f.fileno())  # the file opened, whatever its path: an unchanged one has the same identity
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if key not in memo:
            memo[key] = sha256_stream(f)
        return memo[key]


@contextlib.contextmanager
def remembered() -> Iterator[None]:
    """Within the block a file hashed again, unchanged (same device, inode, size, mtime and ctime), is not read
    again: one check hashes each file once, though it checks a table it has just built, or the same file under
    two tables (a multi-graph bundle's and its component's: GPT-2 small, 1 GB read twice). A write changes the
    ctime, so a changed file is hashed anew, except a same-size rewrite within one tick of a file system's
    coarse clock: use the block only around hashes between which nothing of ours writes the files (a commit's
    table and its check, a finished bundle's checks)."""
    token = _REMEMBERED.set({})
    try:
        yield
    finally:
        _REMEMBERED.reset(token)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_sha256(value: Any) -> bool:
    """Whether ``value`` is a sha256 as this tool writes it: 64 lowercase hex digits."""
    return isinstance(value, str) and _HEX64.fullmatch(value) is not None


def file_table(root: Path, exclude: Iterable[str] = ("manifest.json",)) -> dict[str, dict[str, Any]]:
    """sha256 and size of every regular file under ``root``, keyed by relative POSIX path (sorted);
    symlinks and this tool's own staging leftovers are not listed."""
    skip = set(exclude)
    table = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        rel = path.relative_to(root).as_posix()
        if rel in skip or any(".cann-tmp-" in part for part in rel.split("/")):
            continue
        table[rel] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    return table
