"""The trace specialisation probes: copies of the example whose float inputs are sign-flipped and scaled, so a
traced graph's data-dependent branches (``if x.sum() > 0``, thresholds) see values the example did not give them.
Prepare builds them among its input sets when capture will trace first (``Decisions.trace_first``); capture's trace
check and parity judge them (capture/exporter_choice.py, validators/parity.py)."""
from __future__ import annotations

from typing import Any

PATH_SCALES = (-1.0, 4.0, -4.0, 0.25)  # multipliers of the example's float inputs


def path_variants(example: dict[str, Any]) -> list[dict[str, Any]]:
    """One copy of ``example`` per scale, its float tensors scaled; none when it has no float input."""
    sets = []
    for scale in PATH_SCALES:
        one = {n: (t * scale).to(t.dtype) if t.dtype.is_floating_point else t.clone() for n, t in example.items()}
        sets.append(one)
    return sets if any(t.dtype.is_floating_point for t in example.values()) else []


def prepared_paths(ctx: Any) -> bool:
    """Whether the prepare stage built the path variants among its input sets (probes labelled ``trace_path``)."""
    return any(label.get("source") == "trace_path" for label in ctx.input_set_labels)


def add_path_references(ctx: Any) -> None:
    """The path variants of the example and the model's outputs on them into ``ctx.path_input_sets`` /
    ``ctx.path_reference_outputs`` (one forward each, float inputs only), unless prepare built them among its sets
    or they are there already: the trace check and parity judge a warned trace on them."""
    from .reference import reference_outputs

    if ctx.path_input_sets or prepared_paths(ctx) or not ctx.trace_probes:  # sizes only: capture/shape_tests.py
        return
    ctx.path_input_sets = path_variants(ctx.example_inputs)
    if ctx.path_input_sets:
        _, ctx.path_reference_outputs = reference_outputs(ctx, ctx.model, "the sign-flipped / scaled examples",
                                                          list(ctx.input_names), ctx.path_input_sets)
