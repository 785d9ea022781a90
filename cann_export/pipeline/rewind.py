"""The stages in order, and back to capture once validate rejects a trace kept there before its check
(capture/trace_judged_by_parity.py): the context goes back to what it was before capture (``snapshot`` / ``restore``),
what the write stage staged is discarded, and capture runs with that trace set aside."""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from typing import Any

from ..context import ExportContext, LoadedModel, Reports
from .stage import Stage

# not restored: the timer's record, the rejections themselves, the model, and what says the process stops
KEPT = {"stage_seconds", "stage_peak_mib", "traces_rejected", "model", "halted", "sandbox_dir"}


def in_order(ctx: ExportContext, stages: tuple[Stage, ...], start: int = 0,
             stop: int | None = None) -> Iterator[tuple[int, Stage]]:
    """(index, stage) for ``stages[start:stop]``; after validate rejected the deferred trace, capture's again."""
    from ..capture import trace_judged_by_parity

    stop = len(stages) if stop is None else stop
    names = [s.name for s in stages]
    at = names.index("capture") if "capture" in names[start:stop] else None
    ctx.trace_rewind = bool(at is not None and "validate" in names[at:stop])
    index, saved = start, None
    while index < stop:
        if index == at:
            saved = snapshot(ctx)
        yield index, stages[index]
        rejected = trace_judged_by_parity.rejected(ctx) if stages[index].name == "validate" and saved else None
        if rejected is not None:
            restore(ctx, saved)
            ctx.traces_rejected[rejected[0]] = rejected[1]
            index = at
            continue
        index += 1


def snapshot(ctx: ExportContext) -> dict[str, Any]:
    """The context's fields, their containers copied (the stages after it replace or fill them in place)."""
    return {f.name: _copied(getattr(ctx, f.name)) for f in dataclasses.fields(ctx) if f.name not in KEPT}


def restore(ctx: ExportContext, saved: dict[str, Any]) -> None:
    """The context as ``saved`` (copied again: another rewind starts from the same state); the staged files of
    the rejected graph are removed."""
    from ..fs import atomic

    if ctx.staging is not None and ctx.staging != saved.get("staging"):
        atomic.discard(ctx.staging)
    for name, value in saved.items():
        setattr(ctx, name, _copied(value))


def _copied(value: Any) -> Any:
    if isinstance(value, list):
        return [_shallow(v) for v in value]
    if isinstance(value, dict):
        return {k: _shallow(v) for k, v in value.items()}
    if isinstance(value, Reports):
        return copy.deepcopy(value)
    if isinstance(value, LoadedModel):
        return dataclasses.replace(value, extras=dict(value.extras))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return copy.copy(value)  # the options: fields are replaced, not changed in place
    return value


def _shallow(value: Any) -> Any:
    return list(value) if isinstance(value, list) else dict(value) if isinstance(value, dict) else value
