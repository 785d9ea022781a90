"""Atomic writes: everything goes to a temp name beside its target and is renamed into place.

Staging entries are named ``.TARGET.cann-tmp-HOST-BOOT-PID-START-RAND`` (``cann-old`` for a replaced target
on the fallback path), so a later run can tell the litter of a dead process from a live export's work and
sweep it (``sweep_stale``). A commit holds ``.TARGET.cann-lock`` (fcntl.flock) beside its target, checks the
target under the lock, and swaps a directory in with renameat2(RENAME_EXCHANGE) where Linux offers it.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import WriteError
from . import targets

LOCK_TIMEOUT = 120.0  # seconds a commit waits for another commit to the same target
FOREIGN_STALE_SECONDS = 24 * 3600  # litter of another host (shared filesystem) or of unknown owner
_HOST = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname())[:32] or "host"
_ENTRY = re.compile(r"\.cann-(tmp|old)-(?P<host>[A-Za-z0-9_]+)-(?P<boot>[0-9a-f]{8})-(?P<pid>\d+)-(?P<start>\d+)"
                    r"-[0-9a-z]+$")


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:8]
    except OSError:
        return "00000000"


def _start_time(pid: int) -> int:
    """The process's start time in clock ticks since boot (Linux), 0 where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


def _owner_tag() -> str:
    pid = os.getpid()
    return f"{_HOST}-{_boot_id()}-{pid}-{_start_time(pid)}-{uuid.uuid4().hex[:8]}"


def _alive(pid: int, start: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    actual = _start_time(pid)
    return not (start and actual and actual != start)  # a reused pid started at another time


_STAGING_ROOT: list[Path] = []  # set in a sandboxed child: every staging directory is made inside it


def stage_inside(root: Path) -> None:
    """From now on, make every staging directory inside ``root`` (a directory beside the output, the only
    place a sandboxed child may write); for this process's lifetime."""
    _STAGING_ROOT[:] = [Path(root)]


def staging_dir(target: Path) -> Path:
    """A fresh hidden directory beside ``target`` (same filesystem, so renames are atomic); stale staging
    of dead processes beside it is swept first. In a sandboxed child: inside its staging root instead."""
    target = Path(target)
    parent = target.resolve().parent
    if _STAGING_ROOT:
        parent = _STAGING_ROOT[0]
    else:
        parent.mkdir(parents=True, exist_ok=True)
        sweep_stale(parent)
    staging = parent / f".{target.resolve().name}.cann-tmp-{_owner_tag()}"
    umask = os.umask(0)
    os.umask(umask)
    staging.mkdir(0o777 & ~umask)
    return staging


def sweep_stale(directory: str | os.PathLike) -> list[Path]:
    """Remove staging, replaced-target and lock entries in ``directory`` left by dead processes: on this host
    and boot, a pid that is gone (or reused); from another host, boot or an unknown owner, older than a day."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        if ".cann-" not in entry.name or not entry.name.startswith("."):
            continue
        path = Path(entry.path)
        if entry.name.endswith(".cann-lock"):
            if _unlink_unheld_lock(path):
                removed.append(path)
            continue
        if ".cann-tmp-" not in entry.name and ".cann-old-" not in entry.name:
            continue
        if not _stale(entry, now):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(path)
            else:
                path.unlink()
        except FileNotFoundError:
            continue
        except OSError:
            continue  # another sweeper or permissions: leave it for the next run
        removed.append(path)
    return removed


def _stale(entry: os.DirEntry, now: float) -> bool:
    m = _ENTRY.search(entry.name)
    if m and m["host"] == _HOST and m["boot"] == _boot_id():
        pid = int(m["pid"])
        return pid != os.getpid() and not _alive(pid, int(m["start"]))
    try:
        return now - entry.stat(follow_symlinks=False).st_mtime > FOREIGN_STALE_SECONDS
    except OSError:
        return False


def _unlink_unheld_lock(path: Path) -> bool:
    try:
        import fcntl
    except ImportError:
        return False
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False  # held: a commit is running
    try:
        if _same_file(fd, path):
            path.unlink()
            return True
        return False
    finally:
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


@contextlib.contextmanager
def target_lock(target: Path, timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
    """Hold ``.TARGET.cann-lock`` beside ``target`` (removed on release, so nothing is left behind)."""
    lock = target.parent / f".{target.name}.cann-lock"
    deadline = time.monotonic() + timeout
    try:
        import fcntl
    except ImportError:  # no flock: an O_EXCL lock file
        fcntl = None
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | (os.O_EXCL if fcntl is None else 0), 0o644)
        except FileExistsError:
            fd = -1
        except OSError as e:
            raise WriteError(f"cannot create the lock file {lock.name} beside the output ({e.strerror}); check "
                             "the directory's permissions", path=target) from e
        if fd >= 0 and fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if _same_file(fd, lock):
                    break
            except OSError:
                pass
            os.close(fd)  # held by another commit, or swept and re-created: try again
        elif fd >= 0:
            break
        if time.monotonic() > deadline:
            raise WriteError(f"another process kept committing to this output for {timeout:.0f} s; try again "
                             "when it is done, or choose another output path", path=target)
        time.sleep(0.005)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            lock.unlink()
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    fn = _RENAMEAT2
    if fn is None:
        return False
    if fn(-100, os.fsencode(a), -100, os.fsencode(b), 2) == 0:  # AT_FDCWD, RENAME_EXCHANGE
        return True
    import ctypes

    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _renameat2():
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).renameat2
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        return fn
    except (OSError, AttributeError):
        return None


_RENAMEAT2 = _renameat2()


def write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (as ``write_bytes``)."""
    write_bytes(path, text.encode("utf-8"))


def write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temp name beside it, fsynced, renamed into place."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def check_target(target: Path, overwrite: bool, protect: tuple = ()) -> None:
    """Refuse an output that exists (without ``overwrite``) or that ``overwrite`` must not replace: anything
    cann-export did not write, the current directory or its parents, a zoo root, the paths in ``protect``."""
    target = Path(target)
    targets.check_name(target)
    targets.check_protected(target, protect)
    if not (target.exists() or target.is_symlink()):
        return
    if not overwrite:
        raise WriteError("output already exists; pass --overwrite (overwrite=True) or choose another path",
                         path=target)
    targets.check_replaceable(target)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def commit_dir(staging: Path, target: Path, overwrite: bool) -> None:
    """Rename a staged directory onto ``target`` under the target's lock. An existing target (one that
    ``check_target`` allows) is swapped out atomically, then removed."""
    target = targets.check_name(Path(target))
    with target_lock(target):
        check_target(target, overwrite)
        try:
            if not (target.exists() or target.is_symlink()):
                os.rename(staging, target)
                return
            if _exchange(staging, target):
                _remove(staging)  # now the old target
                return
            old = target.with_name(f".{target.name}.cann-old-{_owner_tag()}")
            os.replace(target, old)
            os.rename(staging, target)
            _remove(old)
        except OSError as e:
            raise WriteError(f"could not move the staged output into place ({e.strerror}); another program may "
                             "be writing there. Try again or choose another output path", path=target) from e


def commit_files(staging: Path, names: list[str], target_dir: Path, overwrite: bool,
                 old_companions: Callable[[Path], list[str]] | None = None) -> list[Path]:
    """Rename staged files into ``target_dir`` under the primary's lock; the last name is the primary file and
    goes last. Its companions (external data, training state) may be replaced only with an existing primary
    of ours. ``old_companions(primary)`` names the files the primary being replaced uses (its external data):
    those the new output does not write are removed after it is in place, so none is left stale."""
    target_dir = Path(target_dir).resolve()
    primary = target_dir / names[-1]
    with target_lock(primary):
        check_target(primary, overwrite)
        primary_exists = primary.exists()
        stale = [n for n in (old_companions(primary) if primary_exists and old_companions else ())
                 if n not in names]
        for name in names[:-1]:
            path = target_dir / name
            if path.exists() or path.is_symlink():
                if not overwrite:
                    check_target(path, overwrite)
                if not primary_exists or path.is_symlink() or not path.is_file():
                    raise WriteError(f"exists and is not a companion of a {primary.name} written by cann-export; "
                                     "move it away or choose another output path", path=path)
        placed = []
        try:
            for name in names:
                os.replace(staging / name, target_dir / name)
                placed.append(target_dir / name)
        except OSError as e:
            raise WriteError(f"could not move the staged file into place ({e.strerror}); try again or choose "
                             "another output path", path=target_dir / name) from e
        for name in stale:
            path = target_dir / name
            if path.is_file() and not path.is_symlink():
                with contextlib.suppress(OSError):
                    path.unlink()
    shutil.rmtree(staging, ignore_errors=True)
    return placed


def discard(staging: Path | None) -> None:
    if staging is not None and staging.exists():
        shutil.rmtree(staging, ignore_errors=True)


def is_safe_relpath(rel: str) -> bool:
    """A relative POSIX path that stays inside its root: no absolute path, '..', backslash or empty part."""
    from pathlib import PurePosixPath

    p = PurePosixPath(rel)
    return bool(rel) and not rel.endswith("/") and not p.is_absolute() and "\\" not in rel \
        and all(part not in ("..", "", ".") for part in p.parts)


