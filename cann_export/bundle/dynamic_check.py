"""validate's check of a dynamic graph's manifest: its ATC axes and the shapes parity ran at, against the graph."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..hooks.contracts import CheckedBundle


def short(value: Any, limit: int = 160) -> str:
    """``value`` as JSON for a message, cut at ``limit`` characters."""
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + " ..."


def dynamic_differences(checked: CheckedBundle) -> list[str]:
    """Each axis of manifest.atc.dynamic on a symbolic dim of the graph (same input, axis and name), and the
    manifest's parity.shapes exactly the example's shape and the points of those axes (the sizes the rendered
    ATC form builds): a range widened without re-running parity is refused."""
    from ..atc.dynamic_form import dims_of, renders_gears
    from ..inputs.dynamic_axes import points_from

    opts = checked.options
    axes = list(getattr(opts, "dynamic", None) or [])
    if not axes:
        return []
    graph, diffs = dict(dims_of(checked.model)), []
    for a in axes:
        dims = graph.get(a.input)
        held = dims[a.axis] if dims is not None and a.axis < len(dims) else None
        if held != a.name:
            diffs.append(f"manifest.json atc.dynamic.axes: {a.input}:{a.axis}={a.name} is not a symbolic dimension "
                         f"of the graph (it holds {held!r} there); the dynamic axes must be the graph's")
    parity = checked.manifest.get("parity") or {}
    if diffs or not parity.get("validated"):
        return diffs
    rows = parity.get("shapes") if isinstance(parity.get("shapes"), list) else []
    shapes = [r.get("shape") if isinstance(r, dict) else r for r in rows]
    names = {a.name for a in axes}
    example = shapes[0] if shapes else None
    if not isinstance(example, dict) or set(example) != names \
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in example.values()):
        return [f"manifest.json parity.shapes: {short(shapes)} does not start with the example's size of each "
                f"dynamic dimension {sorted(names)}; export again to run parity at the dynamic axes' sizes"]
    budget, problem = _budget(checked.model, axes, example, parity.get("shape_budget"))
    if problem:
        return [f"manifest.json {problem}"]
    left: list[dict[str, Any]] = []
    expected = [example, *points_from(axes, example, renders_gears(axes, opts.cann_version, opts.atc_hints),
                                      opts.atc_hints, parity.get("coverage") == "full", budget, left)]
    recorded = (parity.get("shape_budget") or {}).get("left_out")
    if budget is not None and _sizes(recorded) != _sizes(left):
        return [f"manifest.json parity.shape_budget.left_out: records {short(_sizes(recorded))}, the budget it "
                f"records leaves out {short(_sizes(left))} of the graph's ranges; export again"]
    if shapes != expected:
        diffs.append(f"manifest.json parity.shapes: parity ran at {short(shapes)}, but the atc.dynamic axes "
                     f"({', '.join(f'{a.name} {a.min}..{a.max}' for a in axes)}) build {short(expected)}; a range "
                     "changed after parity ran: export again with the range you deploy")
    return diffs


def _budget(model: Any, axes: list[Any], example: dict[str, int], found: Any) -> tuple[Any, str | None]:
    """((the budget, ``point -> elements``) a single graph's parity shapes were chosen under, or None when its
    manifest records none: every point ran), a problem with the record), counted from the graph's input dims
    and the recorded activation terms as the export counted them (inputs/shape_budget.py)."""
    from ..atc.dynamic_form import dims_of
    from ..inputs.activations import recorded_terms
    from ..inputs.parity_budget import recorded_budget
    from ..inputs.shape_budget import set_elements

    if found is None:
        return None, None
    terms = recorded_terms(found.get("activations", [])) if isinstance(found, dict) else None
    shapes = [list(d) for d in dict(dims_of(model)).values()]
    elements = set_elements(shapes, terms or [], example)
    budget, problem = recorded_budget(found, lambda: elements(example))
    if problem or budget is None:
        return None, problem
    return (budget, elements), None


def _sizes(left: Any) -> list[tuple[Any, Any]]:
    return sorted((g.get("dimension"), g.get("size")) for g in left if isinstance(g, dict)) \
        if isinstance(left, list) else []
