"""Errors raised by the library. Each names the stage, the file involved and what to do next.

Only the CLI turns them into messages and exit codes (see ``exit_code``).
"""
from __future__ import annotations

# Exit codes of the CLI, documented in the README.
EXIT_OK = 0
EXIT_PARITY_FAILED = 1  # the artifact was written, but numeric parity failed (recorded in its manifest)
EXIT_USER_ERROR = 2  # bad input: a file, an option, an existing output
EXIT_STAGE_FAILED = 3  # a pipeline stage could not produce a result for a valid input


class ExportError(Exception):
    """Base error: ``stage`` is the pipeline stage, ``path`` the file involved (if any)."""

    stage = "export"
    exit_code = EXIT_USER_ERROR

    def __init__(self, message: str, *, path: str | None = None, stage: str | None = None):
        super().__init__(message)
        self.message = message
        self.path = str(path) if path is not None else None
        if stage is not None:
            self.stage = stage

    def __str__(self) -> str:
        where = f" ({self.path})" if self.path else ""
        return f"[{self.stage}]{where} {self.message}"

    def to_dict(self) -> dict:
        return {"stage": self.stage, "message": self.message, "path": self.path}


class OptionsError(ExportError):
    stage = "options"


class LoadError(ExportError):
    stage = "load"


class PrepareError(ExportError):
    stage = "prepare"


class StripError(ExportError):
    stage = "strip"
    exit_code = EXIT_STAGE_FAILED


class CaptureError(ExportError):
    stage = "capture"
    exit_code = EXIT_STAGE_FAILED


class OptimizeError(ExportError):
    stage = "optimize"
    exit_code = EXIT_STAGE_FAILED


class AnnotateError(ExportError):
    stage = "annotate"


class LintError(ExportError):
    stage = "lint"


class WriteError(ExportError):
    stage = "write"


class ValidateError(ExportError):
    stage = "validate"


class PublishError(ExportError):
    stage = "publish"


class PluginError(ExportError):
    stage = "plugins"
