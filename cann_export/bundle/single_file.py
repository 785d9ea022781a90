"""A bundle as one zip: written into an open file (after an om header or from its start) and unpacked
with bounded reads (every member's declared and actual size checked before and while it is read).

The single-file bundle (``-o x.pth`` / ``x.zip``) and the om-stub's payload are the same zip: the bundle's
files under their relative paths, ``manifest.json`` at the root, fixed timestamps (same bundle, same bytes).
"""
from __future__ import annotations

import os
import shutil
import stat
import zipfile
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from ..errors import ValidateError
from ..fs.atomic import is_safe_relpath
from ..load.archives import ZIP_READ_ERRORS, layout_problem

ARCHIVE_SUFFIXES = (".zip", ".pth", ".pt", ".bundle")  # a -o with one of these names one file
BIG_FILE = 16 << 20  # stored, not deflated, past this size (weights barely compress)
MAX_MEMBERS = 10_000
DEFAULT_CAP = 64 << 30  # bytes unpacked at most; CANN_EXPORT_MAX_UNPACK_BYTES changes it
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def unpack_cap() -> int:
    raw = os.environ.get("CANN_EXPORT_MAX_UNPACK_BYTES", "")
    return int(raw) if raw.isdigit() else DEFAULT_CAP


def bundle_files(bundle_dir: Path, exclude: tuple[Path, ...] = ()) -> list[Path]:
    """The regular files of a bundle directory (no symlinks, no staging leftovers), sorted."""
    skip = {p.resolve() for p in exclude}
    files = []
    for p in sorted(bundle_dir.rglob("*")):
        if not p.is_file() or p.is_symlink() or p.resolve() in skip:
            continue
        if any(".cann-tmp-" in part for part in p.relative_to(bundle_dir).parts):
            continue
        files.append(p)
    return files


def write_zip(out: BinaryIO, bundle_dir: Path, files: list[Path]) -> None:
    """Append a zip of ``files`` (under ``bundle_dir``) to ``out`` at its current position."""
    with zipfile.ZipFile(out, "w", allowZip64=True) as zf:
        for f in files:
            info = zipfile.ZipInfo(f.relative_to(bundle_dir).as_posix(), date_time=_ZIP_TIME)
            info.external_attr = (stat.S_IFREG | (f.stat().st_mode & 0o777)) << 16
            size = f.stat().st_size
            info.compress_type = zipfile.ZIP_STORED if size > BIG_FILE else zipfile.ZIP_DEFLATED
            with open(f, "rb") as src, zf.open(info, "w", force_zip64=size >= zipfile.ZIP64_LIMIT) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)


def write_archive(path: Path, bundle_dir: Path) -> None:
    """``path`` (a new file) holding the bundle directory as one zip."""
    with open(path, "wb") as out:
        write_zip(out, bundle_dir, bundle_files(bundle_dir, (path,)))
        out.flush()
        os.fsync(out.fileno())


def commit_archive(staging: Path, target: Path, overwrite: bool) -> list[Path]:
    """Zip the staged bundle directory into ``target`` (one file, renamed into place) and drop the staging."""
    from ..fs import atomic

    box = atomic.staging_dir(target)
    try:
        write_archive(box / target.name, staging)
        placed = atomic.commit_files(box, [target.name], target.parent, overwrite)
    finally:
        atomic.discard(box)
        atomic.discard(staging)
    return placed


def is_bundle_archive(path: Path) -> bool:
    """A zip whose root holds manifest.json (a torch archive keeps everything under one folder)."""
    try:
        if not path.is_file() or not zipfile.is_zipfile(path):
            return False
        with zipfile.ZipFile(path) as zf:
            return "manifest.json" in zf.NameToInfo
    except ZIP_READ_ERRORS:
        return False


def check_members(zf: zipfile.ZipFile, archive_bytes: int, source: Path, what: str) -> list[zipfile.ZipInfo]:
    """Refuse, before anything is read, a member with an unsafe name, a duplicate, an encrypted or unknown
    compression, a declared size our writer never produces (a deflated member past BIG_FILE, a stored one
    whose sizes differ), or a total past the cap."""
    members = zf.infolist()
    if len(members) > MAX_MEMBERS:
        raise ValidateError(f"{what} lists {len(members)} files, more than the {MAX_MEMBERS} a bundle holds; "
                            "refusing to unpack it", path=source)
    names = [m.filename for m in members]
    if len(set(names)) != len(names):
        raise ValidateError(f"{what} lists a file twice; the file is damaged", path=source)
    total = 0
    for m in members:
        if not is_safe_relpath(m.filename) or PurePosixPath(m.filename).name == "":
            raise ValidateError(f"{what} holds an unsafe path {m.filename!r}; refusing to unpack it", path=source)
        if m.flag_bits & 0x1:
            raise ValidateError(f"{what} holds an encrypted member {m.filename!r}; refusing it", path=source)
        if m.compress_type == zipfile.ZIP_STORED:
            if m.file_size != m.compress_size:
                raise ValidateError(f"{what}: stored member {m.filename!r} declares {m.file_size} bytes but "
                                    f"holds {m.compress_size}; the file is damaged or crafted", path=source)
        elif m.compress_type == zipfile.ZIP_DEFLATED:
            if m.file_size > BIG_FILE:
                raise ValidateError(f"{what}: member {m.filename!r} declares {m.file_size} bytes compressed into "
                                    f"{m.compress_size} (cann-export stores members past {BIG_FILE} bytes "
                                    "uncompressed); refusing a likely zip bomb before extraction", path=source)
        else:
            raise ValidateError(f"{what}: member {m.filename!r} uses compression {m.compress_type}, which "
                                "cann-export never writes; refusing it", path=source)
        if m.compress_size > archive_bytes:
            raise ValidateError(f"{what}: member {m.filename!r} declares {m.compress_size} compressed bytes, more "
                                f"than the whole archive ({archive_bytes}); the file is damaged", path=source)
        total += m.file_size
    cap = unpack_cap()
    if total > cap:
        raise ValidateError(f"{what} would unpack to {total} bytes, past the {cap}-byte cap "
                            "(CANN_EXPORT_MAX_UNPACK_BYTES raises it); refusing it", path=source)
    return members


def extract(zf: zipfile.ZipFile, archive_bytes: int, dest: Path, source: Path, what: str) -> list[str]:
    """Unpack the checked members of ``zf`` into ``dest``; a member yielding more than it declared is refused
    mid-copy. Returns the member names."""
    members = check_members(zf, archive_bytes, source, what)
    try:
        for m in members:
            target = dest.joinpath(*PurePosixPath(m.filename).parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            written = 0
            with zf.open(m) as src, open(target, "wb") as dst:
                while block := src.read(1 << 20):
                    written += len(block)
                    if written > m.file_size:
                        raise ValidateError(f"{what}: member {m.filename!r} holds more than the {m.file_size} "
                                            "bytes it declares; refusing it", path=source)
                    dst.write(block)
            if written != m.file_size:
                raise ValidateError(f"{what}: member {m.filename!r} holds {written} bytes, it declares "
                                    f"{m.file_size}; the file is damaged", path=source)
            mode = (m.external_attr >> 16) & 0o777
            if mode:
                os.chmod(target, mode)
    except ZIP_READ_ERRORS as e:
        raise ValidateError(f"{what} is not a readable bundle ({type(e).__name__}: {e}); the file is damaged",
                            path=source) from e
    return [m.filename for m in members]


def extract_archive(path: Path, dest: Path) -> list[str]:
    """Unpack a single-file bundle (a zip with manifest.json at its root) into ``dest``."""
    try:
        with zipfile.ZipFile(path) as zf:
            size = path.stat().st_size
            if why := layout_problem(zf, size):  # two zip readers could see different bundles
                raise ValidateError(f"refused: {why}; this is not the zip the tool writes. Export the bundle "
                                    "again", path=path)
            return extract(zf, size, dest, path, "the bundle archive")
    except ZIP_READ_ERRORS as e:
        raise ValidateError(f"not a readable bundle archive ({e}); the file is damaged", path=path) from e

