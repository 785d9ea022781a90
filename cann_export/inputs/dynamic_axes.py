"""The dynamic axes of an export, resolved in the prepare stage against the example inputs: a .pt2's
``torch.export.Dim``s, a loader's axes (``LoadedModel.extras["dynamic_axes"]``, Optimum-style), ``-1`` in
``--input-shape`` and ``--dynamic`` (the user's last word), each named and given a range; and the input sets
parity runs at every gear, or at the range's ends and middle."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from .. import errors
from ..dynamic import DEFAULT_BATCH_MAX, DEFAULT_FACTOR, FLAG, DynamicAxis, check_unique
from . import named_axes


def resolve(ctx: Any) -> list[DynamicAxis]:
    """Every dynamic axis of this export (OptionsError for one the inputs do not have)."""
    feed, extras = ctx.example_inputs, ctx.loaded.extras
    if ctx.options.static_shapes:
        return []
    program = extras.get("program_dims") or {}
    found: dict[tuple[str, int], DynamicAxis] = {}
    symbols: dict[str, str] = {}
    for name, axes in program.items():
        for axis, dim in axes.items():
            label = symbols.setdefault(dim["symbol"], "batch" if axis == 0 else f"{name}_dim{axis}")
            found[(name, axis)] = DynamicAxis(name, axis, label, dim["min"] or 1, dim["max"], source="program")
    shaped = {spec.name for spec in ctx.options.input_shapes}  # the user's --input-shape wins over a loader's axes
    for name, axes in (extras.get("dynamic_axes") or {}).items():
        for axis, label in dict(axes).items() if name not in shaped else ():
            low, high = _loader_range(extras, name, axis)
            found.setdefault((str(name), int(axis)), DynamicAxis(str(name), int(axis), str(label), low, high,
                                                                  source="loader"))
    batch_name = next((a.name for a in found.values() if a.axis == 0 and a.name), "batch")
    for name, (_, high) in (extras.get("recorded_batch") or {}).items():  # the calls of the model varied it
        if name not in shaped:
            found.setdefault((name, 0), DynamicAxis(name, 0, batch_name, 1, max(DEFAULT_BATCH_MAX, high),
                                                    source="recorded calls"))
    for spec in ctx.options.input_shapes:
        for axis, size in enumerate(spec.shape):
            if size == -1:
                found[(spec.name, axis)] = DynamicAxis(spec.name, axis, None, source="--input-shape")
    asked = list(ctx.options.dynamic)
    check_unique(asked)
    for a in asked:
        if not a.by_name:
            _check_asked(a, feed, program, ctx.loaded.kind)
            found[(a.input, a.axis)] = a
    for a in named_axes.apply_by_name([a for a in asked if a.by_name], found):
        _check_asked(a, feed, program, ctx.loaded.kind)
    named_axes.follow_asked(found)
    named_axes.fix_unasked(found, feed, ctx)
    if "dynamic_shapes" not in extras:  # a module declaring its own (a multi-graph component) keeps them
        _hinted_batch(ctx.decisions.batch_gears, found, feed)
    limit = _position_limit(ctx.model)
    axes = [_complete(a, feed, limit) for a in found.values() if a.input in feed and a.axis < feed[a.input].dim()]
    axes = _propagate(axes, feed)
    _check_names(axes)
    return sorted(axes, key=lambda a: (list(feed).index(a.input), a.axis))


def _loader_range(extras: dict[str, Any], name: str, axis: Any) -> tuple[int | None, int | None]:
    """A loader's range of an axis (``dynamic_ranges``: raw audio from its receptive field, an image's sides from
    the total stride to twice the example's); None where the prepare stage decides (``_complete``)."""
    ranges = (extras.get("dynamic_ranges") or {}).get(name) or {}
    pair = ranges.get(axis) or ranges.get(str(axis)) or [None, None]
    low, high = (list(pair) + [None, None])[:2]
    return (low if type(low) is int and low > 1 else None), (high if type(high) is int and high > 0 else None)


def _hinted_batch(gears: tuple[int, ...], found: dict[tuple[str, int], DynamicAxis], feed: dict[str, Any]) -> None:
    """``--atc-hint dynamic_batch_size=G1,G2,...`` with no dynamic batch: axis 0 of every input of the example's
    batch (where ATC puts -1) becomes ``batch`` over the gears and the example's size, so the graph runs at the
    gears and parity is judged there (a model that cannot is exported static with a warning)."""
    ranked = [(n, t) for n, t in feed.items() if hasattr(t, "dim") and t.dim() >= 1]
    if not gears or not ranked or any(axis == 0 for _, axis in found):
        return
    size = int(ranked[0][1].shape[0])
    for name, tensor in ranked:
        if int(tensor.shape[0]) == size:
            found[(name, 0)] = DynamicAxis(name, 0, "batch", min(*gears, size), max(*gears, size),
                                           source="--atc-hint dynamic_batch_size")


def _check_asked(a: DynamicAxis, feed: dict[str, Any], program: dict, kind: str) -> None:
    if a.input not in feed:
        raise errors.OptionsError(f"{FLAG} names input {a.input!r}, which the model does not take; its inputs are "
                                  f"{', '.join(feed)}; pass one of those")
    rank = feed[a.input].dim()
    if a.axis >= rank:
        raise errors.OptionsError(f"{FLAG} {a.input}:{a.axis}: {a.input} has {rank} dimension(s) (shape "
                                  f"{list(feed[a.input].shape)}), so axis {a.axis} does not exist; pass an axis in "
                                  f"0..{rank - 1}")
    if kind == "exported_program":
        dim = program.get(a.input, {}).get(a.axis)
        if dim is None:
            raise errors.OptionsError(
                f"{FLAG} {a.input}:{a.axis}: the .pt2 was captured with that axis static "
                f"({feed[a.input].shape[a.axis]}); a torch.export program keeps the shapes it was captured with. "
                f"Re-export it with dynamic_shapes={{'{a.input}': {{{a.axis}: torch.export.Dim(...)}}}} or drop "
                f"{FLAG} for it")
        low, high = dim["min"] or 1, dim["max"]
        outside = [v for v in (a.gears or (a.min, a.max)) if v is not None and (v < low or (high and v > high))]
        if outside:
            raise errors.OptionsError(
                f"{FLAG} {a.input}:{a.axis}: {outside[0]} is outside the range the .pt2's Dim allows "
                f"({low}..{high if high else 'unbounded'}); give sizes inside it")


def _position_limit(model: Any) -> int | None:
    """A transformers model's position table (config.max_position_embeddings) less RoBERTa's offset of 2 (its
    positions start after the padding index): the longest sequence its task axes default to."""
    for module in getattr(model, "modules", lambda: [])():
        value = getattr(getattr(module, "config", None), "max_position_embeddings", None)
        if type(value) is int and value > 2:
            return value - 2
    return None


def _complete(a: DynamicAxis, feed: dict[str, Any], limit: int | None = None) -> DynamicAxis:
    """A name and a range for an axis given without: batch 1..16 on axis 0, else 1..4 x the example's size (a
    loader's sequence axis at most the position table, ``limit``)."""
    size = int(feed[a.input].shape[a.axis])
    name = a.name or ("batch" if a.axis == 0 else f"{a.input}_dim{a.axis}")
    low = a.min if a.min is not None else 1
    high = a.max if a.max is not None else max(DEFAULT_BATCH_MAX if a.axis == 0 else DEFAULT_FACTOR * size, low)
    if a.max is None and limit and a.source == "loader" and "sequence" in name and size <= limit:
        high = min(high, limit)
    if not low <= size <= high:
        raise errors.OptionsError(f"{FLAG} {a.input}:{a.axis}={name}: the example input's size {size} is outside "
                                  f"{low}..{high}; the graph is captured at the example's shape, so widen the range "
                                  f"(or the gears) to include {size}, or give an example of a size inside it "
                                  "(--input-shape / --example-inputs)")
    return replace(a, name=name, min=low, max=high)


def _propagate(axes: list[DynamicAxis], feed: dict[str, Any]) -> list[DynamicAxis]:
    """An axis of one input is dynamic on the inputs of the same example shape too (attention_mask with
    input_ids): torch.export refuses a graph where they differ, and so would a deployed model."""
    have = {(a.input, a.axis) for a in axes}
    out = list(axes)
    for a in axes:
        shape = tuple(feed[a.input].shape)
        for other, tensor in feed.items():
            if other != a.input and tuple(tensor.shape) == shape and (other, a.axis) not in have:
                out.append(replace(a, input=other, source=f"{a.source} (as {a.input})"))
                have.add((other, a.axis))
    return out


def _check_names(axes: list[DynamicAxis]) -> None:
    """Axes that share a name are one symbol: the same range and gears."""
    by_name: dict[str, DynamicAxis] = {}
    for a in axes:
        first = by_name.setdefault(a.name, a)
        if (first.min, first.max, first.gears) != (a.min, a.max, a.gears):
            raise errors.OptionsError(f"{FLAG}: dimension {a.name!r} is {first.input}:{first.axis} "
                                      f"({first.min}..{first.max}) and {a.input}:{a.axis} ({a.min}..{a.max}); "
                                      "axes of one name share one size: give them the same range, or other names")


def symbols(axes: list[DynamicAxis]) -> dict[str, DynamicAxis]:
    """One axis per dimension name (its range and gears)."""
    out: dict[str, DynamicAxis] = {}
    for a in axes:
        out.setdefault(a.name, a)
    return out


def shape_points(axes: list[DynamicAxis], feed: dict[str, Any], gear_form: bool = False,
                 hints: dict[str, Any] | None = None, full: bool = False, budget: Any = None,
                 left: list[dict[str, Any]] | None = None) -> list[dict[str, int]]:
    """The sizes parity runs at besides the example's: each dimension at each of its points (the sizes ATC
    builds: the gears of a user's gear hint, ``hints``; every gear when the gear form is rendered,
    ``gear_form``; else the range's ends and middle) with the others at the example's size; ``full`` (--parity
    full): then every combination of the gears (of the range ends) not among them."""
    return points_from(axes, {a.name: int(feed[a.input].shape[a.axis]) for a in axes}, gear_form, hints, full,
                       budget, left)


def points_from(axes: list[DynamicAxis], example: dict[str, int], gear_form: bool,
                hints: dict[str, Any] | None = None, full: bool = False, budget: Any = None,
                left: list[dict[str, Any]] | None = None) -> list[dict[str, int]]:
    """shape_points from the example's size per dimension name (validate re-derives them from a bundle).
    ``budget``: (elements, ``point -> elements``) of inputs/shape_budget.py; the sizes past it are appended to
    ``left`` (inputs/parity_budget.within)."""
    import itertools

    from ..atc.hint_gears import axes_hint_sizes
    from .parity_budget import within

    gears = axes_hint_sizes(axes, hints or {})
    named = symbols(axes)
    points: list[dict[str, int]] = []
    for name, a in named.items():
        sizes = gears.get(name) or a.points(gear_form)
        if budget is not None:
            sizes, gone = within(name, sizes, example, budget[0], budget[1], bool(gears.get(name) or gear_form
                                                                                  or a.gears))
            if left is not None:
                left += gone
        for size in sizes:
            point = {**example, name: size}
            if point != example and point not in points:
                points.append(point)
    if full:  # every profile ATC builds (gears), or every combination of the range ends
        built = [gears.get(n) or (a.points(True) if gear_form or a.gears else sorted({int(a.min or 1),
                                                                                     int(a.max or a.min or 1)}))
                 for n, a in named.items()]
        for combo in itertools.product(*built):
            point = {**example, **dict(zip(named, combo, strict=True))}
            if point != example and point not in points:
                points.append(point)
    return points


SHAPE_DRAWS = 1  # input sets per extra shape: the example's shape has its own several (the random variants)


def _point_sets(ctx: Any, axes: list[DynamicAxis], start: int) -> Any:
    """Per extra shape: (point, ``SHAPE_DRAWS`` seeded input sets drawn like the example: floats from N(0, 1),
    integers (ids, masks, token types) within the example's own values, so within the model's tables; labels naming
    the shape in ``label["shape"]``). One per shape, as Polygraphy checks one per profile shape: a shape point
    asks whether the graph computes at that size, which the example's shape's own sets (the distributions, the
    probes) do not; a second draw there doubled the largest forwards (ViT-small at batch 16) for no other check."""
    import torch

    from ..atc.dynamic_form import check_profiles, renders_gears
    from .shape_budget import measure, record_left
    from .tensors import set_label

    feed, opts = ctx.example_inputs, ctx.options
    check_profiles(axes, opts.cann_version, opts.atc_hints)  # before parity runs at sizes ATC would refuse
    gear_form = renders_gears(axes, opts.cann_version, opts.atc_hints)
    full = opts.parity_coverage == "full"
    with _attributes_kept(ctx.model):  # its probe forwards at other sizes may reconfigure the model (Swin)
        budget = measure(ctx, axes)
    left: list[dict[str, Any]] = []
    chosen = shape_points(axes, feed, gear_form, opts.atc_hints, full, budget and budget[:2], left)
    record_left(ctx, budget, left)
    for k, point in enumerate(chosen):
        shapes = {n: list(t.shape) for n, t in feed.items()}
        for a in axes:
            shapes[a.input][a.axis] = point[a.name]
        sets, labels = [], []
        for draw in range(SHAPE_DRAWS):
            gen = torch.Generator().manual_seed(ctx.options.seed + 101 + 2 * k + draw)  # draw 0's seed as before
            sets.append({n: _like(feed[n], shapes[n], gen, n) for n in feed})
            label = set_label("shape", f"{_shown(point)} {'example' if draw == 0 else 'random'}", start + draw)
            label["shape"] = dict(point)
            labels.append(label)
        yield point, sets, labels


def _like(example: Any, shape: list[int], gen: Any, name: str = "") -> Any:
    import torch

    from .boxes import is_boxes, random_boxes

    if is_boxes(name, example):  # valid boxes, each coordinate within the example's
        return random_boxes(tuple(shape), max(int(example.max()), 1), gen, example.dtype)
    if example.dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(example.dtype)
    if example.dtype == torch.bool or example.numel() == 0:
        return torch.ones(shape, dtype=example.dtype)
    low, high = int(example.min()), int(example.max())
    return torch.randint(low, high + 1, shape, generator=gen, dtype=torch.int64).to(example.dtype)


def add_shape_sets(ctx: Any, source: str, accepted: list[str], for_gate: bool = False,
                   after_capture: bool = False) -> None:
    """The shape sets and their reference outputs, appended to the input sets (with validation on, or ``for_gate``:
    the trace gate's under --no-validate); every label names its shape. A dimension the model fails at: an
    OptionsError when the user asked for it (--dynamic, -1 in --input-shape), else (a loader's task axis, a
    program's) the axis is dropped with a warning; ``after_capture`` (the gate's sets, built once a trace warned:
    inputs/stage.py add_gate_sets), the graph holds the axis already: its sets at that size are left out, with a
    warning that the gate did not check there."""
    from ..heap_release import give_back
    from . import eos_rows
    from .reference import reference_outputs
    from .row_reuse import shared_references

    def run(sets: list[dict[str, Any]]) -> list:
        with _attributes_kept(ctx.model):
            return reference_outputs(ctx, ctx.model, source, accepted, input_sets=sets)[1]

    failed: dict[str, str] = {}
    missed: list[tuple[str, str]] = []  # after capture: (axis, why) of each size the model fails at
    if ctx.options.validate or for_gate:
        feed = ctx.example_inputs
        example = example_point(ctx.dynamic_axes, feed)
        drawn = list(_point_sets(ctx, ctx.dynamic_axes, len(ctx.input_sets)))
        for _, sets, _ in drawn:
            eos_rows.place(ctx, sets)
        try:
            shared = shared_references(ctx, drawn, run)  # the batch sizes' rows from one set (inputs/row_reuse.py)
        except errors.PrepareError:
            if not after_capture:
                raise
            shared = {}  # each size on its own below, where the one that fails is named
        for k, (point, sets, labels) in enumerate(drawn):
            varied = next(n for n in point if point[n] != example[n])
            if varied in failed:
                continue
            try:
                outputs = shared[k] if k in shared else run(sets)
            except errors.PrepareError as e:
                why = f"the model fails at {varied}={point[varied]} ({e.message[:300]})"
                if after_capture:  # that size only: the others are still checked
                    missed.append((varied, why))
                else:
                    failed[varied] = why
                continue
            for index, label in enumerate(labels, start=len(ctx.input_sets)):
                label["index"] = index
            ctx.input_sets += sets
            ctx.input_set_labels += labels
            ctx.reference_outputs += outputs
            give_back()  # this shape's forward freed before the next (larger) one
    _failed_sizes(ctx, failed, missed)
    point = example_point(ctx.dynamic_axes, ctx.example_inputs)
    for label in ctx.input_set_labels:
        label["shape"] = {n: v for n, v in (label.get("shape") or point).items() if n in point}
    ctx.reports.reference.input_sets["shapes"] = sum(1 for label in ctx.input_set_labels if label["source"] == "shape")


def _failed_sizes(ctx: Any, failed: dict[str, str], missed: list[tuple[str, str]]) -> None:
    """The axes the model fails at a size of (``failed``): an OptionsError when the user asked for one, else each is
    dropped (exported static) with a warning; ``missed`` (after capture): a warning per size the gate left out."""
    if missed:
        ctx.reports.warnings.dynamic = [*(ctx.reports.warnings.dynamic or []), *(
            f"{a.input}:{a.axis} ({name}, from {a.source}): {why}; the trace gate did not check the graph there "
            "(--no-validate)" for name, why in missed for a in ctx.dynamic_axes if a.name == name)]
    for name, why in failed.items():
        axes = [a for a in ctx.dynamic_axes if a.name == name]
        asked = [a for a in axes if a.source in (FLAG, "--input-shape")]
        if asked:
            raise errors.OptionsError(f"{asked[0].source} {asked[0].input}:{asked[0].axis}={name}: {why}; narrow the "
                                      "range (or the gears) to sizes the model takes")
        ctx.dynamic_axes = [a for a in ctx.dynamic_axes if a.name != name]
        ctx.reports.warnings.dynamic = [*(ctx.reports.warnings.dynamic or []), *(
            f"{a.input}:{a.axis} ({name}, from {a.source}) is exported static: {why}" for a in axes)]
    if failed:
        from .shape_budget import keep_left

        keep_left(ctx, {a.name for a in ctx.dynamic_axes})


@contextlib.contextmanager
def _attributes_kept(model: Any) -> Iterator[None]:
    """A forward at another size may reconfigure the model for it (transformers' Swin shrinks window_size and
    shift_size to a small input): the plain attributes of every module are put back afterwards."""
    kinds = (int, float, bool, str, tuple, type(None))
    saved = [(m, {k: v for k, v in vars(m).items() if isinstance(v, kinds)}) for m in model.modules()]
    try:
        yield
    finally:
        for module, values in saved:
            module.__dict__.update(values)


def _shown(point: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in point.items())


def example_point(axes: list[DynamicAxis], feed: dict[str, Any]) -> dict[str, int]:
    return {a.name: int(feed[a.input].shape[a.axis]) for a in axes}


def keep_sets(ctx: Any, keep: list[int]) -> None:
    """Only the input sets ``keep`` (and their reference outputs, noise and labels, re-indexed) stay: the shape
    sets of an axis the captured graph fixed cannot run on it."""
    count = len(ctx.input_sets)
    for name in ("input_sets", "input_set_labels", "reference_outputs", "reference_noise", "int8_noise",
                 "float_reference_outputs"):
        values = getattr(ctx, name)
        if values and len(values) == count:
            setattr(ctx, name, [values[s] for s in keep])
    for index, label in enumerate(ctx.input_set_labels):
        label["index"] = index
