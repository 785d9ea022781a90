"""The ordered export stages and the context object that flows through them."""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from .. import errors
from ..context import ExportContext

STAGES = (
    "load", "prepare", "train", "strip", "capture", "optimize",
    "annotate", "lint", "write", "validate", "publish",
)
_STAGE_ERRORS = {
    "load": errors.LoadError, "prepare": errors.PrepareError, "strip": errors.StripError,
    "capture": errors.CaptureError, "optimize": errors.OptimizeError, "annotate": errors.AnnotateError,
    "lint": errors.LintError, "write": errors.WriteError, "validate": errors.ValidateError,
    "publish": errors.PublishError,
}

ProgressFn = Callable[[int, str, str, float], None]  # (index, stage, status, seconds)


def run_stages(ctx: ExportContext, handlers: dict[str, Callable[[ExportContext], str | None]],
               progress: ProgressFn | None = None, only: tuple[str, ...] = STAGES) -> None:
    """Run each stage in order; a handler returns a status word ("ok", "skipped", ...) or None for ok.

    Errors that are not already ``ExportError`` are wrapped in the stage's error with their gist,
    so the CLI never shows a traceback for them.
    """
    for index, stage in enumerate(STAGES, start=1):
        if stage not in only or ctx.halted:
            continue
        handler = handlers.get(stage)
        started = time.perf_counter()
        if handler is None:
            status = "skipped"
        else:
            try:
                status = handler(ctx) or "ok"
            except errors.ExportError:
                raise
            except Exception as e:
                cls = _STAGE_ERRORS.get(stage, errors.ExportError)
                raise cls(f"{type(e).__name__}: {_gist(e)}", path=_source_path(ctx), stage=stage) from e
        seconds = time.perf_counter() - started
        ctx.stage_seconds[stage] = round(seconds, 4)
        if progress:
            progress(index, stage, status, seconds)


def _source_path(ctx: ExportContext) -> str | None:
    return ctx.loaded.source_path if ctx.loaded else (str(ctx.source) if isinstance(ctx.source, (str, Path)) else None)


def _gist(e: BaseException, limit: int = 600) -> str:
    return errors.gist(e, limit)
