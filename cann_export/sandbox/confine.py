"""Confine the calling process: no writes outside given directories, no execve, no sockets, no signals or
abstract sockets outside itself. Linux only, using what the kernel offers:

- Landlock (the kernel's unprivileged access control, syscalls 444-446) for the file system: every write
  right (write, truncate, create, remove, rename, link) and execute is handled, and granted only beneath the
  writable directories; reads stay open (the model, Python and torch must be readable). ABI >= 4 also
  refuses TCP bind/connect, ABI >= 6 scopes signals and abstract unix sockets to the sandbox.
- seccomp through libseccomp (``pyseccomp``): ``execve``/``execveat``, ``socket``, ``ptrace``,
  ``process_vm_*``, namespace and mount calls fail with EPERM.

Both are applied with no_new_privs and can never be lifted by the confined process. ``probe`` says what
this machine offers without confining anything."""
from __future__ import annotations

import ctypes
import errno
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

_SYSCALLS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}  # create_ruleset, add_rule, restrict_self
_PR_SET_NO_NEW_PRIVS = 38
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

# LANDLOCK_ACCESS_FS_* (uapi/linux/landlock.h)
_EXECUTE, _WRITE_FILE = 1 << 0, 1 << 1
_REMOVE_DIR, _REMOVE_FILE, _MAKE_CHAR, _MAKE_DIR, _MAKE_REG = 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8
_MAKE_SOCK, _MAKE_FIFO, _MAKE_BLOCK, _MAKE_SYM = 1 << 9, 1 << 10, 1 << 11, 1 << 12
_REFER, _TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6

# what the confined process may still do beneath a writable directory
_STAGING_RIGHTS = _WRITE_FILE | _REMOVE_DIR | _REMOVE_FILE | _MAKE_DIR | _MAKE_REG  # no symlinks
DENIED_SYSCALLS = ("execve", "execveat", "socket", "ptrace", "process_vm_readv", "process_vm_writev",
                   "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "bpf", "keyctl",
                   "add_key", "request_key", "init_module", "finit_module", "kexec_load", "perf_event_open")


class SandboxUnavailable(RuntimeError):
    """The kernel or the libraries do not offer what confinement needs (the message says what is missing)."""


@dataclass(frozen=True)
class Support:
    """What this machine offers: the Landlock ABI (0: none), whether seccomp filters load, and why not."""

    landlock_abi: int
    seccomp: bool
    missing: list[str] = field(default_factory=list)

    @property
    def available(self) -> bool:
        return self.landlock_abi >= 1 and self.seccomp

    @property
    def kind(self) -> str:
        return "landlock+seccomp" if self.available else "none"


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _landlock_abi() -> tuple[int, str | None]:
    numbers = _SYSCALLS.get(platform.machine())
    if platform.system() != "Linux" or numbers is None:
        return 0, f"Landlock needs Linux on x86_64 or aarch64 (this is {platform.system()} {platform.machine()})"
    abi = _libc().syscall(numbers[0], None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    if abi < 0:
        why = os.strerror(ctypes.get_errno())
        return 0, f"the kernel offers no Landlock ({why}; needs Linux >= 5.13 with Landlock in its lsm= list)"
    return int(abi), None


def _seccomp_filter():
    try:
        import pyseccomp
    except ImportError as e:
        raise SandboxUnavailable("seccomp needs the pyseccomp package and libseccomp2") from e
    except OSError as e:  # pyseccomp loads libseccomp.so.2 at import
        raise SandboxUnavailable(f"seccomp needs libseccomp2 ({e})") from e
    flt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        try:
            flt.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
        except (RuntimeError, ValueError, OSError):  # a call this architecture does not have
            continue
    return flt


def probe() -> Support:
    """What confinement this machine offers (nothing is confined)."""
    abi, why = _landlock_abi()
    missing = [why] if why else []
    try:
        _seccomp_filter()
        seccomp = True
    except SandboxUnavailable as e:
        seccomp, missing = False, [*missing, str(e)]
    return Support(abi, seccomp, missing)


def _ruleset(abi: int) -> int:
    fs = _EXECUTE | _STAGING_RIGHTS | _MAKE_CHAR | _MAKE_SOCK | _MAKE_FIFO | _MAKE_BLOCK
    fs |= (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0)
    net = _NET_BIND_TCP | _NET_CONNECT_TCP if abi >= 4 else 0
    scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0
    fields = [fs] + ([net] if abi >= 4 else []) + ([scoped] if abi >= 6 else [])
    attr = (ctypes.c_uint64 * len(fields))(*fields)
    fd = _libc().syscall(_SYSCALLS[platform.machine()][0], ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)),
                         ctypes.c_uint32(0))
    if fd < 0:
        raise SandboxUnavailable(f"landlock_create_ruleset failed: {os.strerror(ctypes.get_errno())}")
    return int(fd)


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _allow(ruleset: int, path: Path, rights: int) -> None:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        rule = _PathBeneath(rights, fd)
        if _libc().syscall(_SYSCALLS[platform.machine()][1], ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                           ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
            raise SandboxUnavailable(f"landlock_add_rule({path}) failed: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def confine(writable: list[Path], support: Support) -> None:
    """Confine this process for good: writes only beneath ``writable`` (and to /dev/null), no execve, no
    sockets. Call it in a child process only; raises SandboxUnavailable when a step fails."""
    if not support.available:
        raise SandboxUnavailable("; ".join(support.missing) or "no sandbox on this machine")
    abi = support.landlock_abi
    flt = _seccomp_filter()
    ruleset = _ruleset(abi)
    try:
        extra = (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0)
        for directory in writable:
            _allow(ruleset, directory, _STAGING_RIGHTS | extra)
        _allow(ruleset, Path("/dev/null"), _WRITE_FILE | (_TRUNCATE if abi >= 3 else 0))
        libc = _libc()
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise SandboxUnavailable(f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}")
        if libc.syscall(_SYSCALLS[platform.machine()][2], ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            raise SandboxUnavailable(f"landlock_restrict_self failed: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)
    flt.load()
