"""Parity sets at other shapes that a module makes itself (``graph_shape_sets``, declared with
``graph_input_names``: a multi-graph component, whose inputs at another size must be consistent across its
graphs, components/gears.py): appended to the input sets with their reference outputs, each labelled with its
shape, so the per-shape verdicts (validators/shape_parity.py) are those of a dynamic single graph."""
from __future__ import annotations

from typing import Any

from .. import errors


def add_given_shape_sets(ctx: Any, source: str, accepted: list[str]) -> None:
    """The sets ``ctx.loaded.extras["shape_sets"](seed)`` gives, with their references; every label names its
    shape (the existing sets: the example's). A shape the model fails at is an error naming it."""
    from .reference import reference_outputs
    from .tensors import set_label

    make = ctx.loaded.extras.get("shape_sets")
    if not callable(make) or not ctx.options.validate:
        return
    example, found, notes = make(ctx.options.seed)
    for label in ctx.input_set_labels:
        label["shape"] = dict(example)
    for point, sets in found:
        try:
            _, outputs = reference_outputs(ctx, ctx.model, source, accepted, input_sets=sets)
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
    ctx.reports.reference.input_sets["shapes"] = sum(len(sets) for _, sets in found)
    if notes:
        ctx.reports.warnings.dynamic = [*(ctx.reports.warnings.dynamic or []), *notes]


def _shown(point: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in point.items())
