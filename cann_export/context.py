"""The context that flows through the export stages, and what a loader returns."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .options import ExportOptions


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
    explicit_inputs: Any = None  # export(example_inputs=...): a tensor, a tuple, a dict or a file path
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
    manifest_sha256: str | None = None  # of the staged manifest.json, when the format writes one
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
