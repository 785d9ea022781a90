"""The prepare stage: eval mode, example inputs and their variants, the fp32 reference."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import errors
from ..inputs import tensors as inputs_mod
from ..context import ExportContext
from ..inputs.reference import reference_outputs


def prepare(ctx: ExportContext, example_inputs: Any = None) -> str | None:
    """Eval mode, example inputs and their seeded variants, and the fp32 reference outputs."""
    from ..backend.eval_mode import to_eval
    from ..inputs.shape_inference import infer_example_input, no_inputs_message
    from ..inputs.tracking import recorded_inputs

    loaded, opts = ctx.loaded, ctx.options
    to_eval(ctx.model, loaded.kind)
    accepted = loaded.extras.get("input_names") or inputs_mod.forward_input_names(ctx.model)
    if example_inputs is not None:
        feed, source = _as_named(example_inputs, accepted), "example_inputs"
    elif opts.example_inputs_file:
        feed, source = inputs_mod.read_example_inputs(opts.example_inputs_file), str(opts.example_inputs_file)
    elif opts.input_shapes:
        feed, source = inputs_mod.tensors_from_specs(opts.input_shapes, ctx.model, opts.seed), "--input-shape"
    elif loaded.example_inputs:
        feed, source = dict(loaded.example_inputs), "the archive's example inputs"
    elif opts.calibration_data:
        from ..qat.stage import read_calibration

        feed = {k: v[:1] for k, v in read_calibration(opts.calibration_data, accepted).items()}
        source = f"the first sample of {opts.calibration_data}"
    elif not isinstance(ctx.source, (str, Path)) and (rec := recorded_inputs(ctx.source)) is not None:
        args, kwargs = rec
        feed, source = {**_as_named(tuple(args), accepted), **kwargs}, "the last recorded forward call"
    elif isinstance(ctx.source, (str, Path)) and (inferred := infer_example_input(ctx.model, accepted,
                                                                                   opts.seed)) is not None:
        feed, source = inferred
        ctx.reports.warnings.inputs = source
    else:
        raise errors.PrepareError(no_inputs_message(accepted), path=loaded.source_path)
    from ..backend.placement import cpu_copy

    feed = cpu_copy(feed)  # inputs recorded on npu / cuda: capture and the reference start from the CPU
    inputs_mod.check_input_names(list(feed), accepted, source)
    if loaded.kind != "module":  # positional graphs need every input, in order
        missing = [n for n in accepted if n not in feed]
        if missing:
            raise errors.PrepareError(f"the model needs inputs {', '.join(missing)} that {source} does not give",
                                      path=loaded.source_path)
        feed = {n: feed[n] for n in accepted}
    else:
        feed = {n: feed[n] for n in accepted if n in feed} or feed
    ctx.input_names = list(feed)
    ctx.example_inputs = feed
    vocab = {n: inputs_mod.embedding_vocab(ctx.model, n) for n in feed if "ids" in n.lower()}
    # a Q/DQ graph is judged within one quantization step of the fake-quant model: inputs far outside the
    # calibration range sit on clamp boundaries where rounding ties differ by a step, so it keeps the normal
    quantized = bool(opts.quantize or getattr(ctx.model, "_cann_qat", None))
    kinds = ("normal",) if quantized else inputs_mod.FLOAT_DISTRIBUTIONS
    variants = (inputs_mod.random_variants(feed, opts.num_random_inputs, opts.seed + 1, vocab, kinds)
                if opts.validate else [])
    samples = []
    if opts.validate and opts.parity_data:
        from ..inputs.parity_data import read_parity_data

        samples = read_parity_data(opts.parity_data, feed)
    ctx.input_sets = [feed] + variants + samples
    ctx.reports.reference.input_sets = {"example": 1, "random": len(variants), "parity_data": len(samples)}
    if opts.quantize:  # the reference is the fake-quant model after calibration / fine-tuning (train stage)
        from ..qat.stage import prepare_quantization

        return prepare_quantization(ctx, source, accepted)
    ctx.output_names, ctx.reference_outputs = reference_outputs(ctx, ctx.model, source, accepted)
    float_model = (getattr(ctx.model, "_cann_qat", None) or {}).get("float_model")
    if float_model is not None:  # a model prepared for QAT in Python: int8 vs float is reported too
        _, ctx.float_reference_outputs = reference_outputs(ctx, float_model, source, accepted)
    return f"{len(ctx.input_sets)} input sets from {source}"


def _as_named(value: Any, accepted: list[str]) -> dict[str, Any]:
    import torch

    if isinstance(value, (str, Path)):
        return inputs_mod.read_example_inputs(value)
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, torch.Tensor):
        value = (value,)
    if isinstance(value, (tuple, list)):
        if len(value) > len(accepted):
            raise errors.PrepareError(f"{len(value)} example inputs given, but forward takes {len(accepted)} "
                                      f"({', '.join(accepted)})")
        return dict(zip(accepted, value))
    raise errors.PrepareError(f"example_inputs must be a tensor, a tuple of tensors or a dict name -> tensor, "
                              f"not {type(value).__name__}")
