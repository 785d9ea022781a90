"""Live progress of an export, as events: a stage starts, advances over countable work (parity input sets,
emulated sets, gears, components, QAT steps), ends. The library never prints them: they go to the
``cann_export.progress`` logger and to the caller's callback (``export(..., on_progress=fn)``); the CLI draws
them (cli/progress_view.py). A stage reports countable work with ``advance("input sets", 3, 5)``, wherever it
runs: with no listener it costs a context-variable lookup."""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import asdict, dataclass, replace
from typing import Any

from .safe_text import terminal

LOG = logging.getLogger("cann_export.progress")
KINDS = ("start", "advance", "end")


@dataclass(frozen=True)
class ProgressEvent:
    """``kind``: "start" | "advance" | "end"; ``index``/``stages``: the stage's place in the pipeline (0 when
    the event comes from outside one); ``done``/``total``/``what``: an "advance" event's count; ``graph``: the
    component of a multi-graph export the event is about ("" for a single graph)."""

    kind: str
    stage: str
    index: int = 0
    stages: int = 0
    status: str = ""
    seconds: float = 0.0
    done: int = 0
    total: int = 0
    what: str = ""
    graph: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> ProgressEvent:
        """From a dict another process sent (the load sandbox's child): every field checked."""
        if not isinstance(data, dict) or data.get("kind") not in KINDS:
            raise ValueError("not a progress event")
        kinds = {"stage": str, "index": int, "stages": int, "status": str, "seconds": float, "done": int, "total": int,
                 "what": str, "graph": str}
        values = {}
        for key, kind in kinds.items():
            value = data.get(key, kind())
            if not isinstance(value, (int, float) if kind is float else kind) or isinstance(value, bool):
                raise ValueError(f"progress event field {key!r} is not {kind.__name__}")
            values[key] = kind(value)
        return cls(kind=data["kind"], **{k: v[:200] if isinstance(v, str) else v for k, v in values.items()})


Listener = Callable[[ProgressEvent], None]
_listener: ContextVar[Listener | None] = ContextVar("cann_export_progress_listener", default=None)
_stage: ContextVar[tuple[str, int, int]] = ContextVar("cann_export_progress_stage", default=("", 0, 0))
_graph: ContextVar[str] = ContextVar("cann_export_progress_graph", default="")


@contextlib.contextmanager
def listening(listener: Listener | None) -> Iterator[None]:
    """Send the events emitted inside this block to ``listener`` too (None: logging only)."""
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)


@contextlib.contextmanager
def in_stage(name: str, index: int, stages: int) -> Iterator[None]:
    """Name the running stage for ``advance`` events emitted inside it."""
    token = _stage.set((name, index, stages))
    try:
        yield
    finally:
        _stage.reset(token)


@contextlib.contextmanager
def for_graph(name: str) -> Iterator[None]:
    """Within: every event names the graph ``name`` (one component of a multi-graph export)."""
    token = _graph.set(name)
    try:
        yield
    finally:
        _graph.reset(token)


@contextlib.contextmanager
def step(name: str) -> Iterator[None]:
    """Work outside the pipeline's stages (loading a model directory, planning its graphs) as a start and an end
    event (index 0), so a live view never sits silent on it."""
    import time

    emit(ProgressEvent("start", name))
    started = time.perf_counter()
    yield
    emit(ProgressEvent("end", name, status="done", seconds=time.perf_counter() - started))


def place(event: ProgressEvent) -> str:
    """``[decoder_with_past 3/12] `` / ``[3/12] `` / ``[decoder] `` / "": where an event stands, for a line."""
    count = f"{event.index}/{event.stages}" if event.index else ""
    inside = " ".join(p for p in (event.graph, count) if p)
    return f"[{inside}] " if inside else ""


def emit(event: ProgressEvent) -> None:
    if not event.graph and _graph.get():
        event = replace(event, graph=_graph.get())
    where, stage = terminal(place(event)), terminal(event.stage)  # text from the load sandbox's child: escaped
    if event.kind == "advance":
        LOG.debug("%s%s: %s %d/%d", where, stage, terminal(event.what), event.done, event.total)
    elif event.kind == "start":
        LOG.info("%s%s ...", where, stage)
    else:
        LOG.info("%s%s ... %s (%.2fs)", where, stage, terminal(event.status), event.seconds)
    listener = _listener.get()
    if listener is not None:
        listener(event)


def advance(what: str, done: int, total: int) -> None:
    """Countable work of the running stage: ``done`` of ``total`` ``what`` (e.g. "input sets")."""
    if _listener.get() is None and not LOG.isEnabledFor(logging.DEBUG):
        return
    stage, index, stages = _stage.get()
    emit(ProgressEvent("advance", stage, index, stages, done=int(done), total=int(total), what=what))


def counted(items: list[Any], what: str) -> Iterator[Any]:
    """``items``, reporting each one done as ``what``."""
    total = len(items)
    for k, item in enumerate(items):
        yield item
        advance(what, k + 1, total)
