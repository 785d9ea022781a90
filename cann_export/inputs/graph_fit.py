"""After capture, prepare's parity sets fit the captured graph: the stage table calls ``fit_sets_to_graph`` once
capture has chosen its graph, so capture only makes the graph and never edits the sets (an axis the exporter fixed
cannot vary on the graph, so the sets at its other sizes go)."""
from __future__ import annotations

from typing import Any


def fit_sets_to_graph(ctx: Any, resolved: list[str]) -> None:
    """``resolved``: the dynamic axes' names before capture (``ctx.dynamic_axes`` now holds those the graph kept).
    The sets at other sizes of an axis the graph fixed go; a component's own shape sets (``Decisions.shape_sets``)
    that the graph cannot take go too, and its ATC ranges follow the graph."""
    fixed = set(resolved) - {a.name for a in ctx.dynamic_axes}
    if fixed:
        _drop_sets_varying(ctx, fixed)
    if ctx.decisions is not None and ctx.decisions.shape_sets:
        from .given_shapes import drop_unfit_sets, fix_ranges_to_graph

        drop_unfit_sets(ctx)
        fix_ranges_to_graph(ctx)


def _drop_sets_varying(ctx: Any, fixed: set[str]) -> None:
    """Parity's sets at other sizes of a fixed axis cannot run on the static graph: they go, with the count (the
    capture's warnings already name each axis)."""
    from .dynamic_axes import keep_sets

    labels = ctx.input_set_labels
    example = (labels[0].get("shape") or {}) if labels else {}
    keep = [s for s, label in enumerate(labels)
            if all((label.get("shape") or {}).get(n) == example.get(n) for n in fixed)]
    if len(keep) < len(ctx.input_sets):
        keep_sets(ctx, keep)
    for label in ctx.input_set_labels:  # the fixed dimensions are no longer part of a set's shape
        if isinstance(label.get("shape"), dict):
            label["shape"] = {n: v for n, v in label["shape"].items() if n not in fixed}
    counts = ctx.reports.reference.input_sets
    counts["shapes"] = max(0, counts.get("shapes", 0) - (len(labels) - len(keep)))
