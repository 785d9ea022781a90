"""The context that flows through the export stages, and what a loader returns."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .options import ExportOptions
from .reports import CaptureReport, Reports

if TYPE_CHECKING:
    from .capture.large_graph import LargeGraph


@dataclass(slots=True)
class LoadedModel:
    """What a loader returns: the model, inputs stored with it (if any) and where it came from."""

    model: Any
    kind: str  # "module", "torchscript", "exported_program"
    example_inputs: dict[str, Any] | None = None
    source_path: str | None = None
    source_sha256: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class ExportContext:
    """Everything the stages read and add. A stage touches only its own fields; every field is declared
    here (slots: assigning an undeclared one is an AttributeError)."""

    options: ExportOptions  # what the user asked for, checked before any stage ran
    source: Any  # a path or an in-memory model
    output_path: Path  # the artifact's path (a format may add its suffix)
    loaded: LoadedModel | None = None  # what the load stage got from the source
    model: Any = None  # the model the next stage works on (eval, stripped, fake-quant)
    explicit_inputs: Any = None  # export(example_inputs=...): a tensor, a tuple, a dict or a file path
    input_names: list[str] = field(default_factory=list)  # the graph's inputs, in order
    example_inputs: dict[str, Any] = field(default_factory=dict)  # name -> tensor the capture runs on
    input_sets: list[dict[str, Any]] = field(default_factory=list)  # parity inputs: the example, then variants
    output_names: list[str] = field(default_factory=list)  # the reference's outputs, flattened
    reference_outputs: list[list[Any]] = field(default_factory=list)  # numpy arrays per input set
    onnx_model: Any = None  # the captured onnx.ModelProto (slim, for a large graph)
    capture: CaptureReport | None = None  # set by the capture stage
    optimize: dict[str, Any] = field(default_factory=dict)  # onnxsim's verdict (manifest.json's "optimize")
    metadata: dict[str, str] = field(default_factory=dict)  # the user's metadata, as strings
    provenance: dict[str, str] = field(default_factory=dict)  # tool versions, source, exporter
    reports: Reports = field(default_factory=Reports)  # every stage's report, one typed field each
    format: Any = None  # the Format the export writes
    staging: Path | None = None  # the write stage's temp directory, renamed into place at commit
    onnx_path: Path | None = None  # the written graph (inside staging until commit)
    final_onnx: Path | str | None = None  # where the graph is after commit, when not output_path[/name]
    files: list[Path] = field(default_factory=list)  # what the format staged
    manifest: dict[str, Any] = field(default_factory=dict)  # set by the format's finalize()
    manifest_sha256: str | None = None  # of the staged manifest.json, when the format writes one
    stage_seconds: dict[str, float] = field(default_factory=dict)  # stage -> wall seconds
    module_paths: dict[str, str] = field(default_factory=dict)  # onnx node name -> torch module path
    module_origins: dict[str, dict[str, str]] = field(default_factory=dict)  # stamp key -> {node: value}
    capture_notes: list[str] = field(default_factory=list)  # why an exporter missed the requested opset
    large_graph: LargeGraph | None = None  # weights past external_data_threshold: the graph lives on disk
    large_graph_decided: bool = False  # large_graph was decided (once, before the first capture)
    # quantization (--qat / --ptq, or a model prepared with cann_export.qat.prepare)
    teacher: Any = None  # the float model
    float_reference_outputs: list[list[Any]] = field(default_factory=list)  # the float model's, per input set
    calibration_batches: list[dict[str, Any]] = field(default_factory=list)  # --calibration-data, batched
    quant_table: dict[str, dict[str, Any]] = field(default_factory=dict)  # module path -> scales, zero points
    # trace specialisation: TracerWarnings of the capture, and inputs that may take other paths
    trace_warnings: list[dict[str, Any]] = field(default_factory=list)  # of the chosen exporter's capture
    path_input_sets: list[dict[str, Any]] = field(default_factory=list)  # sign-flipped / scaled examples
    path_reference_outputs: list[list[Any]] = field(default_factory=list)  # the stripped module's on those
    halted: str | None = None  # set by a stage when this process must not go on (e.g. DDP rank != 0)
