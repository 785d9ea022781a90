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
        out = {"stage": self.stage, "message": self.message, "path": self.path}
        cause = innermost_cause(self)
        if cause is not self and one_line(cause) not in self.message:
            out["cause"] = f"{type(cause).__name__}: {one_line(cause)}"
        return out


class OptionsError(ExportError):
    stage = "options"


class LoadError(ExportError):
    stage = "load"


class PrepareError(ExportError):
    stage = "prepare"


class TrainError(ExportError):
    stage = "train"


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


def cause_chain(e: BaseException) -> list[BaseException]:
    """``e`` and its causes, outermost first (``raise ... from``, else the implicit context)."""
    chain, seen = [e], {id(e)}
    while True:
        nxt = chain[-1].__cause__ or (None if chain[-1].__suppress_context__ else chain[-1].__context__)
        if nxt is None or id(nxt) in seen:
            return chain
        chain.append(nxt)
        seen.add(id(nxt))


def innermost_cause(e: BaseException) -> BaseException:
    """The root of ``e``'s chain: the error that started it (``e`` itself when it has no cause)."""
    return cause_chain(e)[-1]


def one_line(e: BaseException, limit: int = 400) -> str:
    """``str(e)`` on one line, without terminal colours; for a message that embeds a traceback
    (TorchScript, torch.onnx) the last line, which names the failure. Cut at ``limit`` characters."""
    from .fs.jsonio import strip_ansi

    text = e.message if isinstance(e, ExportError) else str(e)
    lines = [line.strip() for line in strip_ansi(text).strip().splitlines() if line.strip()]
    if any("Traceback" in line for line in lines):
        lines = lines[-1:]
    text = " ".join(" ".join(lines).split())
    return text if len(text) <= limit else text[:limit] + " ..."


def gist(e: BaseException, limit: int = 400) -> str:
    """One line for ``e`` that always keeps the innermost cause of its chain (the line a user needs,
    e.g. torch's ``ValueError: Cannot view a tensor with shape ...`` under an exporter's summary)."""
    inner = innermost_cause(e)
    if inner is e:
        return one_line(e, limit)
    cause = f"{type(inner).__name__}: {one_line(inner, limit)}"
    head = one_line(e, max(limit - len(cause), 80))
    if one_line(inner, limit) in head:
        return head
    return f"{head} (cause: {cause})"
