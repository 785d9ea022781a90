"""The prepare stage: example inputs (from the first input provider that answers) and their variants, the fp32
reference, on the model load put in inference mode."""
from __future__ import annotations

from typing import Any

from .. import errors
from ..context import ExportContext
from ..hooks import manager
from . import eos_rows, tensors
from .path_probes import PATH_SCALES, path_variants
from .providers import accepted_names
from .reference import reference_outputs


def prepare(ctx: ExportContext) -> str | None:
    """Example inputs and their seeded variants, and the fp32 reference outputs."""
    accepted = accepted_names(ctx)
    feed, source = example_inputs(ctx, accepted)
    frozen = _frozen_arguments(ctx, feed)
    ctx.input_names = list(feed)
    ctx.example_inputs = feed
    from .dynamic_axes import resolve

    ctx.dynamic_axes = resolve(ctx)
    variants, labels = _variants(ctx, feed)
    ctx.input_sets = [feed, *variants]
    ctx.input_set_labels = [tensors.set_label("example", "example", 0), *labels]
    eos_rows.place(ctx, eos_rows.drawn(ctx.input_sets, ctx.input_set_labels, source.endswith(eos_rows.DUMMY)))
    if not ctx.options.quantize:
        _float_reference(ctx, source, accepted)
        if not ctx.options.validate and ctx.decisions.trace_first and not _gate_sets_now(ctx):
            ctx.gate_sets_pending = {"source": source, "accepted": accepted}
        return f"{len(ctx.input_sets)} input sets from {source}" + (f"; frozen in the graph: {frozen}" * bool(frozen))
    # --qat / --ptq: the float model's outputs on the sets, then the model calibrated (the train stage fine-tunes
    # it): the reference is the fake-quant model after train
    from ..qat.calibration import calibrated_model, calibration_tensors

    config, calibration = calibration_tensors(ctx, accepted)
    ctx.output_names, ctx.float_reference_outputs = reference_outputs(ctx, ctx.model, source, accepted)
    return calibrated_model(ctx, config, calibration)


def _float_reference(ctx: ExportContext, source: str, accepted: list[str]) -> None:
    """The model's outputs on every set, the sets at other shapes with theirs, the reference's own float noise;
    for a model prepared for QAT in Python (or with torch.ao fake quantization) its float twin's outputs and the
    fake-quant rounding noise too."""
    ctx.output_names, ctx.reference_outputs = reference_outputs(ctx, ctx.model, source, accepted)
    if ctx.dynamic_axes:  # parity at every gear, or the range's ends and middle; every set names its shape
        from .dynamic_axes import add_shape_sets

        add_shape_sets(ctx, source, accepted, for_gate=_gate_sets_now(ctx))
    elif ctx.decisions.shape_sets:  # a multi-graph component's sizes, consistent across its graphs
        from .given_shapes import add_given_shape_sets

        add_given_shape_sets(ctx, source, accepted)
    if ctx.options.validate:  # the reference's own float noise on the verdict sets (the fp32 parity floor)
        from .float_noise import defer, measure

        if not defer(ctx):
            measure(ctx)
    from ..qat.wrapping import float_twin, prepared_state

    state = prepared_state(ctx.model)
    float_model = (state or {}).get("float_model") or (float_twin(ctx.model) if state else None)
    if float_model is not None:  # a model prepared for QAT in Python: int8 vs float is reported too
        _, ctx.float_reference_outputs = reference_outputs(ctx, float_model, source, accepted)
    if ctx.options.validate and (state or ctx.decisions.fake_quantized):
        from .quant_noise import int8_noise

        ctx.int8_noise = int8_noise(ctx, ctx.model)


def _gate_sets_now(ctx: ExportContext) -> bool:
    """Whether prepare builds the trace gate's sets under --no-validate: for a multi-graph component with a trace
    first (its later graphs' inputs come from these sets' references); a single graph's wait until a trace warns
    at more than input checks (``add_gate_sets``)."""
    return bool(ctx.decisions.trace_first and ctx.decisions.shape_sets)


def add_gate_sets(ctx: ExportContext) -> None:
    """Under --no-validate, the sets the trace gate checks, built when capture's trace warned (the variants, the path
    probes, one set at each dynamic axis' range ends and middle, with the traced module's outputs on them): a trace
    that warns nowhere, or only at input checks (capture/trace_guards.py), needs none (ViT-small on transformers 4.57:
    8.1 -> 5.7 CPU-s). The references are the traced module's (after strip), as the path probes' are; a size the
    model fails at is left out with a warning (the graph holds the axis already)."""
    from ..backend.eval_mode import to_eval
    from .dynamic_axes import add_shape_sets

    pending, ctx.gate_sets_pending = ctx.gate_sets_pending, None
    if pending is None:
        return
    to_eval(ctx.model, ctx.loaded.kind)  # an exporter may have left a training flag set
    variants, labels = _variants(ctx, ctx.example_inputs, gate=True)
    eos_rows.place(ctx, variants)
    _, outputs = reference_outputs(ctx, ctx.model, pending["source"], pending["accepted"], input_sets=variants)
    ctx.input_sets += variants
    ctx.input_set_labels += labels
    ctx.reference_outputs += outputs
    if ctx.dynamic_axes:
        add_shape_sets(ctx, pending["source"], pending["accepted"], for_gate=True, after_capture=True)


def gate_references(ctx: ExportContext) -> None:
    """What the trace gate judges a trace that warned on, handed to capture by the stage table (capture runs no
    forward itself): the sets prepare left for it under --no-validate (``add_gate_sets``), then the path variants'
    reference (inputs/path_probes.py)."""
    from .path_probes import add_path_references

    add_gate_sets(ctx)
    add_path_references(ctx)


def _frozen_arguments(ctx: ExportContext, feed: dict[str, Any]) -> str:
    """The forward arguments the inputs leave out that change the outputs (inputs/frozen_arguments.py), named in the
    manifest's warnings. Not for a Hugging Face task model (its config declares its inputs), a model whose forward
    moves quantization observers, nor a multi-graph component (its inputs are its graph's)."""
    import torch

    from .frozen_arguments import candidates, changed_outputs, frozen_message

    extras = ctx.loaded.extras
    if ctx.loaded.kind != "module" or not isinstance(ctx.model, torch.nn.Module) or "hf" in extras \
            or extras.get("positional") or extras.get("shape_sets") or ctx.options.quantize \
            or ctx.decisions.fake_quantized:
        return ""
    found = sorted(changed_outputs(ctx.model, feed, candidates(ctx.model, feed), ctx.options.seed))
    if found:
        ctx.reports.warnings.frozen = frozen_message(found)
    return ", ".join(found)


def example_inputs(ctx: ExportContext, accepted: list[str]) -> tuple[dict[str, Any], str]:
    """The first answer of the input providers (in priority order), on the CPU, checked against the model's
    inputs and ordered as it takes them; a PrepareError naming the flags to pass when none answers."""
    from ..backend.device_choice import cpu_copy
    from .shape_inference import no_inputs_message

    answer = next((a for p in manager.registry().input_providers() if (a := p.provide(ctx)) is not None), None)
    if answer is None:
        raise errors.PrepareError(no_inputs_message(accepted), path=ctx.loaded.source_path)
    feed, source = answer
    feed = cpu_copy(feed)  # inputs recorded on npu / cuda: capture and the reference start from the CPU
    tensors.check_input_names(list(feed), accepted, source)
    if ctx.loaded.kind != "module":  # positional graphs need every input, in order
        missing = [n for n in accepted if n not in feed]
        if missing:
            raise errors.PrepareError(f"the model needs inputs {', '.join(missing)} that {source} does not give",
                                      path=ctx.loaded.source_path)
        return {n: feed[n] for n in accepted}, source
    return {n: feed[n] for n in accepted if n in feed} or feed, source


def _variants(ctx: ExportContext, feed: dict[str, Any], gate: bool = False
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The seeded random variants, the --parity-data samples and (a trace checked first) the path variants with
    their labels (what each set is), and their counts in the reference report. ``gate``: the trace gate's, under
    --no-validate (``add_gate_sets``)."""
    from .signature import feed_embedding_rows

    opts = ctx.options
    # a Q/DQ graph is judged within one quantization step of the fake-quant model: inputs far outside the
    # calibration range sit on clamp boundaries where rounding ties differ by a step, so it keeps the normal
    quantized = ctx.decisions.quantized
    kinds = ("normal",) if quantized else tensors.FLOAT_DISTRIBUTIONS
    variants, samples, paths, count = [], [], [], opts.num_random_inputs
    if opts.validate or gate or _gate_sets_now(ctx):  # without validation: the sets the trace gate checks
        paths = _path_sets(ctx, feed) if gate and ctx.trace_probes and not quantized else []
        if paths or _probed(ctx, feed):  # the path variants are the probes: the draws keep the realistic ones
            count = sum(1 for k in range(count) if kinds[k % len(kinds)] in tensors.REALISTIC_DISTRIBUTIONS)
            kinds = tensors.REALISTIC_DISTRIBUTIONS
        vocab = feed_embedding_rows(ctx.model, feed)
        variants = tensors.random_variants(feed, count, opts.seed + 1, vocab, kinds)
        if opts.parity_data and opts.validate:
            from .parity_data import read_parity_data

            samples = read_parity_data(opts.parity_data, feed)
    ctx.reports.reference.input_sets = {"example": 1, "random": len(variants), "parity_data": len(samples),
                                        **({"trace_path": len(paths)} if paths else {})}
    labels = tensors.variant_labels(feed, len(variants), 1, kinds)
    labels += [tensors.set_label("parity_data", f"sample {k}", 1 + len(variants) + k) for k in range(len(samples))]
    first = 1 + len(variants) + len(samples)
    labels += [tensors.set_label("trace_path", f"example x {scale:g}", first + k, probe=True)
               for k, scale in enumerate(PATH_SCALES[:len(paths)])]
    return variants + samples + paths, labels


def _path_sets(ctx: ExportContext, feed: dict[str, Any]) -> list[dict[str, Any]]:
    """Sign-flipped / scaled copies of the example when capture will first try a trace the gate checks on them
    (capture/exporter_choice.py), built here for a single graph's gate sets under --no-validate (``add_gate_sets``,
    once its trace warned). Every other export, a multi-graph component under --no-validate too, leaves them to the
    trace gate (``gate_references``), which builds them once a trace warned at more than input checks, literal
    constants and tests of sizes (capture/shape_tests.py): such a trace took no path a probe could change
    (ViT-small: 4 eager forwards and 4 onnxruntime runs at the example's shape; Whisper's encoder under
    --no-validate: 4 of each over its 3000-frame window)."""
    return path_variants(feed) if ctx.decisions.trace_first else []


def _probed(ctx: ExportContext, feed: dict[str, Any]) -> bool:
    """Whether a trace of this export may be probed (``_path_sets``): its random draws are the realistic ones
    whether the probes are built now or later, so the verdict sets do not depend on what the trace warned."""
    return bool(ctx.decisions.trace_first and not ctx.decisions.quantized
                and any(getattr(t, "dtype", None) is not None and t.dtype.is_floating_point for t in feed.values()))
