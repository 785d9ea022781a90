"""One row of the stage table: what a stage is called, the function that runs it, the error that wraps
its failures and whether the options ask for it. Kept free of the stage bodies, so hook specs can name it."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .. import errors
from ..context import ExportContext
from ..options import ExportOptions

StageFn = Callable[[ExportContext], "str | None"]  # returns a status ("ok", "3 files staged", ...) or None
ProgressFn = Callable[[int, str, str, float], None]  # (index, stage, status, seconds)


def always(options: ExportOptions) -> bool:
    return True


@dataclass(frozen=True)
class Stage:
    """A step of the export pipeline. ``step`` names a later part of a stage: write stages its files before
    validate and commits them after (``Stage("write", ..., step="commit")``), both reported as stage 9."""

    name: str
    run: StageFn
    error: type[errors.ExportError]
    enabled: Callable[[ExportOptions], bool] = always
    step: str | None = None

    @property
    def key(self) -> str:
        """Where its time goes in ``ctx.stage_seconds``: the stage's name, or ``name.step``."""
        return f"{self.name}.{self.step}" if self.step else self.name
