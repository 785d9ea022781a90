"""What one exporter attempt learned about the graph it returns, for the capture stage's check alone: the graph
onnxruntime already loaded (the opset conversion ran it), the graph whose file onnx's full check already passed, and
why the exporter missed the requested opset; and the judge the capture stage was handed, which the opset conversion's
check asks. Stage-private, so it lives for one attempt here instead of on the shared ``ExportContext``."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from ..judging import GraphJudge


@dataclass
class AttemptScratch:
    loaded: Any = None  # the exporter's graph onnxruntime already loaded (the check skips that load)
    checked: Any = None  # the exporter's graph onnx's full check already passed, on the file it wrote
    judge: GraphJudge | None = None  # parity's rules, as the capture stage was handed them (cann_export/judging.py)
    notes: list[str] = field(default_factory=list)  # why the exporter missed the requested opset


_CURRENT: ContextVar[AttemptScratch | None] = ContextVar("cann_export_capture_attempt", default=None)


@contextmanager
def attempt(judge: GraphJudge) -> Iterator[AttemptScratch]:
    """The scratch of the exporter attempt run inside the block, which ``judge`` judges."""
    scratch = AttemptScratch(judge=judge)
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


def note(why: str) -> None:
    """An exporter says why its graph may miss the requested opset (the attempt's note names it)."""
    scratch = _CURRENT.get()
    if scratch is not None:
        scratch.notes.append(why)


def judge() -> GraphJudge:
    """The judge of the exporter attempt running now (an exporter runs inside the capture stage's attempt)."""
    scratch = _CURRENT.get()
    if scratch is None or scratch.judge is None:
        raise RuntimeError("an exporter's graph is judged inside the capture stage's attempt only")
    return scratch.judge
