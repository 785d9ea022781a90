"""A deadline for in-process calls that must not block (a FIFO opened for reading waits for a writer)."""
from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator


@contextlib.contextmanager
def deadline(seconds: int = 20) -> Iterator[None]:
    """Raise TimeoutError in the main thread after ``seconds`` (SIGALRM also interrupts a blocked open())."""
    def expire(*_: object) -> None:
        raise TimeoutError(f"still blocked after {seconds}s: the file was opened")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
