"""The sizes a user's ATC gear hint builds, per dimension name: ``dynamic_batch_size=1,2,4,8`` gives the batch
dimension those gears; ``dynamic_dims="1,64;4,128"`` gives each -1 of ``--input_shape`` (in order) the values
of its column, so each dimension the distinct values across the profiles. Parity runs at these sizes, not at
the axes' own range, since they are what ATC compiles."""
from __future__ import annotations

from typing import Any

from ..dynamic import MAX_GEARS


def _values(text: Any) -> list[list[int]] | None:
    if isinstance(text, (list, tuple)):
        text = ",".join(map(str, text))
    try:
        return [[int(v) for v in profile.split(",")] for profile in str(text).replace(" ", "").split(";")]
    except ValueError:
        return None


def hint_sizes(hints: dict[str, Any], slots: list[tuple[str, int]],
               batch_names: tuple[str, ...] = ()) -> dict[str, list[int]]:
    """``{dimension: sizes}`` from the gear hint in ``hints`` (none: {}). ``slots``: the (dimension, offset) of
    each -1 in --input_shape in order (an axis ``offset`` longer than its dimension: its value less offset);
    ``batch_names``: the dimensions on axis 0 that ``dynamic_batch_size`` sets. A hint that does not fit the
    slots (a profile of another length) or past ATC's MAX_GEARS gears gives nothing here: the lint names it (and a
    hostile manifest's million gears never become a million parity shapes)."""
    if "dynamic_batch_size" in hints:
        rows = _values(hints["dynamic_batch_size"])
        gears = sorted(set(rows[0])) if rows and len(rows) == 1 and len(rows[0]) <= MAX_GEARS else []
        return {name: gears for name in batch_names} if gears else {}
    if "dynamic_dims" not in hints or not slots:
        return {}
    rows = _values(hints["dynamic_dims"])
    if not rows or len(rows) > MAX_GEARS or any(len(row) != len(slots) for row in rows):
        return {}
    out: dict[str, set[int]] = {}
    for row in rows:
        for (name, offset), value in zip(slots, row, strict=True):
            if value - offset >= 1:
                out.setdefault(name, set()).add(value - offset)
    return {name: sorted(values) for name, values in out.items()}


def axes_hint_sizes(axes: list[Any], hints: dict[str, Any]) -> dict[str, list[int]]:
    """hint_sizes for a single graph's dynamic axes (DynamicAxis, in the graph's input order: its -1s)."""
    return hint_sizes(hints or {}, [(a.name, 0) for a in axes],
                      tuple(dict.fromkeys(a.name for a in axes if a.axis == 0)))
