"""Bounded reading of zip archives someone else wrote (torch.export .pt2, TorchScript, zip torch.save files,
om-stub payloads): every member's name and size is checked before any byte of it is read.

``open_checked(path)`` refuses, before reading any member:
- names that could leave a directory (absolute, ``..``, backslashes, drive letters, NUL) or that appear
  twice (Python's zipfile and torch's miniz reader could then pick different entries);
- a member whose declared size is above the cap (``CANN_EXPORT_MAX_MEMBER_BYTES``, default 64 GiB) or
  whose declared total exceeds what the archive's size can hold (``EXPANSION`` times the archive plus
  ``SLACK_BYTES``: torch stores members uncompressed, so a 3 MB archive declaring 3 GiB is a bomb);
- members whose data would lie outside the file;
- any layout on which two zip readers could disagree (Python's zipfile tolerates a prefix by shifting every
  offset, torch's miniz does not; zipfile truncates names at NUL, miniz does not): the members, central
  directory and end record must tile the file exactly, from a first local header at offset 0 to an end
  record that is the file's last byte, each local header where the central directory says and naming the
  same member (``layout_problem``).
``stream_member`` / ``read_member`` then read at most the declared size (the actual bytes are counted while
streaming); a member whose bytes are parsed in memory (JSON, pickles) must also declare at most
``max_inspected_bytes()`` (``CANN_EXPORT_MAX_INSPECTED_BYTES``, default 256 MiB), refused before reading.
"""
from __future__ import annotations

import io
import os
import re
import struct
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..errors import LoadError

DEFAULT_MAX_MEMBER_BYTES = 64 << 30
DEFAULT_MAX_INSPECTED_BYTES = 256 << 20
EXPANSION = 16  # declared uncompressed total <= EXPANSION * archive size + SLACK_BYTES
SLACK_BYTES = 64 << 20
_CHUNK = 1 << 20
_DRIVE = re.compile(r"^[A-Za-z]:")


# What Python's zipfile raises on a damaged or crafted archive: a bad directory, a truncated or corrupt
# deflate stream, a feature it does not implement (strong encryption, patch data, a zip version past 6.3).
ZIP_READ_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError,
                   zlib.error)


class ArchiveError(LoadError):
    """An archive refused before its members were read (unsafe name, bomb, malformed directory)."""


def _env_bytes(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        return int(raw) if raw.strip() else default
    except ValueError as e:
        raise ArchiveError(f"{name}={raw[:40]!r} is not a whole number of bytes") from e


def max_member_bytes() -> int:
    return _env_bytes("CANN_EXPORT_MAX_MEMBER_BYTES", DEFAULT_MAX_MEMBER_BYTES)


def max_inspected_bytes() -> int:
    """The cap on a member read into memory to be parsed (JSON, pickles, TorchScript code)."""
    return _env_bytes("CANN_EXPORT_MAX_INSPECTED_BYTES", DEFAULT_MAX_INSPECTED_BYTES)


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


def open_checked(path: Path | str | bytes | BinaryIO, *, cap: int | None = None,
                 label: str | None = None) -> CheckedZip:
    """Open ``path`` (or in-memory bytes or a seekable binary file, named ``label`` in errors) as a zip archive
    and check every entry's name and declared size (nothing is read)."""
    cap = max_member_bytes() if cap is None else cap
    source: Path | BinaryIO
    if isinstance(path, (bytes, bytearray)):
        source, size, path = io.BytesIO(path), len(path), Path(label or "<in-memory zip>")
    elif hasattr(path, "seek"):
        source, size, path = path, path.seek(0, os.SEEK_END), Path(label or "<zip>")
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
            if "\x00" in info.orig_filename:
                raise ArchiveError(f"refused: archive member {_shown(info.orig_filename)} has a NUL byte in its "
                                   "name; zip readers disagree on where the name ends. Re-create the file with "
                                   "torch.save / torch.export.save", path=path)
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
        if why := layout_problem(zf, size):
            raise ArchiveError(f"refused: {why}; another zip reader (torch's) could see different members than "
                               "the ones checked here. Re-create the file with torch.save / torch.export.save "
                               "(a genuine archive starts at its first member and ends at its directory)", path=path)
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


_LOCAL = struct.Struct("<4s5H3I2H")  # local file header: signature ... name length, extra length
_DESCRIPTOR_SIZES = (12, 16, 20, 24)  # data descriptor after a member written with flag bit 3 (zip64: 20, 24)


def layout_problem(zf: zipfile.ZipFile, size: int) -> str | None:
    """Why the archive's bytes are not exactly its members, central directory and end record, or None.

    zipfile shifts every offset by the bytes found before the central directory it expected ("concat"),
    so data prepended to an archive (a second archive, M + Z) is invisible to it but not to miniz."""
    fp = zf.fp
    if fp is None:
        return "the archive cannot be re-read"
    try:
        endrec = zipfile._EndRecData(fp)  # the record zipfile used (zip64 fields already merged in)
    except (OSError, struct.error) as e:
        return f"its end record cannot be read ({type(e).__name__})"
    if not endrec:
        return "it has no end-of-central-directory record"
    recorded_cd, cd_size = endrec[zipfile._ECD_OFFSET], endrec[zipfile._ECD_SIZE]
    location, comment = endrec[zipfile._ECD_LOCATION], endrec[zipfile._ECD_COMMENT]
    if zf.start_dir != recorded_cd:
        return (f"{zf.start_dir - recorded_cd} bytes precede the archive its directory describes (offsets are "
                "shifted: data, or another archive, was prepended)")
    if location + 22 + len(comment) != size:
        return f"{size - location - 22 - len(comment)} bytes follow the end-of-central-directory record"
    cd_end = recorded_cd + cd_size
    if cd_end != location:
        fp.seek(cd_end)
        if cd_end > location or fp.read(4) != b"PK\x06\x06":  # only the zip64 end records may sit between
            return "its central directory does not end where the end record begins"
    pos, previous = 0, None
    for info in sorted(zf.infolist(), key=lambda i: i.header_offset):
        start = info.header_offset
        if start < pos:
            return (f"archive member {_shown(info.orig_filename)} overlaps "
                    f"{_shown(previous.orig_filename) if previous else 'the start of the file'}")
        gap = start - pos
        if gap and not (previous is not None and previous.flag_bits & 0x08 and gap in _DESCRIPTOR_SIZES):
            return (f"{gap} bytes before archive member {_shown(info.orig_filename)} (offset {start}) belong to no "
                    "member" if previous else f"its first member starts at offset {start}, not 0: data was prepended")
        fp.seek(start)
        head = fp.read(_LOCAL.size)
        if len(head) < _LOCAL.size or _LOCAL.unpack(head)[0] != b"PK\x03\x04":
            return f"archive member {_shown(info.orig_filename)} has no local header at offset {start}"
        fields = _LOCAL.unpack(head)
        name_len, extra_len = fields[-2], fields[-1]
        raw = fp.read(name_len)
        local = raw.decode("utf-8" if fields[2] & 0x800 else "cp437", errors="replace")
        if local != info.orig_filename:
            return (f"archive member {_shown(info.orig_filename)} is named {_shown(local)} in its local header "
                    "(readers disagree on its name)")
        pos = start + _LOCAL.size + name_len + extra_len + info.compress_size
        previous = info
    gap = recorded_cd - pos
    if gap < 0:
        return "the central directory overlaps the last member"
    if gap and not (previous is not None and previous.flag_bits & 0x08 and gap in _DESCRIPTOR_SIZES):
        return f"{gap} bytes between the last member and the central directory belong to no member"
    return None


def data_offset(archive: CheckedZip, info: zipfile.ZipInfo) -> int:
    """Where a member's (stored or compressed) bytes start: after its local header, as every reader reads it."""
    fp = archive.zf.fp
    fp.seek(info.header_offset)
    fields = _LOCAL.unpack(fp.read(_LOCAL.size))
    return info.header_offset + _LOCAL.size + fields[-2] + fields[-1]


def stream_member(archive: CheckedZip, name: str, write: Callable[[bytes], object], *,
                  cap: int | None = None) -> int:
    """Pass one member's bytes to ``write`` chunk by chunk, refusing it before reading when it declares more
    than ``cap``, and as soon as it yields more than it declares (or, at its end, fewer); returns the count."""
    info = archive.infos.get(name)
    if info is None:
        raise ArchiveError(f"the archive has no member {_shown(name)}", path=archive.path)
    if cap is not None and info.file_size > cap:
        raise ArchiveError(f"refused: archive member {_shown(name)} declares {info.file_size} bytes, above the "
                           f"{cap} that are read into memory to be checked (raise CANN_EXPORT_MAX_INSPECTED_BYTES "
                           "if it is genuine)", path=archive.path)
    got = 0
    try:
        with archive.zf.open(info) as f:
            while chunk := f.read(min(_CHUNK, info.file_size - got + 1)):
                got += len(chunk)
                if got > info.file_size:
                    raise ArchiveError(f"refused: archive member {_shown(name)} holds more than the {info.file_size} "
                                       "bytes it declares (a zip bomb or a corrupt directory)", path=archive.path)
                write(chunk)
    except (*ZIP_READ_ERRORS, RuntimeError) as e:
        # zipfile inflates no more than the declared size, then checks the CRC: a bomb declared small ends here
        raise ArchiveError(f"refused: archive member {_shown(name)} cannot be read as declared "
                           f"({type(e).__name__}: {' '.join(str(e).split())[:160]}); the file is truncated, corrupt "
                           "or crafted", path=archive.path) from e
    if got != info.file_size:
        raise ArchiveError(f"refused: archive member {_shown(name)} holds {got} bytes, not the {info.file_size} it "
                           "declares; the file is truncated or corrupt", path=archive.path)
    return got


def read_member(archive: CheckedZip, name: str, *, cap: int | None = None) -> bytes:
    """The bytes of one member, never more than its declared size (nor ``cap``)."""
    parts: list[bytes] = []
    stream_member(archive, name, parts.append, cap=cap)
    return b"".join(parts)


def zip_names(path: Path | str) -> list[str] | None:
    """Member names of a zip file, or None when ``path`` is not a readable zip (the directory is not checked)."""
    try:
        with zipfile.ZipFile(path) as z:
            return z.namelist()
    except ZIP_READ_ERRORS:
        return None
