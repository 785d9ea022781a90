"""Parity sets at other shapes that a module makes itself (``graph_shape_sets``, declared with
``graph_input_names``: a multi-graph component, whose inputs at another size must be consistent across its
graphs, bundle/graph_shapes.py): appended to the input sets with their reference outputs, each labelled with its
shape, so the per-shape verdicts (validators/shape_parity.py) are those of a dynamic single graph."""
from __future__ import annotations

from typing import Any

from .. import errors


def add_given_shape_sets(ctx: Any, source: str, accepted: list[str]) -> None:
    """The sets ``ctx.loaded.extras["shape_sets"](seed)`` gives, with their references; every label names its
    shape (the existing sets: the example's). A shape the model fails at is an error naming it."""
    from ..heap_release import give_back
    from .reference import reference_outputs
    from .tensors import set_label

    make = ctx.decisions.shape_sets
    if not callable(make) or not (ctx.options.validate or ctx.decisions.trace_first):  # no parity: for the trace gate
        return
    example, found, notes, budget = make(ctx.options.seed)
    ctx.reports.reference.shape_budget = budget
    for label in ctx.input_set_labels:
        label["shape"] = dict(example)
    count = 0
    for point, sets in found:  # made one point at a time: a point's inputs exist only once it runs
        count += len(sets)
        try:
            names, outputs = reference_outputs(ctx, ctx.model, source, accepted, input_sets=sets)
        except errors.PrepareError as e:
            raise errors.PrepareError(f"the graph fails at {_shown(point)} (a size of its dynamic range): "
                                      f"{e.message[:300]}", path=ctx.loaded.source_path) from e
        for draw, feed in enumerate(sets):
            label = set_label("shape", f"{_shown(point)} {'example' if draw == 0 else 'random'}",
                              len(ctx.input_sets))
            label["shape"] = dict(point)
            ctx.input_sets.append(feed)
            ctx.input_set_labels.append(label)
        ctx.reference_outputs += outputs
        give_back()  # this shape's forward freed before the next (larger) one
        if callable(getattr(make, "keep", None)):  # a later graph's inputs from these references (bundle/parity_reuse)
            make.keep(point, names, outputs)
    ctx.reports.reference.input_sets["shapes"] = count
    if notes:
        ctx.reports.warnings.dynamic = [*(ctx.reports.warnings.dynamic or []), *notes]


def _shown(point: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in point.items())


def drop_unfit_sets(ctx: Any) -> None:
    """After capture: a dimension the exporter fixed (torch.export specialises an axis the model's code pins,
    such as a decoder's one-token input) cannot vary on the graph; its shape sets go, with a warning, and it
    leaves every set's shape (validate re-derives the shapes from the graph's symbolic dims)."""
    from .dynamic_axes import keep_sets

    labels = ctx.input_set_labels
    if not ctx.loaded.extras.get("shape_sets") or not (fixed := fixed_dims(ctx)):
        return
    example = labels[0]["shape"]
    keep = [s for s, label in enumerate(labels) if all(label["shape"].get(n) == example.get(n) for n in fixed)]
    dropped = len(labels) - len(keep)
    keep_sets(ctx, keep)
    for label in ctx.input_set_labels:
        label["shape"] = {k: v for k, v in label["shape"].items() if k not in fixed}
    counts = ctx.reports.reference.input_sets
    counts["shapes"] = max(0, counts.get("shapes", 0) - dropped)
    kept = [w for w in ctx.reports.warnings.dynamic or [] if not any(w.startswith(f"{n}: ") for n in fixed)]
    ctx.reports.warnings.dynamic = [*kept, *(
        f"{name} is static in the exported graph (the exporter specialised it at the example's size "
        f"{example.get(name)}): parity ran at the other dimensions' sizes" for name in sorted(fixed))]


def fixed_dims(ctx: Any) -> set[str]:
    """The dimensions the input sets vary (their labels' ``shape``) that the captured graph holds at one size."""
    from ..graph.onnx_helpers import graph_dims

    labels = ctx.input_set_labels
    if not labels or not isinstance(labels[0].get("shape"), dict):
        return set()
    graph, example = graph_dims(ctx.onnx_model), labels[0]["shape"]
    fixed: set[str] = set()
    for s, feed in enumerate(ctx.input_sets):
        for name, tensor in feed.items():
            held = graph.get(name) or []
            if any(isinstance(d, int) and d > 0 and d != n for d, n in zip(held, tensor.shape, strict=False)):
                fixed |= {k for k, v in (labels[s].get("shape") or {}).items() if v != example.get(k)}
    return fixed


def fix_ranges_to_graph(ctx: Any) -> None:
    """After capture: the ATC ranges a component's module declared (``input_shape`` / ``input_shape_range`` with
    ``~``) follow the exported graph, so a dimension the exporter fixed gets its fixed size in the ATC command
    (T5's decoder once declared 1~4096 on an input the graph held at 1)."""
    from ..graph.onnx_helpers import graph_dims

    hints = ctx.options.atc_hints or {}
    key = next((k for k in ("input_shape", "input_shape_range") if "~" in str(hints.get(k) or "")), None)
    if key is None:
        return
    graph, parts, changed = graph_dims(ctx.onnx_model), [], []
    for part in str(hints[key]).split(";"):
        name, _, dims = part.rpartition(":")
        bracket = dims.startswith("[")
        cells = dims.strip("[]").split(",")
        for axis, held in enumerate(graph.get(name) or []):
            if isinstance(held, int) and held > 0 and axis < len(cells) and "~" in cells[axis]:
                changed.append(f"{name}:{axis} {cells[axis]} -> {held}")
                cells[axis] = str(held)
        parts.append(f"{name}:{'[' if bracket else ''}{','.join(cells)}{']' if bracket else ''}")
    if changed:
        ctx.options.atc_hints = {**hints, key: ";".join(parts)}
        ctx.reports.warnings.dynamic = [*(ctx.reports.warnings.dynamic or []),
                                        "the ATC ranges follow the exported graph's fixed dims: " + ", ".join(changed)]
