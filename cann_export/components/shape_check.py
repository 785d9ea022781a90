"""validate's check of a multi-graph component's ``parity.shapes``: exactly its example's shape and the points
its graph's symbolic dimensions and recorded ATC ranges build (components/gears.py, re-derived from the bundle,
never from the module that wrote it): a range widened after parity ran is refused, as for a single graph."""
from __future__ import annotations

import re
from typing import Any

from .gears import points_of, split

_DIGITS = re.compile(r"[0-9]{1,9}")


def _ranges(hints: dict[str, Any]) -> dict[str, list[str]] | None:
    """``{input: [dim text]}`` of the ATC ranges a component's convert.sh passes (``input_shape`` on CANN 8,
    ``input_shape_range`` before), None when it passes none (a user's gear hint gives the form)."""
    text = hints.get("input_shape") or hints.get("input_shape_range")
    if not isinstance(text, str) or "~" not in text:
        return None
    out = {}
    for part in text.split(";"):
        name, _, dims = part.rpartition(":")
        out[name] = dims.strip("[]").split(",")
    return out


def component_shape_problems(name: str, own: dict[str, Any]) -> list[str]:
    """The differences between a component's recorded parity shapes and the ones its graph and ranges build."""
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
        cells = ranges.get(value["name"]) or []
        for axis, dim in enumerate(value.get("shape") or []):
            if not isinstance(dim, str):
                if axis < len(cells) and cells[axis] != str(dim):  # T5's decoder once had 1~4096 on a fixed 1
                    return [f"{where}: {value['name']}:{axis} is fixed at {dim} in the graph, but its ATC command "
                            f"declares {cells[axis]}; export again"]
                continue
            base, plus = split(dim)
            low, _, high = (cells[axis] if axis < len(cells) else "").partition("~")
            if not (_DIGITS.fullmatch(low) and _DIGITS.fullmatch(high)) or not isinstance(example.get(base), int):
                return [f"{where}: {value['name']}:{axis} ({dim}) has no ATC range or no example size; export again"]
            order.append((base, plus))
            bounds = (example[base], int(low) - plus, int(high) - plus)
            if found.setdefault(base, bounds) != bounds:
                return [f"{where}: {value['name']}:{axis} ({dim}) has the ATC range {low}~{high}, another input's "
                        f"{base} has {found[base][1] + plus}~{found[base][2] + plus}; export again"]
    if set(example) != set(found):
        return [f"{where}: the first shape {example} is not the example's size of each dimension {sorted(found)}"]
    _, points, _ = points_of(found, order, (own.get("atc") or {}).get("hints"))
    if shapes != [example, *points]:
        return [f"{where}: parity ran at {shapes}, but the graph's ATC ranges build {[example, *points]}; a range "
                "changed after parity ran: export again"]
    return []
