"""Dynamic axes into the captured graph: ``dynamic_shapes`` (one ``torch.export.Dim`` per dimension name) for
torch.export / the dynamo exporter, ``dynamic_axes`` for the TorchScript exporter; afterwards the graph's
symbolic dims are given the axes' names (dynamo writes its symbols, ``s77``) and an axis the graph fixed is a
warning naming it (a static graph from a dynamic source)."""
from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any


def dynamic_shapes(ctx: Any) -> dict[str, Any] | None:
    """``{input: {axis: Dim} | None}`` over every graph input, or None when no axis is dynamic (a forward that
    gathers ``**inputs`` is exported under ``named_forward``)."""
    axes = ctx.dynamic_axes
    if not axes:
        return None
    import torch

    dims: dict[str, Any] = {}
    out: dict[str, Any] = {n: None for n in ctx.input_names}
    for a in axes:
        if a.name not in dims:
            dims[a.name] = torch.export.Dim(a.name, min=a.min, max=a.max)
        out[a.input] = {**(out[a.input] or {}), a.axis: dims[a.name]}
    return out


def widened(inputs: dict[str, Any], axes: list[Any] | None) -> dict[str, Any]:
    """The example with each dynamic axis of size 1 repeated to size 2 (where its range allows): torch.export
    specialises a size of 1 (its 0/1 rule), so a graph or program captured from a last call at batch 1 would take
    batch 1 only, where the axis's range (recorded calls at batch 16, a task's batch) is wider."""
    import torch

    out = dict(inputs)
    for a in axes or []:
        t = out.get(a.input)
        wider = a.max is None or a.max >= 2
        if isinstance(t, torch.Tensor) and a.axis < t.dim() and t.shape[a.axis] == 1 and wider:
            out[a.input] = torch.cat([t, t], dim=a.axis)
    return out


@contextlib.contextmanager
def named_forward(model: Any, names: list[str]) -> Iterator[None]:
    """While torch.export runs: a ``forward(self, **inputs)`` (a wrapper's) shows the signature ``(name, ...)``,
    since torch.export keys ``dynamic_shapes`` by forward's parameters and cannot split a ``**kwargs`` one."""
    import inspect
    import types

    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError, AttributeError):
        params = {}
    gathers = any(p.kind == p.VAR_KEYWORD for p in params.values()) and not set(names) <= set(params)
    if not gathers or "forward" in vars(model):
        yield
        return
    original = type(model).forward

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        return original(self, *args, **kwargs)

    P = inspect.Parameter
    forward.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [P("self", P.POSITIONAL_OR_KEYWORD), *(P(n, P.POSITIONAL_OR_KEYWORD) for n in names)])
    model.forward = types.MethodType(forward, model)
    try:
        yield
    finally:
        del model.forward


def torchscript_axes(ctx: Any) -> dict[str, dict[int, str]] | None:
    """The TorchScript exporter's ``dynamic_axes``: the inputs' axes, and the outputs' a loader names
    (``extras["output_axes"]``, Optimum's ``{output: {axis: name}}``) over those same dimension names. A module that
    declares its axes (``extras["graph_axes"]``, a multi-graph component: ``past_sequence_length + 1`` too) gets
    those, as its dynamo capture gets its declared Dims."""
    axes, declared = ctx.dynamic_axes, ctx.loaded.extras.get("graph_axes")
    if not axes and not declared:
        return None
    out: dict[str, dict[int, str]] = {}
    for a in axes:
        out.setdefault(a.input, {})[a.axis] = a.name
    for name, dims in (declared or {}).items():
        if name in ctx.input_names:
            out[name] = {**dict(dims), **out.get(name, {})}
    names = {a.name for a in axes} | {label for dims in (declared or {}).values() for label in dims.values()}
    for output, dims in (ctx.loaded.extras.get("output_axes") or {}).items():
        named = {int(axis): label for axis, label in dims.items() if _over(label, names)}
        if output in ctx.output_names and output not in out and named:
            out[output] = named
    return out


def _over(label: str, names: set[str]) -> bool:
    """Whether an output's axis label is one of the inputs' dimensions, or one of them plus a count (``NAME + k``:
    a seq2seq decode step's ``present.*.decoder`` is ``past_decoder_sequence_length + 1``, which no input has: left
    unnamed, the trace named it after its Concat and validate could not size it)."""
    base, plus, count = label.rpartition(" + ")
    return label in names or bool(plus and base in names and count.isdigit())


def unname_contradicted(model: Any, ctx: Any) -> bool:
    """An output dim the trace's shape inference named after an input's dimension although the reference's sizes
    there are not that dimension's (a VAE decoder's image height, twice the latent's, came out ``batch_size``):
    renamed ``<output>_dim_<axis>``, so the graph claims no size it does not have (validate's parity budget and ATC
    read its dims). Whether a dim changed."""
    where = {d.dim_param: (v.name, axis) for v in model.graph.input if v.type.HasField("tensor_type")
             for axis, d in enumerate(v.type.tensor_type.shape.dim) if d.dim_param}
    index = {name: i for i, name in enumerate(ctx.output_names)}
    changed = False
    for value in model.graph.output:
        i = index.get(value.name)
        if i is None or not value.type.HasField("tensor_type"):
            continue
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.dim_param in where and _contradicted(ctx, where[dim.dim_param], i, axis):
                dim.dim_param = f"{value.name}_dim_{axis}"
                changed = True
    return changed


def _contradicted(ctx: Any, source: tuple[str, int], output: int, axis: int) -> bool:
    """Whether a prepared set's reference output ``output`` has a size at ``axis`` other than its input's at
    ``source`` (input name, axis)."""
    name, at = source
    for feed, outputs in zip(ctx.input_sets, ctx.reference_outputs, strict=False):
        given, out = feed.get(name), outputs[output] if output < len(outputs) else None
        shape_in, shape_out = tuple(getattr(given, "shape", ())), tuple(getattr(out, "shape", ()))
        if at < len(shape_in) and axis < len(shape_out) and shape_in[at] != shape_out[axis]:
            return True
    return False


def fix_declared_outputs(model: Any, ctx: Any) -> bool:
    """A traced graph of a module that declares its axes: an output dim it does not declare dynamic that the
    tracer's shape inference left symbolic (decode's one-token logits) takes the reference's size where every
    prepared set's reference has that one size (as dynamo's graph holds it). Whether a dim changed."""
    declared = ctx.loaded.extras.get("output_axes") if ctx.loaded.extras.get("graph_axes") else None
    if not declared or not ctx.reference_outputs:
        return False
    changed = unname_contradicted(model, ctx)
    index = {name: i for i, name in enumerate(ctx.output_names)}
    for value in model.graph.output:
        i = index.get(value.name)
        if i is None or not value.type.HasField("tensor_type"):
            continue
        shapes = {tuple(outputs[i].shape) for outputs in ctx.reference_outputs if i < len(outputs)}
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            sizes = {shape[axis] for shape in shapes if axis < len(shape)}
            if dim.dim_param and axis not in declared.get(value.name, {}) and len(sizes) == 1:
                dim.Clear()
                dim.dim_value = int(sizes.pop())
                changed = True
    return changed


def name_dims(ctx: Any) -> None:
    """Rename the graph's symbolic dims after the axes (everywhere they occur, output expressions included);
    keep in ``ctx.dynamic_axes`` only the axes the graph kept; warn for each one it fixed."""
    model, axes = ctx.onnx_model, ctx.dynamic_axes
    if not axes or not hasattr(model, "graph"):
        return
    inputs = {v.name: v for v in model.graph.input}
    renames: dict[str, str] = {}
    kept, lost = [], []
    for a in axes:
        value = inputs.get(a.input)
        dims = value.type.tensor_type.shape.dim if value is not None else []
        if a.axis < len(dims) and dims[a.axis].dim_param:
            renames.setdefault(dims[a.axis].dim_param, a.name)
            kept.append(a)
        else:
            fixed = dims[a.axis].dim_value if a.axis < len(dims) else "?"
            why = ("torch.export specialises an example size of 1: give an example of size >= 2" if fixed == 1
                   else "the exporter specialised it (the model's code fixes that size)")
            lost.append(f"{a.input}:{a.axis} ({a.name}, {a.min}..{a.max}, from {a.source}) is static ({fixed}) in the "
                        f"exported graph: {why}; ATC gets a static shape and the graph accepts only that size")
    fixed = {a.name for a in axes if a not in kept}
    for a in [a for a in kept if a.name in fixed]:  # one size for the name: where the graph fixed it, everywhere
        dim = inputs[a.input].type.tensor_type.shape.dim[a.axis]
        size = int(ctx.example_inputs[a.input].shape[a.axis])
        renames.pop(dim.dim_param, None)
        dim.Clear()
        dim.dim_value = size
        lost.append(f"{a.input}:{a.axis} ({a.name}, from {a.source}) is exported static ({size}) as well: the graph "
                    f"fixed {a.name} on another input")
    kept = [a for a in kept if a.name not in fixed]
    if renames:
        _rename(model, renames)
    ctx.dynamic_axes = kept
    if lost:  # the sets at the fixed axes' other sizes go after capture (inputs/graph_fit.py)
        ctx.reports.warnings.dynamic = [*(ctx.reports.warnings.dynamic or []), *lost]


def _rename(model: Any, renames: dict[str, str]) -> None:
    pattern = re.compile(r"\b(" + "|".join(re.escape(k) for k in sorted(renames, key=len, reverse=True)) + r")\b")
    values = [*model.graph.input, *model.graph.output, *model.graph.value_info]
    for value in values:
        if not value.type.HasField("tensor_type"):
            continue
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param:
                dim.dim_param = pattern.sub(lambda m: renames[m.group(1)], dim.dim_param)


def input_dim_names(model: Any) -> dict[tuple[str, int], str]:
    """``(input, axis) -> dim name`` of a graph's symbolic input dims."""
    if not hasattr(model, "graph"):
        return {}
    return {(v.name, axis): d.dim_param for v in model.graph.input if v.type.HasField("tensor_type")
            for axis, d in enumerate(v.type.tensor_type.shape.dim) if d.dim_param}


def restore_input_dims(model: Any, named: dict[tuple[str, int], str]) -> None:
    """Give a rewritten graph's symbolic input dims back the names ``named`` had (everywhere the rewrite's own name
    occurs), where one rewritten name maps to one original name; the inputs are the graph's interface."""
    renames: dict[str, set[str]] = {}
    for (name, axis), dim in input_dim_names(model).items():
        if named.get((name, axis), dim) != dim:
            renames.setdefault(dim, set()).add(named[(name, axis)])
    taken = set(named.values())
    unique = {old: new.pop() for old, new in renames.items() if len(new) == 1 and old not in taken}
    if unique:
        _rename(model, unique)
