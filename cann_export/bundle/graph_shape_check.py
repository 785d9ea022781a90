"""validate's check of a multi-graph component's ``parity.shapes``: exactly its example's shape and the points
its graph's symbolic dimensions and recorded ATC ranges build (bundle/graph_shapes.py, re-derived from the bundle,
never from the module that wrote it) under the element budget its manifest records (inputs/parity_budget.py; a
shape's elements from the graph's symbolic dims): a range widened after parity ran is refused, as for a single
graph."""
from __future__ import annotations

import re
from typing import Any

from ..bundle.dynamic_check import short
from ..inputs.activations import recorded_terms
from .graph_shapes import points_of, split
from ..inputs.parity_budget import dim_size, fed, recorded_budget, shape_elements, with_activations

_DIGITS = re.compile(r"[0-9]{1,9}")
_DIM = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}(?: \+ [0-9]{1,6})?")  # NAME or NAME + k (bundle/graph_shapes.py)
MAX_TENSORS = 4096  # inputs + outputs of one component counted for the budget (a decoder has a few hundred)
MAX_DIMS = 64  # symbolic dims of one component's inputs (a decoder has a few per cache tensor)


def _ranges(hints: dict[str, Any]) -> dict[str, list[str]] | None:
    """``{input: [dim text]}`` of the ATC ranges a component's convert.sh passes (``input_shape`` on CANN 8,
    ``input_shape_range`` before), None when it passes none (a user's gear hint gives the form)."""
    if not isinstance(hints, dict):
        return None
    text = hints.get("input_shape") or hints.get("input_shape_range")
    if not isinstance(text, str) or "~" not in text:
        return None
    out = {}
    for part in text.split(";"):
        name, _, dims = part.rpartition(":")
        out[name] = dims.strip("[]").split(",")
    return out


def component_shape_problems(name: str, own: dict[str, Any], owns: dict[str, dict[str, Any]] | None = None,
                             connections: list[dict[str, Any]] | None = None) -> list[str]:
    """The differences between a component's recorded parity shapes and the ones its graph and ranges build
    (``owns``, ``connections``: the bundle's component manifests and connections, for the graphs that feed it)."""
    parity = own.get("parity") if isinstance(own.get("parity"), dict) else {}
    rows = parity.get("shapes")
    ranges = _ranges(((own.get("atc") or {}).get("hints") or {}) if isinstance(own.get("atc"), dict) else {})
    if not parity.get("validated") or not isinstance(rows, list) or not rows or ranges is None:
        return []
    shapes = [r.get("shape") if isinstance(r, dict) else r for r in rows]
    example = shapes[0] if isinstance(shapes[0], dict) else {}
    where = f"components/{name}/manifest.json parity.shapes"
    found: dict[str, tuple[int, int, int]] = {}
    order: list[tuple[str, int]] = []
    for value in own["model"]["inputs"]:
        problem = _input_dims(where, value, ranges, example, found, order)
        if problem:
            return [problem]
    if set(example) != set(found):
        return [f"{where}: the first shape {short(example)} is not the example's size of each dimension "
                f"{short(sorted(found))}"]
    everyone = {**(owns or {}), name: own}
    elements = set_cost(name, everyone, connections or [])
    budget, problem = recorded_budget(parity.get("shape_budget"), lambda: elements({n: v[0] for n, v in found.items()}))
    if problem:
        return [f"components/{name}/manifest.json {problem}"]
    _, points, _, left = points_of(found, order, (own.get("atc") or {}).get("hints"), budget, elements,
                                   parity.get("coverage") == "full")
    if shapes != [example, *points]:
        return [f"{where}: parity ran at {short(shapes)}, but the graph's ATC ranges build "
                f"{short([example, *points])}; a range changed after parity ran: export again"]
    recorded = (parity.get("shape_budget") or {}).get("left_out") if budget is not None else []
    # a dimension the written graph fixed (torch.export specialised it after the sets were planned) builds no range:
    # what export left out of it is not compared
    recorded = [r for r in recorded if not isinstance(r, dict) or r.get("dimension") in found] \
        if isinstance(recorded, list) else recorded
    if _sizes(recorded) != _sizes(left):  # a range widened past the budget's cap builds the same points
        return [f"components/{name}/manifest.json parity.shape_budget.left_out: records {short(_sizes(recorded))}, "
                f"the graph's ATC ranges leave out {short(_sizes(left))}; a range changed after parity ran: "
                "export again"]
    return []


def range_bounds(own: dict[str, Any]) -> dict[str, tuple[int, int]] | None:
    """``{dimension: (min, max)}`` of a component's ATC ranges (None when its command passes none, or they do not
    read: validate names why)."""
    parity = own.get("parity") if isinstance(own.get("parity"), dict) else {}
    rows = parity.get("shapes")
    ranges = _ranges(((own.get("atc") or {}).get("hints") or {}) if isinstance(own.get("atc"), dict) else {})
    model = own.get("model") if isinstance(own.get("model"), dict) else {}
    if ranges is None or not isinstance(rows, list) or not rows or not isinstance(rows[0], dict) \
            or not isinstance(model.get("inputs"), list):
        return None
    example = rows[0].get("shape") if isinstance(rows[0].get("shape"), dict) else {}
    found: dict[str, tuple[int, int, int]] = {}
    for value in model["inputs"]:
        if not isinstance(value, dict) or _input_dims("", value, ranges, example, found, []):
            return None
    return {name: (low, high) for name, (_, low, high) in found.items()}


def _sizes(left: Any) -> list[tuple[Any, Any]]:
    """(dimension, size) of each left-out record (the element counts past the budget are not compared: validate
    stops counting at the ceiling)."""
    if not isinstance(left, list):
        return [("?", "not a list")]
    return [(r.get("dimension"), r.get("size")) if isinstance(r, dict) else ("?", str(r)[:20]) for r in left]


def graph_elements(name: str, owns: dict[str, dict[str, Any]], connections: list[dict[str, Any]],
                   depth: int = 0, memo: dict[str, Any] | None = None) -> Any:
    """``point -> elements`` of a component's set's inputs and outputs from its graph's symbolic dims, with the
    graphs that feed it (budget.fed, as export counts them; their example sizes: their first parity shape). Each
    component's is built once (``memo``); the connections were checked to be the plan's (no loops) before this
    runs."""
    memo = {} if memo is None else memo
    if name in memo:
        return memo[name]
    model = owns[name].get("model") if isinstance(owns[name].get("model"), dict) else {}
    values = [v for key in ("inputs", "outputs") if isinstance(model.get(key), list) for v in model[key]]
    tensors = [v.get("shape") if isinstance(v, dict) and isinstance(v.get("shape"), list) else [] for v in values]
    sources = []
    feeding = [c["from"]["component"] for c in connections if isinstance(c, dict) and isinstance(c.get("from"), dict)
               and isinstance(c.get("to"), dict) and c["to"].get("component") == name]
    for src in dict.fromkeys(f for f in feeding if f != name and f in owns):
        if depth >= 8:  # a hostile loop of connections
            break
        sources.append((graph_elements(src, owns, connections, depth + 1, memo), _first(owns[src])))
    memo[name] = fed(shape_elements(tensors[:MAX_TENSORS], dim_size), sources)
    return memo[name]


def set_cost(name: str, owns: dict[str, dict[str, Any]], connections: list[dict[str, Any]]) -> Any:
    """``point -> elements`` the budget counts for a component's set: its graph's inputs and outputs with the
    graphs that feed it (graph_elements), plus its own graph's intermediates (the recorded estimate; a feeding
    graph runs eagerly in another stage, its intermediates gone before this graph runs)."""
    return with_activations(graph_elements(name, owns, connections), _terms(owns[name]), _first(owns[name]))


def _first(own: dict[str, Any]) -> dict[str, int]:
    """A component's example point: its first parity shape."""
    rows = (own.get("parity") or {}).get("shapes") if isinstance(own.get("parity"), dict) else None
    first = rows[0].get("shape") if isinstance(rows, list) and rows and isinstance(rows[0], dict) else None
    return {k: v for k, v in first.items() if isinstance(v, int) and not isinstance(v, bool)} \
        if isinstance(first, dict) else {}


def _terms(own: dict[str, Any]) -> list[dict[str, Any]]:
    """A component's recorded activation terms (none where the record does not read: recorded_budget names it)."""
    parity = own.get("parity") if isinstance(own.get("parity"), dict) else {}
    record = parity.get("shape_budget") if isinstance(parity.get("shape_budget"), dict) else {}
    return recorded_terms(record.get("activations", [])) or []


def _input_dims(where: str, value: dict[str, Any], ranges: dict[str, list[str]], example: dict[str, Any],
                found: dict[str, tuple[int, int, int]], order: list[tuple[str, int]]) -> str | None:
    """Add one input's symbolic dims to ``found`` (dimension: example size, min, max) and ``order`` (its -1s);
    a problem when a dim is not ``NAME`` / ``NAME + k`` (a hand-edited manifest), has no range, or disagrees."""
    held, shown = value.get("shape") or [], str(value["name"])[:80]
    if not isinstance(held, list):
        return f"{where}: {shown}'s shape is not a list of dims (the manifest was edited); export again"
    cells = ranges.get(value["name"]) or []
    for axis, dim in enumerate(held):
        if not isinstance(dim, str):
            if axis < len(cells) and cells[axis] != str(dim):  # T5's decoder once had 1~4096 on a fixed 1
                return (f"{where}: {shown}:{axis} is fixed at {str(dim)[:20]} in the graph, but its ATC command "
                        f"declares {cells[axis][:40]}; export again")
            continue
        if not _DIM.fullmatch(dim) or len(order) >= MAX_DIMS:
            return (f"{where}: {shown}:{axis} ({dim[:80]!r}) is not a dimension of the form NAME or NAME + k, or "
                    f"past {MAX_DIMS} of them; export again")
        base, plus = split(dim)
        low, _, high = (cells[axis] if axis < len(cells) else "").partition("~")
        if not (_DIGITS.fullmatch(low) and _DIGITS.fullmatch(high)) or not isinstance(example.get(base), int):
            return f"{where}: {shown}:{axis} ({dim}) has no ATC range or no example size; export again"
        order.append((base, plus))
        bounds = (example[base], int(low) - plus, int(high) - plus)
        if found.setdefault(base, bounds) != bounds:
            return (f"{where}: {shown}:{axis} ({dim}) has the ATC range {low}~{high}, another input's {base} has "
                    f"{found[base][1] + plus}~{found[base][2] + plus}; export again")
    return None
