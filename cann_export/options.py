"""Export options, their defaults and their validation (done before any heavy work)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .dynamic import check_static_shape
from .errors import OptionsError
from .safe_text import check_printable
# the SoC names, their overflow modes and their checks live in socs.py; importable from here as before
from .socs import (INF_NAN, INF_NAN_SOCS, KNOWN_SOCS, OVERFLOW_MODES, SATURATION, SOC_OVERFLOW,  # noqa: F401
                   SOC_PATTERN, SocModel, check_known_soc, check_soc_version, soc_model)

DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int8", "uint8", "bool")


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str | None = None  # None: the model decides (cann_export.inputs.signature.spec_dtypes)

    @property
    def example_shape(self) -> tuple[int, ...]:
        """The shape of the example tensor: a dynamic (-1) dimension is 2 on axis 0 (torch.export specialises
        sizes 0 and 1), else 16."""
        return tuple(d if d != -1 else (2 if axis == 0 else 16) for axis, d in enumerate(self.shape))


def parse_input_shape(text: str) -> InputSpec:
    """Parse ``NAME:D1,D2,...[:DTYPE]``; a dimension of -1 is dynamic with the default range (cann_export.dynamic)
    and an example size of 2 (axis 0) or 16."""
    parts = text.split(":")
    hint = ("write it as NAME:D1,D2,...[:DTYPE], e.g. input_ids:1,128:int64 or pixel_values:1,3,224,224 (-1: a "
            "dynamic dimension with the default range; --dynamic NAME:AXIS=DIM:LO..HI gives its range)")
    if len(parts) not in (2, 3) or not parts[0].strip():
        raise OptionsError(f"--input-shape {text!r} does not parse; {hint}")
    name = parts[0].strip()
    try:
        shape = tuple(int(d) for d in parts[1].split(",") if d.strip() != "")
    except ValueError as e:
        raise OptionsError(f"--input-shape {text!r}: dimensions must be integers; {hint}") from e
    if not shape or any(d <= 0 and d != -1 for d in shape):
        raise OptionsError(f"--input-shape {text!r}: every dimension must be a positive integer or -1; {hint}")
    dtype = parts[2].strip() if len(parts) == 3 else None
    if dtype is not None and dtype not in DTYPES:
        raise OptionsError(f"--input-shape {text!r}: unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return InputSpec(name, shape, dtype)


PRECISION_MODES = (
    "force_fp32", "cube_fp16in_fp32out", "force_fp16", "allow_fp32_to_fp16", "must_keep_origin_dtype",
    "allow_mix_precision", "allow_mix_precision_fp16", "allow_mix_precision_bf16", "allow_fp32_to_bf16",
)
ATC_OPSETS = range(11, 19)  # ATC accepts ONNX opset 11..18
ONNX_OPSETS = range(7, 24)
EXTERNAL_DATA = ("auto", "always", "never")
LINT_MODES = ("error", "warn", "off")
SANDBOX_MODES = ("auto", "require", "off")
PARITY_COVERAGE = ("axes", "full")  # bundle/coverage.py


# metadata keys under this prefix are the tool's own provenance (cann_export.tool, cann_export.atc_hints, ...)
RESERVED_METADATA_PREFIX = "cann_export."


@dataclass
class Tolerance:
    """Parity policy (calibrated on a corpus, see parity_metrics.py). On the verdict sets (the example,
    draws from its distribution, --parity-data) an output passes when every element satisfies
    |a-b| <= atol + rtol*(|ref| + peak_share*max|ref|) (peak_share*max|ref| becomes noise_share x the
    reference's own fp32-vs-float64 distance where it was measured) and the cosine similarity of the flattened
    output is at least ``min_cosine``; on specialisation probes when max abs error <= atol + probe_rtol*max|ref| and
    cosine >= ``probe_min_cosine``."""

    atol: float = 1e-4
    rtol: float = 1e-3
    min_cosine: float = 0.999
    peak_share: float = 1.0
    # with the reference's own fp32-vs-float64 distance measured, rtol x noise_share (50) of it replaces peak_share
    noise_share: float = 5e4
    probe_rtol: float = 1e-2
    probe_min_cosine: float = 0.999
    # device-precision (fp16/bf16 emulation) policy, see validators/device_verdict.py: an output fails on
    # inf/nan where fp32 is finite, on cosine < device_fail_cosine, or on cosine < device_min_cosine with
    # max abs error above its noise floor max(device_atol, eps x max |reference|)
    device_min_cosine: float = 0.99
    device_fail_cosine: float = 0.9
    device_atol: float = 1e-3
    # int8 (Q/DQ graph against the fake-quant model) policy, in the output's 8-bit steps: see
    # parity_metrics.py compare_quantized
    int8_rms_steps: float = 1.0
    int8_max_steps: float = 16.0
    int8_min_cosine: float = 0.9995

    def to_dict(self) -> dict[str, float]:
        return {"atol": self.atol, "rtol": self.rtol, "min_cosine": self.min_cosine,
                "peak_share": self.peak_share, "noise_share": self.noise_share,
                "probe_rtol": self.probe_rtol, "probe_min_cosine": self.probe_min_cosine,
                "device_min_cosine": self.device_min_cosine, "device_fail_cosine": self.device_fail_cosine,
                "device_atol": self.device_atol, "int8_rms_steps": self.int8_rms_steps,
                "int8_max_steps": self.int8_max_steps, "int8_min_cosine": self.int8_min_cosine}

    def check(self) -> None:
        """Refuse a tolerance parity could not honour: nan/inf or negative atol/rtol, a cosine outside [-1, 1]."""
        for name in ("atol", "rtol", "peak_share", "noise_share", "probe_rtol", "device_atol", "int8_rms_steps",
                     "int8_max_steps"):
            value = getattr(self, name)
            if not _is_real(value) or not math.isfinite(value) or value < 0:
                raise OptionsError(f"{_tolerance_flag(name)} {value!r} is not a finite number >= 0 (nan, inf and "
                                   f"negative tolerances would pass or fail every output); pass e.g. "
                                   f"{_tolerance_flag(name)} {getattr(Tolerance, name)}")
        for name in ("min_cosine", "probe_min_cosine", "device_min_cosine", "device_fail_cosine", "int8_min_cosine"):
            value = getattr(self, name)
            if not _is_real(value) or not -1.0 <= value <= 1.0:  # nan fails the comparison too
                raise OptionsError(f"{_tolerance_flag(name)} {value!r} is not a cosine similarity between -1 and 1; "
                                   f"pass e.g. {_tolerance_flag(name)} {getattr(Tolerance, name)}")

    def with_values(self, **values: Any) -> Tolerance:
        """A copy with the given fields replaced (None: kept); numbers become floats, anything else is kept
        as given so ``check`` names it. What export's and validate's --atol / --rtol / --min-cosine go through."""
        import dataclasses

        unknown = sorted(set(values) - set(self.to_dict()))
        if unknown:
            raise OptionsError(f"unknown tolerance option(s) {', '.join(unknown)}; known: {', '.join(self.to_dict())}")
        return dataclasses.replace(self, **{k: float(v) if _is_real(v) else v for k, v in values.items()
                                            if v is not None})

    def device_policy(self) -> dict[str, float]:
        return {"min_cosine": self.device_min_cosine, "fail_cosine": self.device_fail_cosine,
                "atol": self.device_atol}


@dataclass
class ExportOptions:
    export_format: str = "atc_ready"
    opset: int = 17
    strict_opset: bool = False  # True: a graph at another opset than asked is not accepted
    cann_version: str = "8.0"  # target CANN release for the ATC lint
    lint: str = "error"  # "error": lint errors fail the export; "warn": they are reported only; "off"
    fix_precision: bool = False  # add diverging nodes to keep_dtype until device-precision parity passes
    fix_lint: bool = False  # apply the lint traps' mechanical, value-preserving fixes (atc/lint_fixes.py) to the graph
    soc_version: str = "Ascend310P3"
    allow_unknown_soc: bool = False  # a soc_version outside KNOWN_SOCS is exported with a warning, not refused
    precision_mode: str = "force_fp16"
    metadata: dict[str, str] = field(default_factory=dict)
    atc_hints: dict[str, Any] = field(default_factory=dict)
    modify_mixlist: str | None = None  # ATC --modify_mixlist JSON file: read into atc_hints["modify_mixlist"]
    customize_dtypes: str | None = None  # ATC --customize_dtypes cfg file: read into atc_hints["customize_dtypes"]
    validate: bool = True
    overwrite: bool = False
    tolerance: Tolerance = field(default_factory=Tolerance)
    model_class: str | None = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    trust_pickle: bool = False
    task: str | None = None  # a Hugging Face directory's task (Optimum's names); None: detected from config.json
    trust_remote_code: bool = False  # a directory whose config.json has an auto_map (its own Python) may load
    # a decoder's cache for a multi-graph export: None / "dynamic" (growing) or "static:N" (N fixed slots)
    kv_cache: str | None = None
    # the new tokens a multi-graph export's decode graph takes on the cache (decode / decoder_with_past): 1, or N
    # for chunked prefill and speculative decoding's drafts (hf/graph_plans.py)
    decode_tokens: int = 1
    parity_full_ranges: bool = False  # parity at the dynamic range ends, past the element budget (any graph)
    parity_coverage: str = "axes"  # "full": also every gear (range-end) combination ATC builds (bundle/coverage.py)
    sandbox: str = "auto"  # a model file loads confined: "auto" (when the machine can), "require", "off"
    input_shapes: list[InputSpec] = field(default_factory=list)
    # dynamic axes (cann_export.dynamic): "--dynamic" strings, DynamicAxis objects or {input: {axis: "dim:1..16"}}
    dynamic: list[Any] = field(default_factory=list)
    static_shapes: bool = False  # no dynamic axes at all (a .pt2's Dims, a loader's task axes): the example's shapes
    example_inputs_file: str | None = None
    external_data: str = "auto"
    # bytes of weights past which (in "auto") the graph lives on disk from capture on and ships its weights in
    # a .data file: never a proto holding them, onnxruntime maps them for parity (see large_model.py)
    external_data_threshold: int = 1_000_000_000
    exporter: str = "auto"
    simplify: bool = True
    num_random_inputs: int = 4
    parity_data: str | None = None  # safetensors / .npz of many input samples: parity runs every one
    # the bundle's parity data for validate: "auto" sizes it to the graph (2..64 MiB, the example always kept), an
    # int caps the shapes past the example's (whose sets are all kept), None keeps every set
    stored_parity_mib: int | str | None = "auto"
    accept_trace_specialization: bool = False  # accept a traced graph valid only on the example's path
    seed: int = 0
    include_optimizer_state: bool = False
    optimizer: Any = None
    # quantization (issue: QAT to int8): "qat" fine-tunes with fake quantization, "ptq" calibrates only
    quantize: str | None = None
    calibration_data: str | None = None  # safetensors / .npz file of input batches named after forward's inputs
    qat_steps: int = 200
    qat_lr: float = 1e-4
    quant_config: dict[str, Any] = field(default_factory=dict)
    backend: str = "auto"
    train_callback: Any = None  # called as (step, total, loss) during QAT fine-tuning
    # model zoo: publish the artifact under this name after a successful export
    publish: str | None = None
    zoo: str | None = None  # registry URL or directory (default: CANN_MODEL_ZOO or the user cache)
    require_atc: bool = False  # --format om: a missing `atc` is an error instead of an om-stub

    def accepts_opset(self, opset: int, fmt: Any) -> bool:
        """Whether a captured graph's opset is acceptable: the one asked for, or (unless strict) any
        opset the format accepts; torch 2.13's dynamo exporter writes 18 when its down-conversion fails."""
        if opset == self.opset:
            return True
        allowed = fmt.atc_opsets if fmt.atc_opsets is not None else ONNX_OPSETS
        return not self.strict_opset and opset in allowed

    def check(self, formats: dict[str, Any], exporters: list[str] | None = None) -> None:
        """Refuse bad option values with the list of valid ones. ``formats``: the registered formats, whose
        declarations (``atc_opsets``) decide what they accept; ``exporters``: the registered exporter names."""
        fmt = formats.get(self.export_format)
        if fmt is None:
            raise OptionsError(f"unknown format {self.export_format!r}; choose one of {', '.join(sorted(formats))}")
        atc = fmt.atc_opsets
        if atc is not None and self.opset not in atc:
            raise OptionsError(
                f"opset {self.opset} is outside {atc.start}..{atc.stop - 1}, the range ATC accepts for "
                f"{self.export_format}; pass --opset between {atc.start} and {atc.stop - 1} (17 is the default)"
            )
        if self.opset not in ONNX_OPSETS:
            raise OptionsError(f"opset {self.opset} is not supported; use {ONNX_OPSETS.start}..{ONNX_OPSETS.stop - 1}")
        if self.precision_mode not in PRECISION_MODES:
            raise OptionsError(f"unknown precision mode {self.precision_mode!r} (ATC would refuse it with E10001); "
                               f"ATC accepts {', '.join(PRECISION_MODES)}")
        if self.external_data not in EXTERNAL_DATA:
            raise OptionsError(f"external_data must be one of {', '.join(EXTERNAL_DATA)}")
        if self.quantize not in (None, "qat", "ptq"):
            raise OptionsError("quantize must be 'qat' or 'ptq'")
        if self.quantize and not self.calibration_data:
            raise OptionsError(f"--{self.quantize} needs --calibration-data FILE (a .safetensors or .npz of input "
                               "batches named after the model's forward parameters)")
        if self.qat_steps < 0 or self.qat_lr <= 0:
            raise OptionsError("--qat-steps must be >= 0 and --qat-lr > 0")
        if self.parity_coverage not in PARITY_COVERAGE:
            raise OptionsError(f"--parity (parity_coverage) must be axes or full, not {self.parity_coverage!r}")
        if self.sandbox not in SANDBOX_MODES:
            raise OptionsError(f"sandbox must be one of {', '.join(SANDBOX_MODES)}")
        from .hf.graph_plans import check_decode_tokens  # the cache's form, and the decode graph's new tokens

        check_decode_tokens(self.decode_tokens, self.kv_cache)
        mib = self.stored_parity_mib
        if mib is not None and mib != "auto" and (type(mib) is not int or mib < 0):
            raise OptionsError(f"stored_parity_mib must be 'auto', whole MiB >= 0 or None (every set), not {mib!r}")
        if self.lint not in LINT_MODES:
            raise OptionsError(f"--lint must be one of {', '.join(LINT_MODES)}")
        if not _is_version(self.cann_version):
            raise OptionsError(f"--cann-version {self.cann_version!r} is not a version like 8.0 or 7.0.RC1")
        if exporters is not None and self.exporter != "auto" and self.exporter not in exporters:
            raise OptionsError(f"unknown exporter {self.exporter!r}; choose auto or one of {', '.join(exporters)}")
        if self.include_optimizer_state and self.optimizer is None:
            raise OptionsError("include_optimizer_state=True needs optimizer=<the torch.optim optimizer>")
        if self.input_shapes and self.example_inputs_file:
            raise OptionsError("pass either --input-shape or --example-inputs, not both")
        check_soc_version(self.soc_version)
        check_known_soc(self.soc_version, self.allow_unknown_soc)
        from .dynamic import as_axes, check_unique

        self.dynamic = as_axes(self.dynamic)
        check_unique(self.dynamic)
        if self.static_shapes and (self.dynamic or any(-1 in spec.shape for spec in self.input_shapes
                                                       if isinstance(spec, InputSpec))):
            raise OptionsError("--static-shapes with --dynamic or -1 in --input-shape: pass one or the other")
        check_input_names(self.input_shapes)
        check_metadata(self.metadata)
        self.tolerance.check()
        self.check_input_files()

    def check_input_files(self) -> None:
        """--example-inputs, --parity-data and --calibration-data name regular files (no device, FIFO,
        socket or directory), refused by stat alone before the model is loaded."""
        from .load.tensor_files import check_input_file

        for flag, path in (("--example-inputs", self.example_inputs_file), ("--parity-data", self.parity_data),
                           ("--calibration-data", self.calibration_data)):
            if path:
                check_input_file(path, flag)


def _tolerance_flag(name: str) -> str:
    """The CLI flag of a Tolerance field (atol, rtol, min_cosine), else its API name (tolerance.device_atol)."""
    api_only = name.startswith(("device_", "probe_", "peak_", "noise_", "int8_"))
    return f"--{name.replace('_', '-')}" if not api_only else f"tolerance.{name}"


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_input_names(specs: list[InputSpec]) -> None:
    """Each --input-shape names a different input (a second one would silently replace the first) and is bounded."""
    seen: set[str] = set()
    for spec in specs:
        name = spec.name if isinstance(spec, InputSpec) else str(spec)
        if isinstance(spec, InputSpec):  # each dim within --dynamic's bound, before torch allocates the example
            check_static_shape(spec, f"--input-shape {f'{name}:' + ','.join(map(str, spec.shape))[:200]!r}")
        if name in seen:
            raise OptionsError(f"--input-shape names input {name!r} twice; pass one --input-shape per input")
        seen.add(name)


def check_metadata(metadata: dict[str, Any]) -> None:
    """--metadata keys under ``cann_export.`` are the tool's provenance: a user value would overwrite it."""
    for key, value in metadata.items():
        check_printable(key, value, "--metadata")
    reserved = sorted(k for k in metadata if str(k).startswith(RESERVED_METADATA_PREFIX))
    if reserved:
        raise OptionsError(f"--metadata key {reserved[0]!r} is reserved: keys starting with "
                           f"{RESERVED_METADATA_PREFIX!r} hold cann-export's own provenance; rename it "
                           f"(e.g. {reserved[0][len(RESERVED_METADATA_PREFIX):] or 'my_key'!r})")


def _is_version(text: str) -> bool:
    head = str(text).split(".")
    return len(head) >= 2 and head[0].isdigit() and head[1][:1].isdigit()


def parse_key_values(pairs: list[str] | tuple[str, ...], flag: str) -> dict[str, str]:
    """Parse repeated ``KEY=VALUE`` options."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise OptionsError(f"{flag} {pair!r} does not parse; write it as {flag} KEY=VALUE")
        check_printable(key.strip(), value, flag)
        out[key.strip()] = value
    return out


def parse_model_kwargs(raw: str | None) -> dict[str, Any]:
    """``--model-kwargs``: a JSON object of keyword arguments for ``--model-class``."""
    import json

    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise OptionsError(f"--model-kwargs is not valid JSON ({str(e)[:200]}); pass an object like "
                           "'{\"hidden\": 64}'") from e
    except RecursionError as e:
        raise OptionsError(f"--model-kwargs nests too deeply ({len(raw)} characters); pass a flat JSON object of "
                           "keyword arguments like '{\"hidden\": 64}'") from e
    if not isinstance(value, dict):
        raise OptionsError(f"--model-kwargs must be a JSON object, not {type(value).__name__}")
    return value
