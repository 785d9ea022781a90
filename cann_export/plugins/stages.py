"""The default stage plugins: the timer that wraps every stage, and the default body (the stage's function)."""
from __future__ import annotations

import time
from collections.abc import Generator

from ..context import ExportContext
from ..hooks.specs import hookimpl
from ..pipeline.stage import Stage


@hookimpl(wrapper=True, tryfirst=True)
def run_stage(stage: Stage, ctx: ExportContext) -> Generator[None, str | None, str | None]:
    """Time the stage, its other plugins' wrappers included (``tryfirst``: the outermost), into
    ``ctx.stage_seconds``, and the process's peak RSS at its end into ``ctx.stage_peak_mib``, whether it returns
    or raises."""
    from ..validators.cost import peak_mib

    started = time.perf_counter()
    try:
        return (yield)
    finally:
        ctx.stage_seconds[stage.name] = round(time.perf_counter() - started, 4)
        ctx.stage_peak_mib[stage.name] = peak_mib()


@hookimpl(trylast=True, specname="run_stage")
def default_body(stage: Stage, ctx: ExportContext) -> str:
    """The stage's own function; a plugin's plain ``run_stage`` impl that returns a status replaces it."""
    return stage.run(ctx) or "ok"
