"""The element budget of a multi-graph component's parity shapes: a shape whose one input set (its inputs plus
its outputs, in elements) passes the budget is not run; a range end past it is replaced by the largest size within
it (and the middle follows), a gear past it is left out. Each left-out size is recorded in the component's
manifest (``parity.shape_budget``) with the reason, and ``--parity-full-ranges`` (``parity_full_ranges=True``)
runs every range end as before.

The budget is a third of the model's weight elements, at least 2^24 and at most 2^27 elements: one set's reference
outputs, onnxruntime's outputs and its inputs together stay under the weights' own size, so parity's memory
follows the model's rather than the range's (GPT-2 small: 41 M elements, batch 64 at the 7-token prompt fits, the
full 1024-token prompt at batch 2, 141 M, does not; a tiny test model's whole range fits the 2^24 floor). The
elements of a shape are what its graph's inputs and outputs hold there: at export from the module's outputs at
the example and at each dimension's low end, at validate from the graph's symbolic dims (bundle/graph_shape_check.py),
so both derive the same shapes."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

SHARE = 3  # budget = weight elements / SHARE
LIVE = 2  # intermediates alive at once, in units of the largest (attention scores and their softmax)
FLOOR = 1 << 24
CEILING = 1 << 27
Point = dict[str, int]
Elements = Callable[[Point], int]
HOW = "pass --parity-full-ranges (parity_full_ranges=True) to run it"


def budget_for(weights: int, example: int = 0) -> int:
    """The element budget of one parity input set for a model of ``weights`` elements, at least ``example`` (the
    elements of the example's set, which runs whatever the budget: the raw toolchain pays it too)."""
    return int(max(min(CEILING, max(FLOOR, int(weights) // SHARE)), min(int(example), CEILING)))


def with_activations(io: Elements, terms: list[dict[str, Any]], example: Point) -> Elements:
    """``point -> elements`` of a set's inputs and outputs (``io``) plus LIVE times its largest intermediate
    (inputs/activations.py ``terms``, their sizes at ``example``)."""
    from .activations import largest

    if not terms:
        return io
    return lambda point: io(point) + LIVE * largest(terms, example, point)


def weight_elements(module: Any) -> int:
    """Elements of the module's parameters and buffers, each tensor once (a tied LM head counts once)."""
    return sum(t.numel() for t in _weights(module))


def weight_bytes(module: Any) -> int:
    """Bytes of the module's parameters and buffers, each tensor once."""
    return sum(t.numel() * t.element_size() for t in _weights(module))


def _weights(module: Any) -> list[Any]:
    seen: dict[int, Any] = {}
    for t in [*module.parameters(), *module.buffers()]:
        seen.setdefault(id(t), t)
    return list(seen.values())


def within(name: str, sizes: list[int], example: Point, budget: int | None, elements: Elements | None,
           gears: bool) -> tuple[list[int], list[dict[str, Any]]]:
    """``sizes`` of dimension ``name`` that parity runs at under ``budget`` and the records of those left out. A
    range's end past the budget gives way to the largest size within it (its middle follows); a gear past it
    goes. The low end always runs (the smallest set there is)."""
    if budget is None or elements is None or not sizes:
        return sizes, []
    cost = {size: elements({**example, name: size}) for size in sizes}
    over = [s for s in sizes if cost[s] > budget and s != sizes[0]]
    if not over:
        return sizes, []
    if gears:
        kept = [s for s in sizes if s not in over]
        return kept, [_left(name, s, cost[s], budget, None) for s in over]
    low, high = sizes[0], sizes[-1]
    cap = _largest(name, low, high, example, budget, elements)
    kept = sorted({low, (low + cap) // 2, cap})
    return kept, [_left(name, s, cost[s], budget, cap) for s in over]


def _largest(name: str, low: int, high: int, example: Point, budget: int, elements: Elements) -> int:
    """The largest size in low..high whose set stays within the budget (elements grow with the size), else low."""
    lo, hi = low, high
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if elements({**example, name: mid}) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _left(name: str, size: int, cost: int, budget: int, cap: int | None) -> dict[str, Any]:
    instead = f"; parity ran at {name}={cap} instead (the largest within it)" if cap is not None else ""
    return {"dimension": name, "size": size, "elements": cost,
            "reason": f"one input set at {name}={size} holds {cost} elements (inputs + outputs), past the budget of "
                      f"{budget}{instead}; {HOW}"}


def record(budget: int | None, weights: int, left: list[dict[str, Any]],
           terms: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``parity.shape_budget`` of a component's manifest (``terms``: its largest intermediate's estimate,
    inputs/activations.py, which validate counts as export did)."""
    if budget is None:
        return {"full": True, "weights": weights}
    return {"full": False, "elements": budget, "weights": weights,
            "rule": f"a third of the weight elements, within {FLOOR}..{CEILING}, or the example's set if larger; "
                    f"a set counts its inputs, outputs and {LIVE}x its largest intermediate",
            "activations": terms or [], "left_out": left}


def recorded_budget(found: Any, example: Callable[[], int] | None = None) -> tuple[int | None, str | None]:
    """(the budget, a problem) from a manifest's ``parity.shape_budget``: None with no problem when parity ran the
    full ranges (or the bundle predates the budget); a problem when the record is not what the rule gives
    (``example``: the elements of the example's set, counted from the graphs with the recorded activation terms:
    the budget's floor)."""
    from .activations import recorded_terms

    if found is None:
        return None, None
    if not isinstance(found, dict) or not isinstance(found.get("weights"), int) or isinstance(found["weights"], bool):
        return None, "parity.shape_budget is not a record of the weights and the budget; export again"
    if found.get("full") is True:
        return None, None
    terms = recorded_terms(found.get("activations", []))
    if terms is None:
        return None, "parity.shape_budget.activations is not a list of activation terms (edited); export again"
    rule = budget_for(found["weights"], example() if example is not None else 0)
    if found.get("elements") != rule:
        return None, (f"parity.shape_budget.elements {str(found.get('elements'))[:20]} is not the budget of "
                      f"{found['weights']} weight elements ({rule}); export again")
    return found["elements"], None


def shape_elements(shapes: list[list[Any]], dims: Callable[[Any, Point], int | None]) -> Elements:
    """``point -> elements`` of tensors whose dims ``dims(dim, point)`` sizes (a dimension's size less or more
    its offset; None: not a dim it knows, counted as 1)."""

    def count(point: Point) -> int:
        total = 0
        for shape in shapes:  # past CEILING the count stops: a hostile manifest's huge dims stay cheap
            n = 1
            for d in shape:
                n *= max(1, dims(d, point) or 1)
                if n > CEILING:
                    break
            total += n
            if total > CEILING:
                return CEILING + 1
        return total

    return count


def dim_size(dim: Any, point: Point) -> int | None:
    """A graph dim's size at ``point``: an int as is, ``NAME`` / ``NAME + k`` from the point, else None."""
    if isinstance(dim, int) and not isinstance(dim, bool):
        return dim
    if not isinstance(dim, str):
        return None
    import re

    base, _, plus = dim.partition(" + ")
    if base not in point or (plus and not re.fullmatch(r"[0-9]{1,9}", plus)):
        return None
    return point[base] + int(plus or 0)


def fed(own: Elements, sources: list[tuple[Elements, Point]]) -> Elements:
    """``point -> elements`` of a set with what makes it: the component's own inputs and outputs, plus each earlier
    component run eagerly to feed it (decode's past at P tokens is prefill at P tokens: ``past_X`` of the consumer
    is the source's ``X``, else the same name, else the source's example size), itself counted the same way."""

    def count(point: Point) -> int:
        total = own(point)
        for elements, example in sources:
            total += elements({n: point.get(f"past_{n}", point.get(n, size)) for n, size in example.items()})
        return total

    return count
