"""Prepare's part of ``--qat`` / ``--ptq``: the calibration tensors read within bounds and checked, then fake
quantization inserted and calibrated on them. Prepare takes the float reference between the two (inputs/stage.py):
nothing here runs the reference forward (the train stage, qat/stage.py, comes after)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import errors
from ..context import ExportContext
from ..context import QuantizationReport

if TYPE_CHECKING:
    from .quant_config import QuantConfig

TRAINABLE_HINT = ("pass a state_dict / checkpoint / .safetensors with --model-class, or an nn.Module in Python; "
                  "TorchScript archives and torch.export programs cannot be trained")


def read_calibration(path: str | Path, accepted: list[str]) -> dict[str, Any]:
    """Calibration tensors: named after forward's inputs, all with the same number of samples (dim 0)."""
    from ..load.tensor_files import read_example_inputs

    try:
        tensors = read_example_inputs(path, "--calibration-data")
    except errors.LoadError as e:
        raise errors.PrepareError(f"calibration data: {e.message}", path=path) from e
    unknown = [n for n in tensors if accepted and n not in accepted]
    if unknown:
        raise errors.PrepareError(f"calibration data has input(s) {', '.join(unknown)} that forward does not take "
                                  f"({', '.join(accepted)}); name the tensors after the forward parameters", path=path)
    counts = {n: int(t.shape[0]) if t.dim() else 0 for n, t in tensors.items()}
    if len(set(counts.values())) != 1 or 0 in counts.values():
        raise errors.PrepareError(f"calibration tensors must share a non-empty first (sample) dimension, got "
                                  f"{counts}", path=path)
    return tensors


def calibration_tensors(ctx: ExportContext, accepted: list[str]) -> tuple[QuantConfig, dict[str, Any]]:
    """The quantization config and the --calibration-data tensors, checked against the model and the example
    inputs (prepare then takes the float reference, and hands both to ``calibrated_model``)."""
    from .. import qat

    opts = ctx.options
    if ctx.loaded.kind != "module":
        raise errors.PrepareError(f"--{opts.quantize} needs a trainable nn.Module; {TRAINABLE_HINT}",
                                  path=ctx.loaded.source_path)
    config = qat.parse(opts.quant_config)
    tensors = read_calibration(opts.calibration_data, accepted)
    example = ctx.example_inputs
    for name, t in tensors.items():
        if name in example and tuple(t.shape[1:]) != tuple(example[name].shape[1:]):
            raise errors.PrepareError(
                f"calibration input {name} has per-sample shape {list(t.shape[1:])}, the example input "
                f"{list(example[name].shape[1:])}", path=opts.calibration_data)
    missing = [n for n in ctx.input_names if n not in tensors]
    if missing:
        raise errors.PrepareError(f"calibration data lacks input(s) {', '.join(missing)}", path=opts.calibration_data)
    return config, tensors


def calibrated_model(ctx: ExportContext, config: QuantConfig, tensors: dict[str, Any]) -> str:
    """Fake quantization inserted into the float model (kept as the teacher) and calibrated on ``tensors``."""
    from .. import qat
    from ..fs.digests import sha256_file
    from .train import split_batches

    opts = ctx.options
    ctx.teacher = ctx.model
    ctx.model = qat.prepare(ctx.teacher, config=config, keep_float_copy=False)
    ctx.calibration_batches = split_batches({n: tensors[n] for n in ctx.input_names}, config.batch_size)
    qat.calibrate(ctx.model, ctx.calibration_batches)
    report = ctx.reports.quantization = QuantizationReport(
        mode=opts.quantize, config=config.to_dict(),
        calibration_data={"path": str(opts.calibration_data), "sha256": sha256_file(Path(opts.calibration_data)),
                          "samples": int(next(iter(tensors.values())).shape[0])},
        quantized_layers=len(qat.qat_state(ctx.model)["quantized"]),
    )
    return f"{len(ctx.calibration_batches)} calibration batches, {report.quantized_layers} layers"


