"""The quantization parts of the prepare and train stages (``--qat`` / ``--ptq``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import errors
from ..context import ExportContext
from ..context import QuantizationReport

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


def prepare_quantization(ctx: ExportContext, source: str, accepted: list[str]) -> str:
    """Float references, then fake quantization inserted and calibrated on --calibration-data."""
    from .. import qat
    from ..fs.digests import sha256_file
    from ..inputs.reference import reference_outputs
    from .train import split_batches

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
    ctx.output_names, ctx.float_reference_outputs = reference_outputs(ctx, ctx.model, source, accepted)
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


def train(ctx: ExportContext) -> str | None:
    """QAT: distillation fine-tuning of the fake-quant model against the float one; then the references."""
    from .. import qat
    from ..backend.device_choice import pipeline_device, to_device
    from ..inputs.reference import reference_outputs
    from .train import ensure_distributed

    opts = ctx.options
    report = ctx.reports.quantization_report()
    status = "calibrated only (--ptq)"
    if opts.quantize == "qat":
        device = pipeline_device(opts.backend)
        report.device = device
        student, teacher = to_device(ctx.model, device), to_device(ctx.teacher, device)
        def on_step(step: int, total: int, loss: float) -> None:
            from ..progress import advance

            advance("qat steps", step, total)
            if opts.train_callback is not None:
                opts.train_callback(step, total, loss)

        history = qat.finetune(student, teacher, to_device(ctx.calibration_batches, device), opts.qat_steps,
                               opts.qat_lr, qat.parse(opts.quant_config).loss, on_step=on_step)
        ctx.model, ctx.teacher = to_device(student, "cpu"), to_device(teacher, "cpu")  # capture runs on the CPU
        report.qat = {"steps": opts.qat_steps, "lr": opts.qat_lr,
                         "loss_first": history[0] if history else None, "loss_last": history[-1] if history else None}
        status = f"{opts.qat_steps} steps on {device}" + (
            f", loss {history[0]:.4g} -> {history[-1]:.4g}" if history else "")
    ctx.model.eval()
    ctx.output_names, ctx.reference_outputs = reference_outputs(ctx, ctx.model, "the fake-quant model", ctx.input_names)
    if opts.validate:
        from ..inputs.quant_noise import int8_noise

        ctx.int8_noise = int8_noise(ctx, ctx.model)
    rank, world = ensure_distributed()
    if rank != 0:
        ctx.halted = f"rank {rank} of {world}: rank 0 writes the artifact"
    return status
