"""sha256 of files and streams, and the file table a manifest lists (one helper for the whole code)."""
from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

_BLOCK = 1 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")
# sha256 of the files file_table hashed in this process, by (device, inode, size, mtime, ctime): a multi-graph
# bundle's table lists its components' files, hashed moments before for their own manifests (a directory rename
# keeps every one of those). Any write, rename, chmod or utime of a file changes its ctime.
_KNOWN: dict[tuple[int, int, int, int, int], str] = {}
_KNOWN_MAX = 4096
_SETTLED_NS = 50_000_000  # a file changed less long before it was hashed is not kept (a timestamp is one tick)


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
        return sha256_stream(f)


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
        digest, size = _table_entry(path)
        table[rel] = {"sha256": digest, "size": size}
    return table


def _table_entry(path: Path) -> tuple[str, int]:
    """sha256 and size of ``path``: read unless file_table hashed this very file before and nothing changed it
    since; kept when nothing changed it while it was read and it was last changed before the read began (a
    change after that gets a later timestamp)."""
    before = os.stat(path)
    key = _stat_key(before)
    known = _KNOWN.get(key)
    if known is not None:
        return known, before.st_size
    start = time.time_ns()
    digest = sha256_file(path)
    after = os.stat(path)
    if _stat_key(after) == key and max(before.st_mtime_ns, before.st_ctime_ns) < start - _SETTLED_NS:
        if len(_KNOWN) >= _KNOWN_MAX:
            del _KNOWN[next(iter(_KNOWN))]
        _KNOWN[key] = digest
    return digest, after.st_size


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns
