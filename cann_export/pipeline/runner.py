"""``run``: every stage of the table run the same way: through the ``run_stage`` hook (which plugins may
wrap, and the stage timer does), reported through ``progress`` and wrapped in its stage's error."""
from __future__ import annotations

from pathlib import Path

from .. import errors
from ..capture import large_graph
from ..context import ExportContext
from ..fs import atomic
from ..inputs import spill
from ..hooks import manager
from . import chatter, rewind
from .. import heap_release
from . import sandboxed_file as confined
from .stage import ProgressFn, Stage
from .table import STAGES


def run(ctx: ExportContext, progress: ProgressFn | None = None, stages: tuple[Stage, ...] = STAGES) -> None:
    """Run ``stages`` in order until one fails or one halts the process (``ctx.halted``: a DDP rank other
    than 0). A failure before the artifact is committed discards its staging, so nothing is left at the
    output; the capture's work directory beside the output is removed however the run ends."""
    registry = manager.registry()
    try:
        ctx.reports.sandbox = confined.plan(ctx)
        start = 0
        if ctx.reports.sandbox["kind"] != "none":
            start = confined.run_confined(ctx, stages, progress, run_one)
        for index, stage in rewind.in_order(ctx, stages, start):
            if ctx.halted:  # this process writes nothing: what a stage staged is not left behind
                atomic.discard(ctx.staging)
                break
            run_one(ctx, stage, registry, progress, index + 1, len(stages))
    except BaseException:
        atomic.discard(ctx.staging)
        raise
    finally:
        large_graph.cleanup(ctx)
        spill.discard(ctx)
        confined.cleanup(ctx)


def run_one(ctx: ExportContext, stage: Stage, registry: manager.Registry, progress: ProgressFn | None,
            index: int, stages: int = 0) -> str:
    """One stage: "skipped" when its options do not ask for it; else through the ``run_stage`` hook. Errors
    that are not already an ``ExportError`` are wrapped in the stage's error with their gist, so the CLI
    never shows a traceback for them. Its start and end (and the countable work inside it) are progress
    events (cann_export/progress.py); ``progress`` hears of its end."""
    from .. import collector, progress as events

    if stage.name != "load":
        collector.settle()  # the libraries and the model are loaded: the CLI's collector back on (collector.py)
    if stage.runs(ctx):
        events.emit(events.ProgressEvent("start", stage.name, index, stages))
        heard: list[str] = []
        try:
            with events.in_stage(stage.name, index, stages), chatter.kept(stage.name, heard):
                status = registry.run_stage(stage, ctx) or "ok"
        except errors.ExportError:
            raise
        except Exception as e:
            raise stage.error(f"{type(e).__name__}: {errors.gist(e, 600)}", path=_source_path(ctx),
                              stage=stage.name) from e
        finally:
            if heard:
                ctx.reports.warnings.third_party = (ctx.reports.warnings.third_party or []) + heard
            heap_release.give_back()
    else:
        status = "skipped"
        ctx.stage_seconds[stage.name] = 0.0
    seconds = ctx.stage_seconds.get(stage.name, 0.0)
    events.emit(events.ProgressEvent("end", stage.name, index, stages, str(status), float(seconds)))
    if progress:
        progress(index, stage.name, status, seconds)
    return status


def _source_path(ctx: ExportContext) -> str | None:
    return ctx.loaded.source_path if ctx.loaded else (str(ctx.source) if isinstance(ctx.source, (str, Path)) else None)
