"""The default behaviour of each pipeline stage, driven by the plugin registries."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import errors
from ..capture import large_graph as large_model
from ..capture import module_paths
from ..context import ExportContext, LoadedModel
from ..hooks import manager as plugins
from ..inputs import tensors as inputs_mod
from ..inputs.reference import reference_outputs


def load(ctx: ExportContext) -> str | None:
    import torch

    src = ctx.source
    if isinstance(src, torch.export.ExportedProgram):
        names = list(src.graph_signature.user_inputs)
        ex = None
        if src.example_inputs is not None:
            ex = dict(zip(names, src.example_inputs[0]))
            ex.update(src.example_inputs[1] or {})
        ctx.loaded = LoadedModel(src.module(), "exported_program", ex, extras={"input_names": names})
    elif isinstance(src, torch.jit.ScriptModule):
        ctx.loaded = LoadedModel(src, "torchscript")
    elif isinstance(src, torch.nn.Module):
        ctx.loaded = LoadedModel(_private_copy(src, share_weights=not ctx.options.quantize), "module")
    elif isinstance(src, (str, Path)):
        ctx.loaded = load_path(Path(src), ctx.options, plugins.registry().loaders())
    else:
        raise errors.LoadError(f"cannot export a {type(src).__name__}; pass an nn.Module, an ExportedProgram "
                               "or the path of a model file")
    ctx.model = ctx.loaded.model
    return ctx.loaded.kind


def _private_copy(module: Any, share_weights: bool = False) -> Any:
    """Eval mode and the strip passes must never change the caller's module: work on a copy, on the CPU
    wherever the module lives (npu, npu-sim, cuda). Without training (``share_weights``) the copy's CPU
    parameters and buffers are new tensors over the caller's storage: no pass writes weights in place, and a
    large model is not held twice."""
    from ..backend.placement import cpu_copy

    try:
        return cpu_copy(module, large_model.shared_weights_memo(module) if share_weights else None)
    except Exception as e:
        raise errors.LoadError(f"cannot copy the module to export it without modifying it ({type(e).__name__}: "
                               f"{_gist(e, 200)}); save it with torch.export.save or its state_dict and export "
                               "the file instead") from e


def load_path(path: Path, options: Any, loaders: dict[str, Any]) -> LoadedModel:
    """Check the path, pick the first matching loader by priority, and hash the file."""
    from ..fs.digests import sha256_file

    if not path.exists():
        raise errors.LoadError("model file not found; check the path", path=path)
    if path.is_dir():
        raise errors.LoadError("is a directory; pass a model file (.pt2, .pt, .pth, .safetensors)", path=path)
    for loader in sorted(loaders.values(), key=lambda x: -x.priority):
        if loader.matches(path):
            loaded = loader.load(path, options)
            loaded.source_path = str(path)
            loaded.source_sha256 = sha256_file(path)
            return loaded
    raise errors.LoadError("no loader understands this file", path=path)


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
        ctx.reports.setdefault("warnings", {})["inputs"] = source
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
    ctx.reports.setdefault("reference", {})["input_sets"] = {"example": 1, "random": len(variants),
                                                              "parity_data": len(samples)}
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


def strip(ctx: ExportContext) -> str | None:
    passes = plugins.registry().passes()
    ran = []
    for p in passes:
        if hasattr(p, "apply_module"):
            ctx.model = p.apply_module(ctx.model, ctx)
            ran.append(p.name)
    ctx.reports["strip"] = {"module_passes": ran}
    return ", ".join(ran)


def capture(ctx: ExportContext) -> str | None:
    """Try the exporters in priority order; the first valid graph at the requested opset wins. Without
    --strict-opset a valid graph at another opset the format accepts (ExportOptions.accepts_opset) is the
    last resort, with a warning; with it, no other opset is ever written (CaptureError, exit 3)."""
    from ..backend.eval_mode import to_eval
    from ..capture.onnx_utils import check_graph, opset_of

    exporters = plugins.registry().exporters()
    if ctx.options.exporter != "auto":
        exporters = [e for e in exporters if e.name == ctx.options.exporter]
    attempts: list[dict[str, Any]] = []
    chosen = fallback = None
    traced: dict[str, list[dict[str, Any]]] = {}  # exporter -> the TracerWarnings of its graph
    for exporter in exporters:
        if not exporter.supports(ctx.model):
            attempts.append({"exporter": exporter.name, "error": "does not support this model type"})
            continue
        ctx.capture_notes = []
        try:
            ctx.trace_warnings = []
            model = exporter.export(ctx.model, ctx)
            traced[exporter.name] = ctx.trace_warnings
            large_model.check(model, ctx) if large_model.state(ctx) else check_graph(model)
        except Exception as e:  # noqa: BLE001 - each failure is recorded, the next exporter tried
            attempts.append({"exporter": exporter.name, "error": f"{type(e).__name__}: {_gist(e, 300)}"})
            continue
        finally:
            to_eval(ctx.model, ctx.loaded.kind)  # exporters may restore a training flag on the way out
        opset = opset_of(model)
        attempts.append({"exporter": exporter.name, "opset": opset})
        if opset == ctx.options.opset:
            chosen = (exporter.name, model)
            break
        why = "; ".join(ctx.capture_notes) or "the exporter wrote another opset"
        why = " ".join(why.split())
        attempts[-1]["note"] = f"wrote opset {opset}, asked {ctx.options.opset} ({why[:300]})"
        if fallback is None and ctx.options.accepts_opset(opset, ctx.format):
            fallback = (exporter.name, model)
    if chosen is None and fallback is not None:
        chosen = fallback
    if chosen is None:
        detail = "; ".join(f"{a['exporter']}: {a.get('error') or a.get('note')}" for a in attempts)
        if any("opset" in a for a in attempts):
            raise errors.CaptureError(f"no exporter wrote opset {ctx.options.opset} and --strict-opset refuses "
                                      f"another ({detail}); pass another --opset, or drop --strict-opset",
                                      path=ctx.loaded.source_path)
        raise errors.CaptureError(f"no exporter produced a valid ONNX graph ({detail})",
                                  path=ctx.loaded.source_path)
    name, ctx.onnx_model = chosen
    ctx.module_paths = module_paths.collect(ctx.onnx_model)
    ctx.module_origins = module_paths.collect_origins(ctx.onnx_model)
    opset = opset_of(ctx.onnx_model)
    ctx.capture = {"exporter": name, "opset": opset, "opset_requested": ctx.options.opset, "attempts": attempts}
    ctx.trace_warnings = traced.get(name, [])
    if ctx.trace_warnings:
        _specialised(ctx)
    if opset != ctx.options.opset:
        notes = "; ".join(a["note"] for a in attempts if "note" in a)
        ctx.capture["warning"] = (f"the {name} exporter wrote opset {opset} instead of {ctx.options.opset} "
                                  f"({notes}); pass --strict-opset to refuse any other opset")
        return f"{name}, opset {opset} (asked {ctx.options.opset})"
    return f"{name}, opset {opset}"


def _specialised(ctx: ExportContext) -> None:
    """A traced graph that warned: record it, and the reference on inputs that may take other paths
    (from the stripped module, which is what was traced)."""
    from ..capture import trace_check

    trace_check.record(ctx, ctx.trace_warnings)
    if ctx.options.validate and not ctx.quant_table:
        ctx.path_input_sets = trace_check.path_variants(ctx.example_inputs)
        if ctx.path_input_sets:
            _, ctx.path_reference_outputs = reference_outputs(ctx, ctx.model, "the sign-flipped / scaled examples",
                                                              list(ctx.input_names), ctx.path_input_sets)


def optimize(ctx: ExportContext) -> str | None:
    """Graph passes, then onnxsim; the simplified graph is kept only if it loads and matches."""
    from ..capture.onnx_utils import weights_bytes

    for p in plugins.registry().passes():
        if hasattr(p, "apply_graph"):
            ctx.onnx_model = p.apply_graph(ctx.onnx_model, ctx)
    if large_model.state(ctx) is not None:  # the graph's weights are on disk: no copy of them in memory
        ctx.optimize["onnxsim"] = large_model.optimize_note(ctx.large_graph)
        _final_graph_passes(ctx)
        return "onnxsim skipped (external data)"
    if not ctx.options.simplify:
        ctx.optimize["onnxsim"] = "disabled"
        _final_graph_passes(ctx)
        return "onnxsim disabled"
    if weights_bytes(ctx.onnx_model) > 1_900_000_000:
        ctx.optimize["onnxsim"] = "skipped: graph past the 2 GB protobuf limit"
        _final_graph_passes(ctx)
        return "onnxsim skipped (> 2 GB)"
    verdict, simplified = _simplify(ctx)
    ctx.optimize["onnxsim"] = verdict
    if simplified is not None:
        ctx.onnx_model = simplified
    _final_graph_passes(ctx)
    return "simplified" if simplified is not None else f"kept unsimplified graph ({verdict})"


def _final_graph_passes(ctx: ExportContext) -> None:
    """Passes that must see the simplified graph (onnxsim would fold their work away), e.g. Q/DQ lowering."""
    for p in plugins.registry().passes():
        if hasattr(p, "apply_final_graph"):
            ctx.onnx_model = p.apply_final_graph(ctx.onnx_model, ctx)


def _simplify(ctx: ExportContext) -> tuple[str, Any]:
    import numpy as np
    import onnxsim

    from ..capture.onnx_utils import session
    from ..validators.metrics import all_pass

    try:
        simplified, ok = onnxsim.simplify(ctx.onnx_model)
    except Exception as e:  # noqa: BLE001
        return f"failed: {type(e).__name__}: {_gist(e, 200)}", None
    if not ok:
        return "failed: onnxsim's own check did not pass", None
    feed = {n: t.detach().cpu().numpy() for n, t in ctx.example_inputs.items()}
    tol = ctx.options.tolerance

    def run(m: Any) -> list[Any]:
        sess = session(m)
        return [np.asarray(o) for o in sess.run(None, {i.name: feed[i.name] for i in sess.get_inputs()})]

    try:
        after = run(simplified)
        if all_pass(after, ctx.reference_outputs[0], tol):  # the usual case: the original graph is never run
            return "applied", simplified
        if all_pass(after, run(ctx.onnx_model), tol):  # simplification did not change what the graph computes
            return "applied (outputs equal to the unsimplified graph)", simplified
    except Exception as e:  # noqa: BLE001
        return f"failed: simplified graph does not run ({type(e).__name__}: {_gist(e, 200)})", None
    return "rejected: simplified graph changed outputs beyond tolerance", None


def annotate(ctx: ExportContext) -> str | None:
    from ..capture.onnx_utils import set_metadata
    from ..fs.jsonio import dumps

    ctx.provenance = plugins.registry().provenance(ctx)
    ctx.metadata = {str(k): str(v) for k, v in ctx.options.metadata.items()}
    props = dict(ctx.metadata)
    props.update({f"cann_export.{k}": v for k, v in ctx.provenance.items()})
    if ctx.options.atc_hints:
        props["cann_export.atc.hints"] = dumps(dict(sorted(ctx.options.atc_hints.items())))
    if "quantization" in ctx.reports:  # config, calibration digest, per-layer scales and zero points
        props["cann_export.quantization"] = dumps(ctx.reports["quantization"])
    set_metadata(ctx.onnx_model, props)
    module_paths.stamp(ctx.onnx_model, ctx.module_paths)
    module_paths.stamp_origins(ctx.onnx_model, ctx.module_origins)
    return f"{len(props)} metadata entries"


def run_validators(ctx: ExportContext, stage: str) -> str | None:
    """Run the validators of ``stage``. A failed lint raises (unless ``--lint warn``/``off``); a failed
    parity is recorded and reported through the result instead."""
    validators = [v for v in plugins.registry().validators() if v.stage == stage and _applies(v, ctx.format)]
    if stage == "lint" and ctx.options.lint == "off":
        validators = []
    if not validators:
        return "skipped"
    failed = []
    for v in validators:
        report = v.check(ctx)
        ctx.reports[v.name] = report
        if stage == "lint":
            ctx.lint_reports.append(v.name)
        if not report.get("passed", False):
            failed.append(v.name)
    if failed and stage == "lint":
        findings = [f for name in failed for f in ctx.reports[name].get("findings", [])
                    if f.get("severity") == "error"]
        if ctx.options.lint == "error":
            shown = "; ".join(f.get("message", "") for f in findings[:10])
            more = f" (+{len(findings) - 10} more)" if len(findings) > 10 else ""
            raise errors.LintError(f"{len(findings)} ATC lint error(s): {shown}{more}. Fix the model or the hints, "
                                   "or pass --lint warn to export anyway", path=_source(ctx))
        return f"{len(findings)} lint error(s) reported as warnings (--lint warn)"
    return f"FAILED: {', '.join(failed)}" if failed else "passed"


def _applies(validator: Any, fmt: Any) -> bool:
    """A validator's ``formats``: "*", a tuple of format names, or a predicate on the Format object."""
    wanted = validator.formats
    return wanted == "*" or (wanted(fmt) if callable(wanted) else fmt.name in wanted)


def publish(ctx: ExportContext) -> str | None:
    """Publish the committed artifact to the model zoo (refused when parity failed)."""
    from ..model_zoo import publish as zoo_publish

    parity = ctx.reports.get("parity")
    if parity is not None and not parity.get("passed"):
        raise errors.PublishError("parity failed, so the artifact was not published; fix the model or the "
                                  "tolerances and export again", path=str(ctx.output_path))
    record = zoo_publish(model=str(ctx.output_path), name=ctx.options.publish, metadata=dict(ctx.metadata),
                         zoo=ctx.options.zoo)
    ctx.reports["publish"] = record if isinstance(record, dict) else getattr(record, "to_dict", lambda: {})()
    return f"{ctx.options.publish} version {ctx.reports['publish'].get('version')}"


def _source(ctx: ExportContext) -> str | None:
    return ctx.loaded.source_path if ctx.loaded else None


def _gist(e: BaseException, limit: int = 400) -> str:
    return errors.gist(e, limit)
