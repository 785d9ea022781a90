"""The Python API: export(), validate() and inspect(). The CLI and ``cann.torch`` call these."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import atc_hints, atomic, errors, quant_stages, stages
from . import plugin_manager as plugins
from .options import ExportOptions, Tolerance
from .pipeline import STAGES, ExportContext, ProgressFn, run_stages

_OPTION_FIELDS = {f.name for f in dataclasses.fields(ExportOptions)} - {"export_format", "tolerance"}


@dataclass
class ExportResult:
    """What an export produced: files, manifest, parity report and the ONNX facts."""

    ok: bool
    format: str
    output: str
    files: list[str]
    onnx: dict[str, Any]
    parity: dict[str, Any] | None
    manifest: dict[str, Any] = field(repr=False, default_factory=dict)
    published: dict[str, Any] | None = None  # the model zoo record when --publish was given

    def to_dict(self) -> dict[str, Any]:
        parity = self.parity or {"passed": None, "validated": False, "outputs": []}
        out = {"ok": self.ok, "format": self.format, "output": self.output, "files": self.files,
               "onnx": self.onnx, "parity": parity}
        if self.published is not None:
            out["published"] = self.published
        return out


def _options(export_format: str, kwargs: dict[str, Any]) -> ExportOptions:
    tol = kwargs.pop("tolerance", None) or Tolerance()
    if isinstance(tol, dict):
        tol = Tolerance(**tol)
    for key in ("atol", "rtol", "min_cosine"):
        if kwargs.get(key) is not None:
            tol = dataclasses.replace(tol, **{key: float(kwargs.pop(key))})
        kwargs.pop(key, None)
    unknown = sorted(set(kwargs) - _OPTION_FIELDS)
    if unknown:
        raise errors.OptionsError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(_OPTION_FIELDS))}")
    if "input_shapes" in kwargs:
        from .inputs import InputSpec, parse_input_shape

        kwargs["input_shapes"] = [s if isinstance(s, InputSpec) else parse_input_shape(s) for s in kwargs["input_shapes"]]
    return ExportOptions(export_format=export_format, tolerance=tol, **kwargs)


def export(model: Any, output_path: str | Path, export_format: str = "atc_ready", example_inputs: Any = None,
           *, progress: ProgressFn | None = None, trace: str | Path | None = None, **options: Any) -> ExportResult:
    """Export ``model`` (an nn.Module, ExportedProgram, ScriptModule or a model file path) to
    ``output_path`` in ``export_format``; see ExportOptions for the keyword options.

    Raises an ``ExportError`` subclass on bad input or a failed stage (nothing is left at
    ``output_path``). A parity failure is not raised: the artifact is written with the failure
    recorded and ``result.ok`` is False.
    ``trace``: a path for the stage timeline (Chrome trace JSON).
    """
    if trace is not None:
        from .stage_trace import StageTimeline

        progress = StageTimeline(trace).wrap(progress)
    opts = _options(export_format, dict(options))
    formats = plugins.collect("register_formats")
    opts.check(list(formats))
    hint_warnings = atc_hints.resolve(opts)
    output = Path(output_path)
    atomic.check_target(output, opts.overwrite)
    if opts.export_format == "onnx" and output.suffix != ".onnx":
        atomic.check_target(output.with_name(output.name + ".onnx"), opts.overwrite)
    ctx = ExportContext(options=opts, source=model, output_path=output)
    ctx.format = formats[opts.export_format]
    ctx.reports["warnings"] = {"atc_hints": hint_warnings} if hint_warnings else {}

    def write(c: ExportContext) -> str:
        c.staging = atomic.staging_dir(output)
        c.files = c.format.write(c, c.staging)
        return f"{len(c.files)} files staged"

    handlers = {
        "load": stages.load,
        "prepare": lambda c: stages.prepare(c, example_inputs),
        "train": quant_stages.train if opts.quantize else None,
        "strip": stages.strip,
        "capture": stages.capture,
        "optimize": stages.optimize,
        "annotate": stages.annotate,
        "lint": lambda c: stages.run_validators(c, "lint"),
        "write": write,
        "validate": (lambda c: stages.run_validators(c, "validate")) if opts.validate else None,
    }
    try:
        run_stages(ctx, handlers, progress, only=STAGES[:-1])
        if ctx.halted:  # e.g. a DDP rank other than 0: it trained, rank 0 writes
            atomic.discard(ctx.staging)
            return ExportResult(ok=True, format=opts.export_format, output="", files=[], onnx={}, parity=None,
                                manifest={"halted": ctx.halted})
        ctx.format.finalize(ctx, ctx.staging)
        files = ctx.format.commit(ctx, ctx.staging)
    except BaseException:
        atomic.discard(ctx.staging)
        raise
    # publish runs on the committed artifact; a failure here leaves the (valid) artifact in place
    run_stages(ctx, {"publish": stages.publish} if opts.publish else {}, progress, only=("publish",))
    parity = ctx.reports.get("parity")
    final_onnx = (ctx.output_path / ctx.onnx_path.name) if ctx.format.is_directory else ctx.output_path
    from .manifest import summarize_parity

    return ExportResult(
        ok=bool(parity["passed"]) if parity else True,
        format=opts.export_format,
        output=str(ctx.output_path),
        files=[str(f) for f in files],
        onnx={"path": str(final_onnx), "opset": ctx.capture["opset"], "exporter": ctx.capture["exporter"]},
        parity=summarize_parity(parity) if parity else None,
        manifest=getattr(ctx, "manifest", {}),
        published=ctx.reports.get("publish"),
    )


def validate(bundle: str | Path, tolerance: Tolerance | None = None) -> dict[str, Any]:
    """Re-run parity on an atc_ready bundle (or an om-stub) from its stored inputs and reference outputs,
    after checking every file against the manifest's sha256."""
    from .bundle import open_artifact, read_bundle, verify_files
    from .validators.parity import parity_report

    with open_artifact(Path(bundle)) as directory:
        manifest = read_bundle(directory)
        verify_files(directory, manifest)
        feeds, expected, tol_dict = _parity_data(directory, manifest)
        tol = tolerance or Tolerance(**tol_dict)
        model_path = directory / manifest["model"]["file"]
        report = parity_report(model_path, feeds, expected, tol,
                               reference=manifest["parity"].get("reference") or "stored reference outputs")
        precision = manifest.get("parity", {}).get("precision")
        if precision and report.get("outputs"):  # re-run the device-precision emulation the export ran
            import onnx

            from . import module_paths
            from .validators.parity import with_device_parity

            model = onnx.load(str(model_path))
            report = with_device_parity(report, model, precision["mode"], list(precision.get("keep_dtype", [])),
                                        feeds, expected, tol, module_paths.collect(model))
    report["bundle"] = str(bundle)
    return report


def _parity_data(bundle: Path, manifest: dict[str, Any]) -> tuple[list, list, dict]:
    from safetensors import safe_open
    from safetensors.numpy import load_file

    inputs_file, expected_file = bundle / "parity" / "inputs.safetensors", bundle / "parity" / "expected.safetensors"
    if not inputs_file.is_file() or not expected_file.is_file():
        raise errors.ValidateError("the bundle holds no parity data (it was exported with --no-validate); "
                                   "export again with validation to get re-runnable parity", path=bundle)
    with safe_open(str(inputs_file), "np") as f:
        meta = f.metadata()
    names_in, names_out, sets = meta["inputs"].split(","), meta["outputs"].split(","), int(meta["sets"])
    ins, outs = load_file(str(inputs_file)), load_file(str(expected_file))
    feeds = [{n: ins[f"{s}/{n}"] for n in names_in} for s in range(sets)]
    expected = [[outs[f"{s}/{n}"] for n in names_out] for s in range(sets)]
    tol = (manifest.get("parity") or {}).get("tolerance") or Tolerance().to_dict()
    tol = {k: v for k, v in tol.items() if k in Tolerance.__dataclass_fields__}
    return feeds, expected, tol


def inspect(path: str | Path) -> dict[str, Any]:
    """What a bundle or an .onnx file holds: inputs/outputs, opset, op histogram, metadata, parity."""
    from .bundle import describe

    return describe(Path(path))


def to_json(data: Any) -> str:
    return json.dumps(data, default=str)
