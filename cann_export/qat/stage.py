"""The train stage of ``--qat`` / ``--ptq``: the fake-quant model fine-tuned against the float one (--qat), then
its references (prepare's part, the model calibrated, is qat/calibration.py)."""
from __future__ import annotations

from ..context import ExportContext


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
