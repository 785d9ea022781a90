"""sha256 checks of a version's files against its manifest."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .file_copies import hash_file


def selected(manifest: dict[str, Any], only: list[str] | None) -> dict[str, dict[str, Any]]:
    """The manifest's files, restricted to those under the ``only`` prefixes (None: all)."""
    files = manifest.get("files") or {}
    if only is None:
        return dict(files)
    return {rel: e for rel, e in files.items() if any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in only)}


def check_file(path: Path, rel: str, entry: dict[str, Any]) -> str | None:
    if not path.is_file():
        return f"{rel}: missing"
    if path.stat().st_size != entry["size"]:
        return f"{rel}: size {path.stat().st_size} != {entry['size']} recorded (file changed)"
    if hash_file(path)["sha256"] != entry["sha256"]:
        return f"{rel}: sha256 mismatch (file changed)"
    return None


def check_dir(root: Path, manifest: dict[str, Any], only: list[str] | None = None) -> list[str]:
    """Every selected file exists with its recorded size and sha256 (hashed on a few threads)."""
    from concurrent.futures import ThreadPoolExecutor

    items = sorted(selected(manifest, only).items())
    if len(items) <= 1:
        return [p for rel, e in items if (p := check_file(root / rel, rel, e))]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda item: check_file(root / item[0], item[0], item[1]), items))
    return [p for p in results if p]
