"""What one exporter attempt learned about the graph it returns, for the capture stage's check alone: the graph
onnxruntime already loaded (the opset conversion ran it) and the graph whose file onnx's full check already
passed. Stage-private, so it lives for one attempt here instead of on the shared ``ExportContext``."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


@dataclass
class AttemptScratch:
    loaded: Any = None  # the exporter's graph onnxruntime already loaded (the check skips that load)
    checked: Any = None  # the exporter's graph onnx's full check already passed, on the file it wrote


_CURRENT: ContextVar[AttemptScratch | None] = ContextVar("cann_export_capture_attempt", default=None)


@contextmanager
def attempt() -> Iterator[AttemptScratch]:
    """The scratch of the exporter attempt run inside the block."""
    scratch = AttemptScratch()
    token = _CURRENT.set(scratch)
    try:
        yield scratch
    finally:
        _CURRENT.reset(token)


def note_loaded(graph: Any) -> None:
    """An exporter says onnxruntime loaded ``graph`` (None: what it noted before no longer holds)."""
    scratch = _CURRENT.get()
    if scratch is not None:
        scratch.loaded = graph


def note_checked(graph: Any) -> None:
    """An exporter says onnx's full check passed on the file ``graph`` was loaded from."""
    scratch = _CURRENT.get()
    if scratch is not None:
        scratch.checked = graph
