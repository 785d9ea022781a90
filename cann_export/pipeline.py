"""The ordered export stages and the context object that flows through them."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import errors
from .options import ExportOptions

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


@dataclass
class LoadedModel:
    """What a loader returns: the model, inputs stored with it (if any) and where it came from."""

    model: Any
    kind: str  # "module", "torchscript", "exported_program"
    example_inputs: dict[str, Any] | None = None
    source_path: str | None = None
    source_sha256: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass
class ExportContext:
    """Everything the stages read and add. A stage touches only its own fields."""

    options: ExportOptions
    source: Any  # a path or an in-memory model
    output_path: Path
    loaded: LoadedModel | None = None
    model: Any = None
    input_names: list[str] = field(default_factory=list)
    example_inputs: dict[str, Any] = field(default_factory=dict)
    input_sets: list[dict[str, Any]] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)
    reference_outputs: list[list[Any]] = field(default_factory=list)  # numpy arrays per input set
    onnx_model: Any = None
    capture: dict[str, Any] = field(default_factory=dict)
    optimize: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    provenance: dict[str, str] = field(default_factory=dict)
    reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    lint_reports: list[str] = field(default_factory=list)  # names in ``reports`` that lint validators wrote
    format: Any = None
    staging: Path | None = None
    onnx_path: Path | None = None  # the written graph (inside staging until commit)
    files: list[Path] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)  # set by the format's finalize()
    stage_seconds: dict[str, float] = field(default_factory=dict)
    module_paths: dict[str, str] = field(default_factory=dict)  # onnx node name -> torch module path
    module_origins: dict[str, dict[str, str]] = field(default_factory=dict)  # stamp key -> {node: value}
    capture_notes: list[str] = field(default_factory=list)  # why an exporter missed the requested opset
    # quantization (--qat / --ptq, or a model prepared with cann_export.qat.prepare)
    teacher: Any = None  # the float model
    float_reference_outputs: list[list[Any]] = field(default_factory=list)
    calibration_batches: list[dict[str, Any]] = field(default_factory=list)
    quant_table: dict[str, dict[str, Any]] = field(default_factory=dict)  # module path -> scales, zero points
    # trace specialisation: TracerWarnings of the capture, and inputs that may take other paths
    trace_warnings: list[dict[str, Any]] = field(default_factory=list)
    path_input_sets: list[dict[str, Any]] = field(default_factory=list)
    path_reference_outputs: list[list[Any]] = field(default_factory=list)
    halted: str | None = None  # set by a stage when this process must not go on (e.g. DDP rank != 0)


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
