"""A fresh zip archive in torch's own layout (what PyTorchFileWriter writes: every member stored, its data
64-byte aligned by an ``FB`` padding field, zip64 records only where a size or offset needs them), laid out as
segments: header bytes built here, member bytes held in memory, or a byte range of an open file.

``SegmentView`` reads the archive without writing it anywhere (torch's readers take a seekable file object and
``readinto`` goes straight into their buffers); ``write_segments`` writes it into a file (ranges copied in the
kernel with ``os.copy_file_range`` / ``os.sendfile``, no recompression).
"""
from __future__ import annotations

import bisect
import io
import os
import struct
import zlib
from dataclasses import dataclass

_LOCAL = struct.Struct("<4s5H3I2H")
_CENTRAL = struct.Struct("<4s4B4H3I5H2I")
_END = struct.Struct("<4s4H2IH")
_END64 = struct.Struct("<4sQ2H2I4Q")
_LOCATOR = struct.Struct("<4sIQI")
ALIGNMENT = 64  # torch's kFieldAlignment
ZIP64_LIMIT = 0xFFFFFFFF  # a size or offset at or above this is written in a zip64 field
_FFFF, _FFFFFFFF = 0xFFFF, 0xFFFFFFFF  # the values that tell a reader to look in the zip64 field
_DOS_DATE = (1 << 5) | 1  # 1980-01-01: a fixed date, so the layout depends only on the members
_COPY_CHUNK = 64 << 20


@dataclass(frozen=True)
class Member:
    """One member: its name, CRC-32, size and bytes (``data``, or ``size`` bytes of file ``fd`` at ``offset``)."""

    name: str
    size: int
    crc: int
    data: bytes | None = None
    fd: int = -1
    offset: int = 0

    @classmethod
    def in_memory(cls, name: str, data: bytes) -> Member:
        return cls(name, len(data), zlib.crc32(data), data=data)


Segment = tuple[int, int, bytes | None, int, int]  # start in the archive, length, bytes | None, fd, file offset


def layout(members: list[Member]) -> tuple[list[Segment], int]:
    """The archive's segments, in order, and its total size."""
    segments: list[Segment] = []
    pos = 0

    def emit(length: int, data: bytes | None, fd: int = -1, offset: int = 0) -> None:
        nonlocal pos
        if length:
            segments.append((pos, length, data, fd, offset))
            pos += length

    central = []
    for m in members:
        start = pos
        header, big = _local_header(m, start)
        emit(len(header), header)
        emit(m.size, m.data, m.fd, m.offset)
        central.append(_central_entry(m, start, big))
    cd_start = pos
    cd = b"".join(central)
    emit(len(cd), cd)
    tail = _end_records(len(members), cd_start, len(cd), pos)
    emit(len(tail), tail)
    return segments, pos


def _encoded(name: str) -> tuple[bytes, int]:
    raw = name.encode("utf-8")
    return raw, (0x800 if not name.isascii() else 0)


def _local_header(m: Member, start: int) -> tuple[bytes, bool]:
    raw, flag = _encoded(m.name)
    big = m.size >= ZIP64_LIMIT or start >= ZIP64_LIMIT
    zip64 = struct.pack("<2H2Q", 1, 16, m.size, m.size) if big else b""
    pad = (-(start + _LOCAL.size + len(raw) + len(zip64) + 4)) % ALIGNMENT
    extra = zip64 + b"FB" + struct.pack("<H", pad) + bytes(pad)
    size32 = _FFFFFFFF if big else m.size
    head = _LOCAL.pack(b"PK\x03\x04", 45 if big else 20, flag, 0, 0, _DOS_DATE, m.crc, size32, size32, len(raw),
                       len(extra))
    return head + raw + extra, big


def _central_entry(m: Member, start: int, big: bool) -> bytes:
    raw, flag = _encoded(m.name)
    extra = struct.pack("<2H3Q", 1, 24, m.size, m.size, start) if big else b""
    size32, offset32 = (_FFFFFFFF, _FFFFFFFF) if big else (m.size, start)
    version = 45 if big else 20
    return _CENTRAL.pack(b"PK\x01\x02", version, 0, version, 0, flag, 0, 0, _DOS_DATE, m.crc, size32, size32,
                         len(raw), len(extra), 0, 0, 0, 0, offset32) + raw + extra


def _end_records(count: int, cd_start: int, cd_size: int, end64_at: int) -> bytes:
    if count < _FFFF and cd_start < ZIP64_LIMIT and cd_size < ZIP64_LIMIT:
        return _END.pack(b"PK\x05\x06", 0, 0, count, count, cd_size, cd_start, 0)
    end64 = _END64.pack(b"PK\x06\x06", _END64.size - 12, 45, 45, 0, 0, count, count, cd_size, cd_start)
    locator = _LOCATOR.pack(b"PK\x06\x07", 0, end64_at, 1)
    return end64 + locator + _END.pack(b"PK\x05\x06", 0, 0, _FFFF, _FFFF, _FFFFFFFF, _FFFFFFFF, 0)


class SegmentView(io.RawIOBase):
    """A read-only, seekable file over the segments (its ranges are read with ``os.preadv``)."""

    def __init__(self, segments: list[Segment], size: int):
        super().__init__()
        self._segments, self._starts, self._size, self._pos = segments, [s[0] for s in segments], size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer) -> int:  # noqa: ANN001 - any writable buffer
        out = memoryview(buffer).cast("B")
        done = 0
        while done < len(out) and self._pos < self._size:
            i = bisect.bisect_right(self._starts, self._pos) - 1
            start, length, data, fd, offset = self._segments[i]
            skip = self._pos - start
            n = min(length - skip, len(out) - done)
            if data is not None:
                out[done:done + n] = data[skip:skip + n]
            else:
                got = os.preadv(fd, [out[done:done + n]], offset + skip)
                if got <= 0:
                    raise OSError(f"the model file ended while reading (it was truncated while loading): {got}")
                n = got
            done += n
            self._pos += n
        return done


def write_segments(segments: list[Segment], dst: int) -> None:
    """Write the archive into the open file ``dst`` (kernel-side copies for file ranges)."""
    for _, length, data, fd, offset in segments:
        if data is not None:
            view = memoryview(data)
            while view:
                view = view[os.write(dst, view):]
            continue
        end = offset + length
        while offset < end:
            offset += _copy(fd, dst, offset, min(_COPY_CHUNK, end - offset))


def _copy(src: int, dst: int, offset: int, count: int) -> int:
    for call in (lambda: os.copy_file_range(src, dst, count, offset), lambda: os.sendfile(dst, src, offset, count)):
        try:
            if (n := call()) > 0:
                return n
        except OSError:  # another filesystem, or no kernel copy here: the next way
            continue
    data = os.pread(src, count, offset)
    if not data:
        raise OSError("the model file ended while it was copied (truncated while loading)")
    return os.write(dst, data)
