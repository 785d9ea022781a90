"""Process-wide settings the CLI makes at start, before torch loads; a library caller's process is left as it is.

- OpenMP: a thread waiting at a parallel region's end sleeps instead of spinning. On cores shared with other work
  a spinning thread holds the core its late peer needs: ViT-small's 7 eager forwards took 4.4-9.0 s instead of
  1.3 s on a shared 2-core machine.
- glibc malloc: blocks up to 32 MiB (its ceiling) come from the heap, and freed heap memory is kept for the next
  block, instead of a fresh mmap per block that the kernel zeroes page by page and takes back at free. An export
  allocates and frees the same large blocks again and again (the exporter's tensor copies, graph
  serialisations, reference outputs): GPT-2 small with past took 7.0 M page faults and 25 s of system time
  (54.9 s wall); with these settings 4.9 M and 18.6 s (48.1 s wall), peak RSS +6%.

A value the user set (``OMP_WAIT_POLICY``, ``MALLOC_*_`` variables, ``GLIBC_TUNABLES``, a preloaded allocator)
is kept."""
from __future__ import annotations

import os

MMAP_THRESHOLD = 32 << 20  # glibc's largest accepted value on 64-bit (half its heap size)
TRIM_THRESHOLD = 2**31 - 1  # free heap memory is kept (the process is short-lived); mallopt takes an int
TOP_PAD = 256 << 20  # the heap grows in steps this large
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3  # glibc's malloc.h
_USER_SET = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")


def tune() -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    _malloc()


def _malloc() -> bool:
    """Whether glibc's malloc took the settings above (False elsewhere or when the user chose otherwise)."""
    if any(name in os.environ for name in _USER_SET) or "malloc" in os.environ.get("LD_PRELOAD", ""):
        return False
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return False
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (ValueError, OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settings = ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                (_M_TOP_PAD, TOP_PAD))
    return all(mallopt(option, value) == 1 for option, value in settings)
