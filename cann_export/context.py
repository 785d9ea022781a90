"""The context that flows through the export stages, what a loader returns, and what the stages report.

The reports are typed records; each has ``to_dict()``: the exact JSON that manifest.json, parity.json and
``--json`` hold (fields in declared order, unset ones left out)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from .options import ExportOptions

if TYPE_CHECKING:
    from .capture.large_graph import LargeGraph
    from .decisions import Decisions

# What a Validator.check returns: "passed", usually "findings", and the validator's own keys.
ValidatorReport = dict[str, Any]


def compact(record: Any) -> dict[str, Any]:
    """``record``'s fields in declared order, None left out, nested records as their ``to_dict()``."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if value is None:
            continue
        if isinstance(value, list):
            value = [v.to_dict() if hasattr(v, "to_dict") else v for v in value]
        elif hasattr(value, "to_dict"):
            value = value.to_dict()
        out[f.name] = value
    return out


@dataclass(slots=True)
class CaptureAttempt:
    """One exporter's try: the opset of the valid graph it wrote, or why it failed."""

    exporter: str
    opset: int | None = None  # the opset the exporter wrote (its graph passed the check)
    error: str | None = None  # why there is no graph ("does not support this model type", the exception)
    note: str | None = None  # why the graph missed the requested opset

    def to_dict(self) -> dict[str, Any]:
        return compact(self)


@dataclass(slots=True)
class CaptureReport:
    """The capture stage's outcome: which exporter wrote the graph, at what opset, and every attempt."""

    exporter: str
    opset: int
    opset_requested: int
    attempts: list[CaptureAttempt] = field(default_factory=list)
    specialized: dict[str, Any] | None = None  # a traced graph that warned: {traced_path_only, accepted, warnings}
    guards: list[dict[str, Any]] | None = None  # the input checks the trace passed (capture/trace_guards.py)
    warning: str | None = None  # another opset than requested was written (no --strict-opset)

    def to_dict(self) -> dict[str, Any]:
        return compact(self)


@dataclass(slots=True)
class DeviceParity:
    """The emulated device-precision run of a parity report (atc_ready / om), judged apart from fp32."""

    passed: bool
    tolerance: dict[str, Any] | None = None
    outputs: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "tolerance": self.tolerance, "outputs": self.outputs}


@dataclass(slots=True)
class ParityReport:
    """The parity verdict of the written graph (parity.json). The nested levels stay plain JSON data."""

    reference: str
    runtime: str
    input_sets: int
    tolerance: dict[str, Any]
    outputs: list[dict[str, Any]]  # per output: name, shape, max_abs, max_rel, cosine, passed, ...
    passed: bool = False
    reason: str | None = None
    precision: dict[str, Any] | None = None  # the device precision mode emulated (and --fix-precision's rounds)
    graph_fp32: dict[str, Any] | None = None  # the fp32 verdict when a device run replaced ``outputs``
    device: DeviceParity | None = None
    first_divergence: dict[str, Any] | None = None  # the node where device precision breaks
    fixed_by_keep_dtype: list[str] | None = None
    input_sets_from: dict[str, int] | None = None  # example / random / parity_data counts
    sets: list[dict[str, Any]] | None = None  # what each input set was (index, source, kind, role)
    failing_sets: list[dict[str, Any]] | None = None  # each failing (set, output): the set's kind and metrics
    probes: dict[str, Any] | None = None  # the specialisation probes' own verdict (not the fp32 verdict sets)
    trace_specialized: dict[str, Any] | None = None
    shapes: list[dict[str, Any]] | None = None  # a dynamic graph: the fp32 and device verdicts per shape
    shape_budget: dict[str, Any] | None = None  # the element budget of those shapes and what it left out
    stored: dict[str, Any] | None = None  # the input sets the bundle's parity data holds, when not all (parity_store)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ParityReport:
        """From the dict the parity builders assemble; an unknown top-level key is a TypeError."""
        values = dict(data)
        if isinstance(values.get("device"), dict):
            values["device"] = DeviceParity(**values["device"])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return compact(self)


@dataclass(slots=True)
class Warnings:
    """Things the user should know that did not stop the export (manifest.json's "warnings")."""

    atc_hints: list[str] | None = None  # from resolving --atc-hint
    inputs: str | None = None  # example inputs inferred from the first layer
    torch_program: str | None = None  # why the bundle has no torch/program.pt2
    dynamic: list[str] | None = None  # a dynamic axis the exported graph fixed (a static graph from a dynamic source)
    trace: str | None = None  # a traced graph kept after the trace gate's check (capture/exporter_choice.py)
    frozen: list[str] | None = None  # forward arguments changing the outputs, no input (inputs/frozen_arguments)
    third_party: list[str] | None = None  # torch / onnxscript log warnings while the stages ran (pipeline/chatter.py)
    environment: str | None = None  # an installed torchvision that does not import, hidden (load/torchvision_pair.py)
    soc: str | None = None  # a --soc-version outside options.KNOWN_SOCS, let through by --allow-unknown-soc

    def to_dict(self) -> dict[str, Any]:
        return compact(self)


@dataclass(slots=True)
class ReferenceReport:
    """The PyTorch reference: where it ran and how many input sets of each kind it ran on."""

    device: str | None = None
    input_sets: dict[str, int] = field(default_factory=dict)  # example / random / parity_data
    row_reuse: dict[str, Any] | None = None  # the batch sizes' shared eager rows and their proof (inputs/row_reuse)
    shape_budget: dict[str, Any] | None = None  # the parity shape budget (inputs/parity_budget, inputs/shape_budget)


@dataclass(slots=True)
class StripReport:
    """The strip stage: the module passes that ran and the Conv-BN pairs folded in the module."""

    module_passes: list[str] = field(default_factory=list)
    conv_bn_folded_in_module: Any = None


@dataclass(slots=True)
class QuantizationReport:
    """--qat / --ptq, or a model quantized in Python (manifest.json's and the graph's "quantization")."""

    mode: str | None = None
    config: dict[str, Any] | None = None
    calibration_data: dict[str, Any] | None = None  # path, sha256, samples
    quantized_layers: int | None = None
    device: str | None = None  # where QAT fine-tuned
    qat: dict[str, Any] | None = None  # steps, lr, first and last loss
    folded_bn_at_export: Any = None
    kept_bn: list[str] | None = None  # BatchNorms not after a conv: kept in the graph, computed in float
    placement: dict[str, Any] | None = None  # qat.placement: what the graph pass changed for AMCT
    torch_ao: dict[str, Any] | None = None  # a torch.ao prepare_qat model's fake quantizers
    layers: dict[str, dict[str, Any]] | None = None  # module path -> the Q/DQ it was lowered to
    int8_vs_float: dict[str, Any] | None = None  # the accuracy cost of int8, apart from parity

    def to_dict(self) -> dict[str, Any]:
        return compact(self)


@dataclass(slots=True)
class PrecisionFix:
    """What --fix-precision kept in fp32 (keep_dtype.cfg) and whether device parity then passed."""

    kept: list[str] = field(default_factory=list)
    fixed: bool = False
    passed: bool | None = None


@dataclass(slots=True)
class Reports:
    """Every report of an export, one typed field each."""

    warnings: Warnings = field(default_factory=Warnings)
    reference: ReferenceReport = field(default_factory=ReferenceReport)
    strip: StripReport = field(default_factory=StripReport)
    quantization: QuantizationReport | None = None
    atc: dict[str, Any] = field(default_factory=dict)  # ATC options, command and the om (manifest.json's "atc")
    precision_fix: PrecisionFix | None = None
    parity: ParityReport | None = None
    lint: dict[str, ValidatorReport] = field(default_factory=dict)  # lint-stage validators, by name
    validators: dict[str, ValidatorReport] = field(default_factory=dict)  # other validate-stage validators
    publish: dict[str, Any] | None = None  # the model zoo record (--publish)
    sandbox: dict[str, Any] | None = None  # the load sandbox that ran the stages before commit, or why none
    layers: dict[str, Any] | None = None  # the device run's per-layer curve (validators/layers.py), for report.html

    def quantization_report(self, mode: str | None = None) -> QuantizationReport:
        """The quantization report, started with ``mode`` when there is none yet."""
        if self.quantization is None:
            self.quantization = QuantizationReport(mode=mode)
        return self.quantization


class LoadedExtras(TypedDict, total=False):
    """What a loader knows beyond the module, each key declared with its type (a key not here is read nowhere)."""

    input_names: list[str]  # the graph's inputs in forward's order
    positional: bool  # the inputs are passed positionally (their names need not be Python identifiers)
    keyword_inputs: list[str]  # a torch.export program's keyword inputs
    program_dims: dict[str, Any]  # a program's symbolic dims: {input: {axis: {"symbol", "min", "max"}}}
    exporter_order: list[str]  # the order capture tries the exporters under --exporter auto
    shape_sets: Any  # a module's own parity sets at other shapes (graph_shape_sets: a multi-graph component)
    recorded_batch: dict[str, Any]  # the batch sizes the recorded calls varied, by input (low, high)
    output_axes: dict[str, dict[int, str]]  # {output: {axis: dimension name}}
    graph_axes: dict[str, dict[int, str]]  # {input: {axis: dimension name}}, for the TorchScript exporter
    dynamic_shapes: Any  # a module's own torch.export dynamic_shapes
    dynamic_axes: dict[str, dict[int, str]]  # the axes the model computes at any size (the dynamic stage's defaults)
    dynamic_ranges: dict[str, Any]  # {input: {axis: [min, max or None]}}
    static_axes: list[dict[str, Any]]  # axes Optimum names dynamic kept fixed: {input, axes, sizes, why}
    task: str  # the task's name (Optimum's)
    hf: dict[str, Any]  # a Hugging Face model's task, architecture, model_type, dummy input specs, outputs, axes
    bundle_files: dict[str, bytes]  # {"hf/NAME": bytes}: the files bundle formats carry
    pickled_module: bool  # the file held a whole pickled module (only when trusted)
    eos_rows: int | None  # the eos token id when the model pools at it (inputs/eos_rows.py)
    checkpoint_keys: list[str]  # a checkpoint's keys beside its state_dict
    epoch: Any  # a checkpoint's epoch
    optimizer_state: Any  # a checkpoint's optimizer state


@dataclass(slots=True)
class LoadedModel:
    """What a loader returns: the model, inputs stored with it (if any) and where it came from."""

    model: Any
    kind: str  # "module", "torchscript", "exported_program"
    example_inputs: dict[str, Any] | None = None
    source_path: str | None = None
    source_sha256: str | None = None
    extras: LoadedExtras = field(default_factory=dict)


@dataclass(slots=True)
class ExportContext:
    """Everything the stages read and add. A stage touches only its own fields; every field is declared
    here (slots: assigning an undeclared one is an AttributeError)."""

    options: ExportOptions  # what the user asked for, checked before any stage ran
    source: Any  # a path or an in-memory model
    output_path: Path  # the artifact's path (a format may add its suffix)
    loaded: LoadedModel | None = None  # what the load stage got from the source
    decisions: Decisions | None = None  # what the stages after load do, decided once after load (decisions.py)
    model: Any = None  # the model the next stage works on (eval, stripped, fake-quant)
    explicit_inputs: Any = None  # export(example_inputs=...): a tensor, a tuple, a dict or a file path
    input_names: list[str] = field(default_factory=list)  # the graph's inputs, in order
    # the dynamic axes (cann_export.dynamic.DynamicAxis): resolved in prepare, those the graph kept after capture
    dynamic_axes: list[Any] = field(default_factory=list)
    example_inputs: dict[str, Any] = field(default_factory=dict)  # name -> tensor the capture runs on
    input_sets: list[dict[str, Any]] = field(default_factory=list)  # parity inputs: the example, then variants
    # what each input set is (inputs.tensors.set_label): index, source, kind, role (verdict / probe)
    input_set_labels: list[dict[str, Any]] = field(default_factory=list)
    # per input set, per output: max |fp32 reference - float64 run| (inputs.float_noise), None where not run
    reference_noise: list[list[float] | None] = field(default_factory=list)
    # True while that noise is left unmeasured (inputs.float_noise.defer): measured when the parity verdict could
    # depend on it, or when a bundle stores it before validate ran (after, it stores the least floor it passed)
    reference_noise_deferred: bool = False
    # while it is deferred, the modules strip's Conv+BN fold replaced, on disk (inputs.unfolded): the float64 run
    # measures the model as prepare ran it
    unfolded_modules: Any = None
    # the floor parity's fp32 verdict passed at while that noise stayed deferred (the least floor): what a bundle
    # stores in its place (inputs.float_noise.stored); None when the verdict measured it or never judged so
    verdict_noise: list[list[float] | None] | None = None
    # per input set, per output: the fake-quant reference's own rounding noise, in steps (inputs.quant_noise)
    int8_noise: list[list[dict[str, float]] | None] = field(default_factory=list)
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
    stage_peak_mib: dict[str, float] = field(default_factory=dict)  # stage -> the process's peak RSS at its end
    module_paths: dict[str, str] = field(default_factory=dict)  # onnx node name -> torch module path
    module_origins: dict[str, dict[str, str]] = field(default_factory=dict)  # stamp key -> {node: value}
    large_graph: LargeGraph | None = None  # weights past external_data_threshold: the graph lives on disk
    # quantization (--qat / --ptq, or a model prepared with cann_export.qat.prepare)
    teacher: Any = None  # the float model
    float_reference_outputs: list[list[Any]] = field(default_factory=list)  # the float model's, per input set
    calibration_batches: list[dict[str, Any]] = field(default_factory=list)  # --calibration-data, batched
    quant_table: dict[str, dict[str, Any]] = field(default_factory=dict)  # module path -> scales, zero points
    # a strip pass's other form of the stripped model for torch/program.pt2 (a context manager over the model),
    # e.g. fake quantization as plain arithmetic where torch.export cannot capture the fake-quant ops
    program_form: Any = None
    # the model before the strip passes (a copy, eval mode): torch/program.pt2 is captured from it, so the zoo's
    # module keeps its dropout and BatchNorm for train(); None for quantized models and other formats
    trainable_model: Any = None
    # trace specialisation: TracerWarnings of the capture, and inputs that may take other paths
    trace_warnings: list[dict[str, Any]] = field(default_factory=list)  # of the chosen exporter's capture
    path_input_sets: list[dict[str, Any]] = field(default_factory=list)  # sign-flipped / scaled examples
    path_reference_outputs: list[list[Any]] = field(default_factory=list)  # the stripped module's on those
    # a trace kept before its gate ran (capture/trace_judged_by_parity.py): parity on the written graph decides it
    trace_rewind: bool = False  # the stages run validate after capture, so they can go back to it
    trace_deferred: dict[str, Any] | None = None  # {"exporter", "reason"?} until validate has judged it
    gate_sets_pending: dict[str, Any] | None = None  # {"source", "accepted"}: the gate's sets, built if a trace warns
    trace_probes: bool = True  # the trace's warnings may depend on input values: path probes (capture/shape_tests.py)
    traces_rejected: dict[str, str] = field(default_factory=dict)  # exporter -> why its trace was not kept
    halted: str | None = None  # set by a stage when this process must not go on (e.g. DDP rank != 0)
    finalized: bool = False  # the format's finalize ran (in the load sandbox): commit only moves it into place
    sandbox_dir: Path | None = None  # the directory the load sandbox wrote in, removed after the export
