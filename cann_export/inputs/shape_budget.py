"""The element budget of a dynamic single graph's parity shapes: the rule of a multi-graph component's
(inputs/parity_budget.py) on the sets ``--dynamic`` / a loader's axes make. A set at a range end whose inputs plus
``LIVE`` x its largest intermediate (inputs/activations.py: a ResNet's first feature maps, an encoder's attention
scores) pass the budget gives way to the largest size within it, its middle following; a gear past it is left
out. ResNet-18 at batch 16 x 224 x 224: 13 M elements of feature maps per first conv output, 2 x that alive, past
the 2^24 floor: parity's batch range end runs at 9 instead, and the device emulation's peak follows.

What was left out is recorded in the manifest's ``parity.shape_budget`` (only then: a budget that left nothing
out records nothing, and validate expects every point), with the activation terms, so validate re-derives the
same points from the graph's input dims (bundle/dynamic_check.py). ``--parity-full-ranges`` runs every end."""
from __future__ import annotations

from typing import Any

from ..dynamic import DynamicAxis
from .parity_budget import Elements, Point, budget_for, dim_size, shape_elements, weight_elements, with_activations


def input_shapes(axes: list[DynamicAxis], feed: dict[str, Any]) -> list[list[Any]]:
    """Each input's shape with its dynamic axes as their names (what the exported graph's input dims hold)."""
    shapes = {n: list(t.shape) for n, t in feed.items() if hasattr(t, "shape")}
    for a in axes:
        if a.input in shapes:
            shapes[a.input][a.axis] = a.name
    return list(shapes.values())


def set_elements(shapes: list[list[Any]], terms: list[dict[str, Any]], example: Point) -> Elements:
    """``point -> elements`` of one set there: its inputs, plus LIVE x its largest intermediate (``terms``)."""
    return with_activations(shape_elements(shapes, dim_size), terms, example)


def measure(ctx: Any, axes: list[DynamicAxis]) -> tuple[int, Elements, list[dict[str, Any]], int] | None:
    """(the budget, ``point -> elements``, the activation terms, the weight elements) of this export's shape
    sets; None where no budget applies (``--parity-full-ranges``, ``--parity full``, a model that is no
    ``nn.Module``, no range to bound). The terms come from one forward at the example and one per dimension at its
    range's low end (the example's size doubled where that is the low end): small sets, a few ops recorded."""
    import torch

    from .activations import op_sizes, terms_of

    opts, model, feed = ctx.options, ctx.model, ctx.example_inputs
    if opts.parity_full_ranges or opts.parity_coverage == "full" or not isinstance(model, torch.nn.Module):
        return None
    example = {a.name: int(feed[a.input].shape[a.axis]) for a in axes}
    try:
        with torch.no_grad(), op_sizes() as base:
            _call(ctx, feed)
        probes = {}
        for name, size in example.items():
            a = next(x for x in axes if x.name == name)
            low, high = int(a.min or 1), int(a.max or a.min or 1)
            probe = low if low != size else min(high, 2 * size)
            if probe == size:
                continue
            with torch.no_grad(), op_sizes() as ops:
                _call(ctx, _feed_at(feed, axes, {**example, name: probe}))
            probes[name] = (probe, ops)
    except Exception:  # noqa: BLE001 - a size the model fails at: no estimate, every point runs (and is judged)
        return None
    terms = terms_of(example, base, probes)
    elements = set_elements(input_shapes(axes, feed), terms, example)
    weights = weight_elements(model)
    return budget_for(weights, elements(example)), elements, terms, weights


def _call(ctx: Any, feed: dict[str, Any]) -> Any:
    from ..load.calling import call

    return call(ctx.model, ctx.loaded.kind, feed, ctx.input_names, ctx.loaded.extras.get("keyword_inputs", ()))


def _feed_at(feed: dict[str, Any], axes: list[DynamicAxis], point: Point) -> dict[str, Any]:
    """The example's inputs resized to ``point``: a float input drawn afresh, any other its first values repeated
    (ids and masks stay within the model's tables)."""
    import torch

    out = {}
    gen = torch.Generator().manual_seed(0)
    for n, t in feed.items():
        shape = list(t.shape)
        for a in axes:
            if a.input == n:
                shape[a.axis] = point[a.name]
        if list(t.shape) == shape:
            out[n] = t
        elif t.dtype.is_floating_point:
            out[n] = torch.randn(shape, generator=gen).to(t.dtype)
        else:
            out[n] = t.flatten()[:1].reshape([1] * t.dim()).expand(shape).clone()
    return out


def record_left(ctx: Any, budget: tuple[int, Elements, list[dict[str, Any]], int] | None,
                left: list[dict[str, Any]]) -> None:
    """The manifest's ``parity.shape_budget`` when the budget left a size out (else nothing: every point ran)."""
    from .parity_budget import record

    if budget is not None and left:
        ctx.reports.reference.shape_budget = record(budget[0], budget[3], left, budget[2])
        notes = [f"{g['dimension']}={g['size']}: {g['reason']}" for g in left]
        ctx.reports.warnings.dynamic = [*(ctx.reports.warnings.dynamic or []), *notes]


def keep_left(ctx: Any, names: set[str]) -> None:
    """The record's left-out sizes of the dimensions still dynamic (an axis the model failed at is exported
    static: validate counts no range of it); no record when none is left."""
    found = ctx.reports.reference.shape_budget
    if found is None:
        return
    left = [g for g in found["left_out"] if g["dimension"] in names]
    ctx.reports.reference.shape_budget = {**found, "left_out": left} if left else None
