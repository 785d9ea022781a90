"""What a torch.export program says about how it is called: the inputs it takes by keyword, and the dynamic
dimensions (``torch.export.Dim``) of its user inputs with their ranges."""
from __future__ import annotations

from typing import Any

from .calling import program_keywords

UNBOUNDED = 1 << 62  # sympy's int_oo and anything past it: no upper bound was given


def program_extras(program: Any) -> dict[str, Any]:
    """``keyword_inputs`` and ``program_dims`` ({input: {axis: {"symbol", "min", "max"}}}) for LoadedModel.extras."""
    return {"keyword_inputs": program_keywords(program), "program_dims": program_dims(program)}


def program_dims(program: Any) -> dict[str, dict[int, dict[str, Any]]]:
    """The symbolic axes of the program's user inputs: the symbol, and its range from the range constraints
    (max None when unbounded)."""
    import torch

    users = set(program.graph_signature.user_inputs)
    ranges = {str(k): v for k, v in program.range_constraints.items()}
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in users:
            continue
        value = node.meta.get("val")
        for axis, dim in enumerate(getattr(value, "shape", ())):
            if not isinstance(dim, torch.SymInt):
                continue
            expr = dim.node.expr
            symbol = str(expr)
            bounds = ranges.get(symbol)
            low = _bound(getattr(bounds, "lower", 2))
            high = _bound(getattr(bounds, "upper", None))
            out.setdefault(node.name, {})[axis] = {"symbol": symbol, "min": low if low is not None else 0,
                                                    "max": high}
    return out


def _bound(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if number < UNBOUNDED else None
