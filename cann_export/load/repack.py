"""The canonical re-pack: torch never opens the user's archive. ``canonical_copy(path, kind)`` reads it once
through the checked reader (archives.open_checked: layout, names, declared sizes), refuses any member not on
the allow-list of its kind (load/allowlist.py), and builds a fresh archive in torch's own layout holding only
the allowed members:

- every member torch parses (JSON, pickles, TorchScript code) is read into memory, each declaring at most
  ``max_inspected_bytes()`` and counted while it streams; a compressed one is first inflated into a private
  spill file and read back only once its actual size is the declared one, so a bomb is refused with memory
  bounded. The checks read these very bytes, and torch reads them again from the same memory;
- a raw tensor payload stored uncompressed stays where it is: the copy refers to its byte range in the file
  that was checked (one descriptor, held open: replacing the path later changes nothing). A compressed one is
  inflated into the spill file, counted the same way.

``Canonical.view()`` is the copy as a seekable file object torch.export.load / torch.load read (nothing is
written, so the copy costs no extra pass over the weights); ``copy_to_staging`` writes it into the private
staging directory for readers that want a path (torch.jit.load). The spill file and the staging directory
go when the context ends.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import LoadError
from . import allowlist
from .archives import (ArchiveError, CheckedZip, data_offset, max_inspected_bytes, open_checked, read_member,
                       stream_member)
from .canonical_zip import Member, SegmentView, layout, write_segments


class Canonical:
    """The re-packed archive of ``source``: its members, and the open files its ranges point into."""

    def __init__(self, source: Path, kind: str):
        self.source, self.kind = source, kind
        self.members: list[Member] = []
        self._fds: list[int] = []
        self._dir: str | None = None
        self._spill = -1
        self._segments: list = []
        self.size = 0
        self._stamp: tuple[int, ...] | None = None

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.members]

    def finish(self) -> None:
        self._segments, self.size = layout(self.members)

    def view(self) -> SegmentView:
        return SegmentView(self._segments, self.size)

    def checked(self) -> CheckedZip:
        """The copy opened by the checked reader (its layout verified like any archive's)."""
        return open_checked(self.view(), label=str(self.source))

    def staging_dir(self) -> str:
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="cann-export-load-")  # mode 0700: private to this user
        return self._dir

    def copy_to_staging(self, suffix: str) -> Path:
        target = Path(self.staging_dir()) / f"model{suffix}"
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            write_segments(self._segments, fd)
        except OSError as e:
            raise LoadError(f"cannot write the re-packed copy into {self._dir} ({e.strerror or e}); free space "
                            "there or point TMPDIR elsewhere", path=self.source) from e
        finally:
            os.close(fd)
        return target

    def hold(self, fd: int) -> int:
        self._fds.append(fd)
        return fd

    def stamp(self, fd: int) -> tuple[int, ...]:
        st = os.fstat(fd)
        return st.st_size, st.st_mtime_ns, st.st_nlink, st.st_ctime_ns

    def ensure_unchanged(self) -> None:
        """Refuse what was loaded if the checked file was written to meanwhile (its raw payloads are read
        from that file while torch loads; a path replaced by another file changes nothing, the descriptor
        still reads the checked one; unlinking it moves its change time with its link count)."""
        now, then = self.stamp(self._fds[0]), self._stamp
        if then is not None and (now[:2] != then[:2] or (now[2] == then[2] and now != then)):
            raise LoadError("refused: the model file was modified while it was being loaded, so what torch read "
                            "may not be what was checked; load it again once nothing writes to it", path=self.source)

    def spill(self, archive: CheckedZip, name: str, cap: int | None = None) -> tuple[int, int]:
        """Inflate a member into the spill file, counted; (descriptor, offset) of its bytes there."""
        if self._spill < 0:
            with tempfile.TemporaryFile(dir=self.staging_dir()) as f:  # unlinked at once
                self._spill = self.hold(os.dup(f.fileno()))
        offset = os.lseek(self._spill, 0, os.SEEK_END)

        def write(chunk: bytes) -> None:
            view = memoryview(chunk)
            while view:
                view = view[os.write(self._spill, view):]

        stream_member(archive, name, write, cap=cap)
        return self._spill, offset

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


@contextmanager
def canonical_copy(path: Path | str, kind: str) -> Iterator[Canonical]:
    """The re-packed copy of the archive at ``path`` (refused, naming the member, when a member is not one
    ``allowlist.WRITERS[kind]`` writes); its files are removed when the block ends."""
    path = Path(path)
    canon = Canonical(path, kind)
    try:
        with open_checked(path) as archive:
            if why := allowlist.refusal(kind, archive.names):
                raise LoadError(f"refused to load: {why}. Pass --trust-pickle (trust_pickle=True) only for files you "
                                "trust", path=path)
            _fill(canon, archive)
        canon.finish()
    except OSError as e:
        canon.close()
        raise LoadError(f"cannot re-pack the archive ({e.strerror or e}); check TMPDIR has room", path=path) from e
    except BaseException:
        canon.close()
        raise
    try:
        yield canon
        canon.ensure_unchanged()
    finally:
        canon.close()


def _fill(canon: Canonical, archive: CheckedZip) -> None:
    kind, names = canon.kind, archive.names
    root = allowlist.root_of(names)
    records = {name: name[len(root) + 1:] for name in names}
    fd = canon.hold(os.dup(archive.zf.fp.fileno()))  # the very file checked, whatever its path names later
    canon._stamp = canon.stamp(fd)
    configs = {rec: _inspected(canon, archive, name) for name, rec in records.items() if allowlist.is_config(kind, rec)}
    pickled = allowlist.pickled_payloads(configs)
    for name, rec in records.items():
        if rec in configs:
            canon.members.append(Member.in_memory(name, configs[rec]))
        elif allowlist.is_payload(kind, rec) and rec not in pickled:
            canon.members.append(_payload(canon, archive, name, fd))
        else:
            canon.members.append(Member.in_memory(name, _inspected(canon, archive, name)))


def _inspected(canon: Canonical, archive: CheckedZip, name: str) -> bytes:
    """A member torch parses: into memory, bounded; a compressed one only after it inflated to its size."""
    info, cap = archive.infos[name], max_inspected_bytes()
    if info.compress_type == zipfile.ZIP_STORED:
        return read_member(archive, name, cap=cap)
    fd, offset = canon.spill(archive, name, cap)
    return os.pread(fd, info.file_size, offset)


def _payload(canon: Canonical, archive: CheckedZip, name: str, fd: int) -> Member:
    info = archive.infos[name]
    if info.flag_bits & 0x1:
        raise ArchiveError(f"refused: archive member {name!r} is encrypted; torch archives never are",
                           path=archive.path)
    if info.compress_type == zipfile.ZIP_STORED and info.compress_size == info.file_size:
        return Member(name, info.file_size, info.CRC, fd=fd, offset=data_offset(archive, info))
    spill, offset = canon.spill(archive, name)
    return Member(name, info.file_size, info.CRC, fd=spill, offset=offset)
