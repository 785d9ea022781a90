"""ATC gears for a multi-graph component from ``--dynamic DIM=G1,G2,...`` (bundle/graph_ranges.py): the component's
ATC options as a user's gear hint gives them. ``dynamic_batch_size`` when the batch is its only dynamic
dimension; else ``input_format=ND`` and ``dynamic_dims``, one profile per combination of its dimensions' sizes with
one value per -1 of its ``--input_shape`` in order (ATC's dims gears cannot sit beside ranges, so a dimension
given a range gets the range's ends, the powers of two between and the example's size).
Parity then runs at these sizes (gears.points reads them back from the options) and validate re-derives them
from the recorded options."""
from __future__ import annotations

import itertools
from typing import Any

from ..atc.lint import DYNAMIC_HINTS
from ..dynamic import MAX_GEARS, range_gears
from ..errors import OptionsError
from .graph_shapes import dims, slots
from ..plan import Plan


def with_gears(plan: Plan, ranges: list[Any], hints: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each component's ATC hints (``component_hints``) with the gears of ``ranges`` (DimRange) rendered in."""
    geared = sorted((r for r in ranges if r.gears), key=lambda r: r.component is not None)  # a component's wins
    out = dict(hints)
    for comp in plan.components if geared else []:
        found = dims(comp.module, comp.example_inputs)
        asked = {r.dim: (r.gears, r.text) for r in geared if r.component in (None, comp.name) and r.dim in found}
        if not asked:
            continue
        own = hints.get(comp.name) or {}
        clash = [k for k in (*DYNAMIC_HINTS, "input_shape") if k in own]
        if clash:
            raise OptionsError(f"--dynamic {next(iter(asked.values()))[1]} and --atc-hint {clash[0]} both give "
                               f"component {comp.name!r} its ATC dynamic form; give one of them")
        # a range as gears, with the example's size (the graphs are captured and judged there: ATC builds it too)
        sizes = {name: list(asked[name][0]) if name in asked else sorted({*range_gears(low, high), example})
                 for name, (example, low, high) in found.items()}
        if list(found) == ["batch_size"]:
            out[comp.name] = {**own, "dynamic_batch_size": ",".join(map(str, sizes["batch_size"]))}
            continue
        names = list(found)
        profiles = [dict(zip(names, p, strict=True)) for p in itertools.product(*(sizes[n] for n in names))]
        if len(profiles) > MAX_GEARS:
            counts = " x ".join(f"{n} {len(sizes[n])}" for n in names)
            raise OptionsError(f"--dynamic {' '.join(t for _, t in asked.values())}: component {comp.name!r} would "
                               f"have {len(profiles)} dynamic_dims profiles ({counts}; a range becomes its ends and "
                               f"the powers of two between), more than the {MAX_GEARS} ATC takes (E10001); give "
                               "fewer gears, or narrower ranges to the other dimensions")
        order = slots(comp.module)
        rows = [",".join(str(p[name] + offset) for name, offset in order) for p in profiles]
        out[comp.name] = {**own, "input_format": "ND", "dynamic_dims": ";".join(rows)}
    return out

