"""Bounded reading of zip archives someone else wrote (torch.export .pt2, TorchScript, zip torch.save files,
om-stub payloads): every member's name and size is checked before any byte of it is read.

``open_checked(path)`` refuses, before reading any member:
- names that could leave a directory (absolute, ``..``, backslashes, drive letters, NUL) or that appear
  twice (Python's zipfile and torch's miniz reader could then pick different entries);
- a member whose declared size is above the cap (``CANN_EXPORT_MAX_MEMBER_BYTES``, default 64 GiB) or
  whose declared total exceeds what the archive's size can hold (``EXPANSION`` times the archive plus
  ``SLACK_BYTES``: torch stores members uncompressed, so a 3 MB archive declaring 3 GiB is a bomb);
- members whose data would lie outside the file.
``read_member`` then reads at most the declared size (the actual bytes are counted while streaming).
"""
from __future__ import annotations

import io
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import LoadError

DEFAULT_MAX_MEMBER_BYTES = 64 << 30
EXPANSION = 16  # declared uncompressed total <= EXPANSION * archive size + SLACK_BYTES
SLACK_BYTES = 64 << 20
_CHUNK = 1 << 20
_DRIVE = re.compile(r"^[A-Za-z]:")


class ArchiveError(LoadError):
    """An archive refused before its members were read (unsafe name, bomb, malformed directory)."""


def max_member_bytes() -> int:
    raw = os.environ.get("CANN_EXPORT_MAX_MEMBER_BYTES", "")
    try:
        return int(raw) if raw.strip() else DEFAULT_MAX_MEMBER_BYTES
    except ValueError as e:
        raise ArchiveError(f"CANN_EXPORT_MAX_MEMBER_BYTES={raw[:40]!r} is not a whole number of bytes") from e


def unsafe_name(name: str) -> str | None:
    """Why a member name could escape an extraction directory, or None when it is a plain relative path."""
    if not name or "\x00" in name:
        return "an empty name or a NUL byte"
    if name.startswith(("/", "\\")) or _DRIVE.match(name):
        return "an absolute path"
    if "\\" in name:
        return "a backslash"
    if any(part == ".." for part in name.split("/")):
        return "a '..' component"
    return None


def _shown(name: str) -> str:
    return repr(name[:120] + ("..." if len(name) > 120 else ""))


@dataclass(frozen=True)
class CheckedZip:
    """A zip archive whose directory passed ``open_checked``; ``infos`` maps each name to its entry."""

    path: Path
    zf: zipfile.ZipFile
    infos: dict[str, zipfile.ZipInfo]

    @property
    def names(self) -> list[str]:
        return list(self.infos)

    def read(self, name: str) -> bytes:
        return read_member(self, name)

    def close(self) -> None:
        self.zf.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_checked(path: Path | str | bytes, *, cap: int | None = None, label: str | None = None) -> CheckedZip:
    """Open ``path`` (or in-memory bytes, named ``label`` in errors) as a zip archive and check every
    entry's name and declared size (nothing is read)."""
    cap = max_member_bytes() if cap is None else cap
    source: Path | io.BytesIO
    if isinstance(path, (bytes, bytearray)):
        source, size, path = io.BytesIO(path), len(path), Path(label or "<in-memory zip>")
    else:
        path = Path(path)
        source = path
    try:
        if isinstance(source, Path):
            size = path.stat().st_size
        zf = zipfile.ZipFile(source)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as e:
        raise ArchiveError(f"not a readable zip archive ({type(e).__name__}: {' '.join(str(e).split())[:160]})",
                           path=path) from e
    try:
        infos: dict[str, zipfile.ZipInfo] = {}
        total = 0
        for info in zf.infolist():
            name = info.filename
            why = unsafe_name(name)
            if why:
                raise ArchiveError(f"refused: archive member {_shown(name)} has {why}; a genuine torch archive "
                                   "only holds relative names. Re-create the file with torch.save / "
                                   "torch.export.save", path=path)
            if name in infos:
                raise ArchiveError(f"refused: archive member {_shown(name)} appears twice; readers disagree on "
                                   "which copy counts. Re-create the file", path=path)
            if info.file_size > cap:
                raise ArchiveError(f"refused: archive member {_shown(name)} declares {info.file_size} bytes, above "
                                   f"the cap of {cap} (raise CANN_EXPORT_MAX_MEMBER_BYTES if it is genuine)",
                                   path=path)
            if info.header_offset + info.compress_size > size:
                raise ArchiveError(f"refused: archive member {_shown(name)} lies past the end of the file "
                                   "(truncated or crafted archive)", path=path)
            total += info.file_size
            infos[name] = info
        limit = EXPANSION * size + SLACK_BYTES
        if total > limit:
            biggest = max(infos.values(), key=lambda i: i.file_size)
            raise ArchiveError(f"refused: the archive ({size} bytes) declares {total} bytes of content (member "
                               f"{_shown(biggest.filename)}: {biggest.file_size} bytes), more than {EXPANSION}x its "
                               "size: a zip bomb or a corrupt directory", path=path)
    except BaseException:
        zf.close()
        raise
    return CheckedZip(path, zf, infos)


def read_member(archive: CheckedZip, name: str) -> bytes:
    """The bytes of one member, never more than its declared size."""
    info = archive.infos.get(name)
    if info is None:
        raise ArchiveError(f"the archive has no member {_shown(name)}", path=archive.path)
    parts, got = [], 0
    try:
        with archive.zf.open(info) as f:
            while chunk := f.read(min(_CHUNK, info.file_size - got + 1)):
                got += len(chunk)
                if got > info.file_size:
                    raise ArchiveError(f"refused: archive member {_shown(name)} holds more than the {info.file_size} "
                                       "bytes it declares", path=archive.path)
                parts.append(chunk)
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError) as e:
        raise ArchiveError(f"archive member {_shown(name)} cannot be read ({type(e).__name__}: "
                           f"{' '.join(str(e).split())[:160]}); the file is truncated or corrupt",
                           path=archive.path) from e
    return b"".join(parts)


def zip_names(path: Path | str) -> list[str] | None:
    """Member names of a zip file, or None when ``path`` is not a readable zip (the directory is not checked)."""
    try:
        with zipfile.ZipFile(path) as z:
            return z.namelist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError):
        return None
