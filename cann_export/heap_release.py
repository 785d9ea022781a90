"""Freed heap back to the operating system between the stages of an export, and between the checks' large runs
(one parity set's forward or onnxruntime run after another: the next set's peak does not stack on the last's
freed chunks)."""
from __future__ import annotations

import ctypes
import sys
from typing import Any

_TRIM: list[Any] = []  # [malloc_trim] once looked up; [None] where there is none (not glibc)


def give_back() -> None:
    """glibc keeps the memory a stage freed (a graph's serialised copy, onnxruntime's and onnxsim's arenas) in
    its heap, so the next stage's peak RSS stacks on it; ``malloc_trim(0)`` returns it (~90 MiB after
    DistilBERT's capture, a few ms). A no-op where the C library has no malloc_trim."""
    if not _TRIM:
        _TRIM.append(_lookup())
    if _TRIM[0] is not None:
        _TRIM[0](0)


def _lookup() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:  # the process's own symbols: no library search (find_library runs programs; the sandbox denies execve)
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # musl and others: no malloc_trim
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim
