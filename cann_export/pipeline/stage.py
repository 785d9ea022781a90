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
    """A step of the export pipeline: its name, the function that runs it, the error class that wraps its
    failures, whether the options ask for it, and (``needed``) whether an export whose options do not ask for it
    needs it all the same (validate under --no-validate, for a trace kept before its check)."""

    name: str
    run: StageFn
    error: type[errors.ExportError]
    enabled: Callable[[ExportOptions], bool] = always
    needed: Callable[[ExportContext], bool] | None = None

    def runs(self, ctx: ExportContext) -> bool:
        return self.enabled(ctx.options) or (self.needed is not None and self.needed(ctx))
