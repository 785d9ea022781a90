"""ONNX exporters for the capture stage: torch.onnx's dynamo exporter first, TorchScript as fallback."""
from __future__ import annotations

import contextlib
import logging
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import attempt_scratch, large_graph, weights_apart
from ..graph.module_paths import collect_origins, remember_folds, restore_folds, stamp_from_exporter, stamp_origins

_NOISY_LOGGERS = ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript", "torch.fx")


@contextlib.contextmanager
def quiet_export(record: list | None = None) -> Iterator[None]:
    """Keep exporter chatter off stdout (``--json`` owns it) and below warning level; with ``record``,
    the tracer's TracerWarnings are appended to it instead of dropped (trace specialisation)."""
    saved = {name: logging.getLogger(name).level for name in _NOISY_LOGGERS}
    try:
        for name in _NOISY_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
            warnings.simplefilter("ignore")
            if record is None:
                yield
                return
            import torch

            from .trace_guards import recorder
            from .trace_taint import Trace, untraced_reads

            trace = Trace()  # each warning with the model's frames it came through (capture/trace_guards.py)
            warnings.simplefilter("always", torch.jit.TracerWarning)
            warnings.showwarning = recorder(record, trace)
            with untraced_reads(trace):
                yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def call_args(ctx: Any, inputs: dict[str, Any] | None = None) -> tuple[tuple, dict]:
    """Modules take named inputs (those that declare ``graph_input_names`` in order); TorchScript graphs take
    them in order; torch.export programs as captured (by position, and by name those captured as keywords).
    ``inputs``: other tensors than the example's, by the same names."""
    from ..load.calling import split_call

    feed = ctx.example_inputs if inputs is None else inputs
    if ctx.loaded.kind == "module" and ctx.loaded.extras.get("positional"):
        return tuple(feed[n] for n in ctx.input_names), {}
    return split_call(ctx.loaded.kind, feed, ctx.input_names, ctx.loaded.extras.get("keyword_inputs", ()))


class DynamoExporter:
    name = "dynamo"
    priority = 100

    def supports(self, model: Any) -> bool:
        import torch

        return isinstance(model, torch.nn.Module) and not isinstance(model, torch.jit.ScriptModule)

    def export(self, model: Any, ctx: Any) -> Any:
        args, kwargs = call_args(ctx)
        asked = ctx.options.opset
        native = max(asked, _dynamo_min_opset())
        with quiet_export():
            held = [_dynamo_graph(model, args, kwargs, native, ctx)]
        stamp_from_exporter(held[0])
        if asked < native:  # torch would call onnx's converter, which asserts or leaves invalid attributes
            return _down_convert(held, asked, ctx)
        return held[0]


def _dynamo_graph(model: Any, args: tuple, kwargs: dict, opset: int, ctx: Any) -> Any:
    """torch.export, then torch.onnx; a known conversion failure is worked around on the FX graph. With dynamic
    axes a conversion that fails is tried again static (the capture stage warns for each axis)."""
    from .dynamic_dims import dynamic_shapes

    declared = ctx.loaded.extras.get("dynamic_shapes") if ctx.loaded is not None else None
    if declared:  # a module's own graph_dynamic_shapes (positional inputs, derived dims such as past + 1)
        return _declared_graph(model, args, kwargs, opset, {"dynamic_shapes": (declared,)}, ctx)
    shapes = dynamic_shapes(ctx)
    if shapes is None:
        return _dynamo_attempt(model, args, kwargs, opset, ctx, None)
    from .dynamic_dims import widened

    wide = widened(ctx.example_inputs, ctx.dynamic_axes)  # no 0/1 specialisation of a size-1 example
    try:
        if wide is ctx.example_inputs or all(wide[n] is ctx.example_inputs[n] for n in wide):
            return _dynamo_attempt(model, args, kwargs, opset, ctx, shapes)
        graph = _dynamo_attempt(model, *call_args(ctx, wide), opset, ctx, shapes)
        if not _static_where_widened(graph, ctx, wide):
            return graph
        return _dynamo_attempt(model, args, kwargs, opset, ctx, shapes)  # a widened axis the model fixed
    except Exception as e:  # noqa: BLE001 - torch.onnx's symbolic-shape failures: the static graph may still export
        attempt_scratch.note(f"dynamic graph: {type(e).__name__}: {' '.join(str(e).split())[:300]}")
    return _dynamo_attempt(model, args, kwargs, opset, ctx, None)


def _static_where_widened(graph: Any, ctx: Any, wide: dict[str, Any]) -> bool:
    """The graph fixed an axis the widened example doubled (at the doubled size, not the example's)."""
    from ..graph.onnx_helpers import graph_dims

    dims = graph_dims(graph) if hasattr(graph, "graph") else {}
    for name, t in wide.items():
        example = ctx.example_inputs[name]
        for axis, size in enumerate(dims.get(name, [])):
            if isinstance(size, int) and axis < example.dim() and t.shape[axis] != example.shape[axis]:
                return True
    return False


def _dynamo_attempt(model: Any, args: tuple, kwargs: dict, opset: int, ctx: Any, shapes: dict | None) -> Any:
    import torch

    from .dynamic_dims import named_forward

    options = {"dynamo": True, "opset_version": opset, "input_names": list(ctx.input_names),
               "output_names": list(ctx.output_names), "verbose": False, "report": False, "optimize": False}
    named = named_forward(model, list(ctx.input_names)) if shapes else contextlib.nullcontext()
    try:
        with named:
            program = _program(model, args, kwargs, shapes, ctx)
    except Exception:  # noqa: BLE001 - torch.onnx tries its other strategies (strict, draft export) itself
        with named_forward(model, list(ctx.input_names)) if shapes else contextlib.nullcontext():
            onnx_program = torch.onnx.export(model, args, kwargs=kwargs, dynamic_shapes=shapes, **options)
        return _optimized(onnx_program, ctx)
    try:
        return _optimized(torch.onnx.export(program, args, kwargs=kwargs, **options), ctx)
    except Exception as e:
        if "Cannot view a tensor" not in _chain_text(e):
            raise
    # torch.onnx's decomposition turns reshape into view from strides its type-promotion pass then disagrees
    # with (sdpa outputs; Swin, T5): a contiguous copy before each view/reshape makes both passes agree.
    contiguous_before_views(program)
    return _optimized(torch.onnx.export(program, args, kwargs=kwargs, **options), ctx)


def _declared_graph(model: Any, args: tuple, kwargs: dict, opset: int, dynamic: dict, ctx: Any) -> Any:
    """The capture of a module that declares its dynamic shapes: passed to torch.export and again to
    torch.onnx, which names the graph's symbolic dims after the declared Dims."""
    import torch

    options = {"dynamo": True, "opset_version": opset, "input_names": list(ctx.input_names),
               "output_names": list(ctx.output_names), "verbose": False, "report": False, "optimize": False}

    try:
        program = torch.export.export(model, args, kwargs=kwargs, strict=False, **dynamic)
    except Exception:  # noqa: BLE001 - torch.onnx tries its other strategies (strict, draft export) itself
        return _optimized(torch.onnx.export(model, args, kwargs=kwargs, **options, **dynamic), ctx)
    try:
        return _optimized(torch.onnx.export(program, args, kwargs=kwargs, **options, **dynamic), ctx)
    except Exception as e:
        if "Cannot view a tensor" not in _chain_text(e):
            raise
    contiguous_before_views(program)
    return _optimized(torch.onnx.export(program, args, kwargs=kwargs, **options, **dynamic), ctx)


def _program(model: Any, args: tuple, kwargs: dict, shapes: dict | None, ctx: Any) -> Any:
    """torch.export with the dynamic axes; a dimension torch says the model specialises ("You marked batch as
    dynamic but your code specialized it") is dropped and the capture tried again, then the static program, with
    the reasons noted (the capture stage warns for each axis the graph fixed)."""
    import re

    import torch

    for _ in range(4):
        if not shapes:
            break
        try:
            return torch.export.export(model, args, kwargs=kwargs, strict=False, dynamic_shapes=shapes)
        except Exception as e:  # noqa: BLE001 - torch's constraint violations and guard failures alike
            text = " ".join(str(e).split())
            attempt_scratch.note(f"dynamic shapes: {text[:300]}")
            fixed = set(re.findall(r"You marked (\w+) as dynamic but your code specialized it", text))
            if not fixed:
                break
            shapes = {n: ({a: d for a, d in v.items() if getattr(d, "__name__", None) not in fixed} or None)
                      if v else None for n, v in shapes.items()}
            if not any(shapes.values()):
                break
    return torch.export.export(model, args, kwargs=kwargs, strict=False)


def _optimized(program: Any, ctx: Any) -> Any:
    """torch.onnx's own optimisation (onnxscript's optimizer and fusions); a Conv that absorbed a BatchNorm
    keeps the Conv's origin and names the BatchNorm as folded. A large graph is saved with external data.
    For a format bound to ATC it must not write an op outside ai.onnx (internal error otherwise; the standard
    ops of inlined local functions are the model's own, which the lint stage judges)."""
    from ..atc.lint import foreign_ops, require_standard

    graph = program.model.graph
    folds = remember_folds(graph)
    atc_bound = bool(getattr(ctx.format, "lint", False))
    before = foreign_ops(graph.all_nodes()) if atc_bound else set()
    program.optimize() if large_graph.state(ctx) is None else large_graph.optimize_keeping_weights(program)
    if atc_bound:
        require_standard(before, foreign_ops(program.model.graph.all_nodes()), "torch.onnx's optimize()")
    restore_folds(program.model.graph, folds)
    return large_graph.dynamo_graph(program, ctx)


def contiguous_before_views(program: Any) -> int:
    """Insert ``aten.clone(memory_format=contiguous)`` before every view/reshape input (an Identity in ONNX)."""
    import torch

    graph, count = program.graph, 0
    targets = (torch.ops.aten.view.default, torch.ops.aten.reshape.default)
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in targets:
            continue
        with graph.inserting_before(node):
            copy = graph.call_function(torch.ops.aten.clone.default, (node.args[0],),
                                       {"memory_format": torch.contiguous_format})
        copy.meta = dict(node.meta)
        copy.meta["val"] = node.args[0].meta.get("val")
        node.args = (copy, *node.args[1:])
        count += 1
    program.graph_module.recompile()
    return count


def _chain_text(e: BaseException) -> str:
    parts = []
    while e is not None and len(parts) < 10:
        parts.append(str(e))
        e = e.__cause__ or e.__context__
    return "\n".join(parts)


def _down_convert(held: list, opset: int, ctx: Any) -> Any:
    """The graph (``held``'s one item, taken out of it) at ``opset``, or unchanged (at 18) with the reason
    recorded when a node has no older form or the converted graph computes something else. The opset-18
    graph waits in a file meanwhile (read back only to compare or to keep it), so its copy is not held while
    onnxruntime loads the converted one."""
    import onnx

    from .opset_convert import OpsetConversionError, convert

    graph = held.pop()
    origins = collect_origins(graph)
    with tempfile.TemporaryDirectory(prefix="cann-export-opset-") as tmp:
        kept = graph
        if large_graph.state(ctx) is None:  # a large graph's slim proto holds no weights
            kept = Path(tmp) / "opset18.onnx"
            onnx.save(graph, str(kept))
        try:
            converted = convert(graph, opset)
            del graph
            _same_outputs(converted, kept, ctx)
        except OpsetConversionError as e:
            attempt_scratch.note(f"dynamo: opset {opset}: {e}")
            attempt_scratch.note_loaded(None)
            return onnx.load(str(kept)) if isinstance(kept, Path) else kept
    stamp_origins(converted, origins)
    return converted


def _same_outputs(converted: Any, original: Any, ctx: Any) -> None:
    """The converted graph runs and computes what the reference (else the opset-18 graph: a ModelProto or a
    file) does; OpsetConversionError otherwise."""
    import numpy as np

    from ..graph.onnx_helpers import session
    from .opset_convert import OpsetConversionError

    feed = {n: t.detach().cpu().numpy() for n, t in ctx.example_inputs.items()}

    def run(m: Any) -> list[Any]:
        sess = session(m) if large_graph.state(ctx) is None else large_graph.run_session(m, ctx)
        return [np.asarray(o) for o in sess.run(None, {i.name: feed[i.name] for i in sess.get_inputs()})]

    try:
        after = run(converted)
    except Exception as e:
        raise OpsetConversionError(f"the converted graph does not run: {type(e).__name__}: {e}") from e
    attempt_scratch.note_loaded(converted)  # onnxruntime loaded it: the capture's check need not load it again
    reference = ctx.reference_outputs
    judge = attempt_scratch.judge()
    # the usual case: the opset-18 graph is never run
    if reference and len(after) == len(reference[0]) and all(judge.outputs_agree(after, reference[0],
                                                                                 ctx.options.tolerance)):
        return
    try:
        before = run(original)
    except Exception as e:
        raise OpsetConversionError(f"the opset-18 graph does not run: {type(e).__name__}: {e}") from e
    bad = [i for i, same in enumerate(judge.outputs_agree(after, before, ctx.options.tolerance)) if not same]
    if bad:
        raise OpsetConversionError(f"the converted graph changes output(s) {bad}")


def _dynamo_min_opset() -> int:
    """The lowest opset torch.onnx's dynamo exporter implements (18 in torch 2.13)."""
    try:
        from torch.onnx._internal.exporter._constants import TORCHLIB_OPSET

        return int(TORCHLIB_OPSET)
    except Exception:  # noqa: BLE001 - a private constant: fall back to the value torch 2.13 uses
        return 18


class TorchScriptExporter:
    name = "torchscript"
    priority = 50

    def supports(self, model: Any) -> bool:
        return True

    def export(self, model: Any, ctx: Any) -> Any:
        import torch

        args, kwargs = call_args(ctx)
        if kwargs:  # the tracer binds kwargs by position and turns defaulted parameters into inputs
            model, args = _Positional(model, len(args), list(kwargs)), (*args, *kwargs.values())
        from .lean_shape_inference import lean_shape_inference
        from .traceable_masks import traceable_masks

        caught: list = []
        with tempfile.TemporaryDirectory(prefix="cann-export-capture-") as tmp, quiet_export(record=caught), \
                _fixed_mode(model, ctx), lean_shape_inference(), traceable_masks():
            path = Path(tmp) / "model.onnx"  # a file path lets torch write external data past 2 GB
            from ..graph.onnx_helpers import declared_outputs_hold
            from .dynamic_dims import fix_declared_outputs, torchscript_axes

            written = _Written() if _in_memory(ctx) else None
            with weights_apart.held_apart(written.weights) if written is not None and weights_apart.supported() \
                    else contextlib.nullcontext():
                torch.onnx.export(
                    model, args, str(path) if written is None else written, dynamo=False,
                    opset_version=ctx.options.opset, input_names=list(ctx.input_names),
                    output_names=list(ctx.output_names), do_constant_folding=True,
                    dynamic_axes=torchscript_axes(ctx),
                )
            graph = large_graph.load_captured(path, ctx) if written is None else written.checked_graph()
            # an output dim fix_declared_outputs narrows (decode's one-token logits) is checked by the full check's
            # strict inference without the weights; where that cannot tell, capture checks the changed graph whole
            narrowed = fix_declared_outputs(graph, ctx)
            if large_graph.state(ctx) is None and (not narrowed or declared_outputs_hold(graph)):
                if written is None:  # checked on the file it wrote: capture's check need not write it again
                    import onnx

                    onnx.checker.check_model(str(path), full_check=True)
                attempt_scratch.note_checked(graph)  # only our module stamps change it after this
        stamp_from_exporter(graph, strip_prefix="model" if kwargs else None)  # "model": the _Positional wrapper
        from .trace_warnings import tracer_findings

        ctx.trace_warnings = tracer_findings(caught)  # the capture stage marks the graph specialised
        return graph


IN_MEMORY_LIMIT = 1 << 30  # module bytes: a graph this size stays well within protobuf's 2 GB in one proto


def _in_memory(ctx: Any) -> bool:
    """Whether the TorchScript export hands its graph's bytes over in memory rather than through a file: a graph
    within protobuf's limit (no large-graph mode). GPT-2 small's 500 MB went to disk and was read back per graph."""
    size = getattr(ctx.decisions, "module_bytes", None)
    return large_graph.state(ctx) is None and isinstance(size, int) and size <= IN_MEMORY_LIMIT


class _Written:
    """What torch.onnx.export writes to a file object: the serialised graph, kept as the one bytes object it
    writes (no copy, no disk), and its weights by name when they came apart from it (capture/weights_apart.py)."""

    def __init__(self) -> None:
        self.data = b""
        self.weights: dict[str, bytes] = {}

    def write(self, data: bytes) -> int:
        self.data = bytes(data) if not self.data else self.data + bytes(data)
        return len(data)

    def flush(self) -> None:
        return None

    def checked_graph(self) -> Any:
        """The graph, after onnx's full check passed on its bytes (as on the file it would have written;
        graph/weightless_check.py); the bytes are let go."""
        import onnx

        from ..graph.weightless_check import full_check, full_check_apart

        data, self.data = self.data, b""
        if not self.weights:
            full_check(data)  # the checker without the weights' bytes (their byte counts checked here)
            return onnx.ModelProto.FromString(data)
        graph = onnx.ModelProto.FromString(data)
        checked = full_check_apart(graph, self.weights)
        weights_apart.attach(graph, self.weights)
        if not checked:
            onnx.checker.check_model(graph, full_check=True)
        return graph


@contextlib.contextmanager
def _fixed_mode(model: Any, ctx: Any) -> Iterator[None]:
    """A graph unlifted from a torch.export archive raises on train()/eval(), which the TorchScript exporter
    calls; its mode is already fixed (the prepare stage rewrote it to inference), so both become no-ops."""
    if ctx.loaded.kind != "exported_program":
        yield
        return
    import types

    saved = {name: model.__dict__.get(name) for name in ("train", "eval")}
    model.train = types.MethodType(lambda self, mode=True: self, model)
    model.eval = types.MethodType(lambda self: self, model)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                model.__dict__.pop(name, None)
            else:
                model.__dict__[name] = value


def _Positional(model: Any, leading: int, names: list[str]) -> Any:
    """Wrap ``model`` so it takes exactly its inputs, in order, as positional tensors: the first ``leading`` are
    passed on by position, the rest by the keyword ``names``."""
    import torch

    class Positional(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: Any) -> Any:
            return self.model(*tensors[:leading], **dict(zip(names, tensors[leading:], strict=False)))

    wrapper = Positional()
    wrapper.training = model.training  # the exporter restores the wrapper's mode recursively (not train(): an
    return wrapper  # unlifted torch.export program raises on it before _fixed_mode makes it a no-op)
