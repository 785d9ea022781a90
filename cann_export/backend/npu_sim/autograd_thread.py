"""Backward on the calling thread. autograd runs a non-CPU device's backward on a worker thread of its own;
for npu-sim that thread is a second OpenMP team beside this thread's, and with both teams oversubscribing
the cores OpenMP throttles its spinning, so every parallel kernel pays a thread wake-up (measured: MLP step
1.7x CPU -> 1.2x). ``torch.autograd.set_multithreading_enabled`` is a public, thread-local switch."""
from __future__ import annotations

import torch

_previous: list[bool] = []


def install() -> None:
    if not _previous:
        _previous.append(torch._C._is_multithreading_enabled())
    torch.autograd.set_multithreading_enabled(False)


def uninstall() -> None:
    """Restore the setting of the thread that called ``install`` (the switch is per thread)."""
    if _previous:
        torch.autograd.set_multithreading_enabled(_previous.pop())
