"""The ATC form of a graph's dynamic axes, for the target CANN release.

From the ATC guide's option pages (CANN 8.0.0 "ATC Instructions", atlasatcparam_16_00xx):
- ``--input_shape``: "If the shape is a range, use ~ to separate the lower and upper bounds, e.g.
  input_name1:1~16,3,224,224" on CANN >= 8, where ``--input_shape_range`` "will be deprecated in later versions";
- ``--dynamic_batch_size``: "Use this option together with --input_shape ... Only the scenario where N is in the
  first place of the shape is supported. That is, the first place of the shape is set to -1"; "the batch size
  profile range is (1,100] ... The recommended value range for each profile is [1, 2048]";
- ``--dynamic_dims``: "Use this option in conjunction with --input_shape and --input_format [ND] ... mutually
  exclusive with --dynamic_batch_size, --dynamic_image_size, --input_shape_range, and --insert_op_conf. The
  dimension size values match the -1 placeholders in the --input_shape argument with ordering preserved, and
  the number of -1 placeholders in --input_shape equals the number of dimension sizes of each profile".
"""
from __future__ import annotations

import itertools
from typing import Any

from ..dynamic import MAX_GEARS, DynamicAxis
from .versions import parse_cann_version

GEAR_OPTIONS = ("dynamic_batch_size", "dynamic_image_size", "dynamic_dims")


def range_cann(cann_version: str) -> bool:
    """Whether this CANN takes ``~`` ranges in --input_shape (8.0 and later)."""
    version = parse_cann_version(cann_version)
    return version is not None and version >= (8, 0)


def gears_of(a: DynamicAxis) -> list[int]:
    """An axis's gears: the ones asked, else the range's ends and the powers of two between them."""
    if a.gears:
        return list(a.gears)
    low, high = int(a.min or 1), int(a.max or a.min or 1)
    inner = [1 << k for k in range(1, 12) if low < (1 << k) < high]
    return sorted({low, *inner, high})


def dims_of(model: Any) -> list[tuple[str, list[int | str]]]:
    """(input, [size, or the symbolic dim's name]) of the graph's inputs, in order (initializers left out)."""
    initializers = {i.name for i in model.graph.initializer}
    out = []
    for v in model.graph.input:
        if v.name in initializers or not v.type.HasField("tensor_type"):
            continue
        out.append((v.name, [d.dim_param or (d.dim_value if d.dim_value > 0 else -1)
                             for d in v.type.tensor_type.shape.dim]))
    return out


def _shape(inputs: list[tuple[str, list[Any]]], cell: Any) -> str:
    return ";".join(f"{name}:{','.join(str(cell(name, axis, d)) for axis, d in enumerate(dims))}"
                    for name, dims in inputs)


def atc_form(model: Any, axes: list[DynamicAxis], cann_version: str, hints: dict[str, Any]) -> dict[str, Any]:
    """``{"input_shape": ..., "options": {name: value}, "form": ...}``: what convert.sh passes for the graph's
    inputs. A user's gear hint (dynamic_batch_size, dynamic_image_size, dynamic_dims) gets -1 where it
    applies; otherwise the axes give ranges (CANN >= 8 without gears) or gears (older CANN, or gears asked)."""
    inputs = dims_of(model)
    by_pos = {(a.input, a.axis): a for a in axes}

    def static(name: str, axis: int, d: Any) -> Any:
        return d if isinstance(d, int) and d > 0 else -1

    if "dynamic_batch_size" in hints:
        return {"form": "hint", "options": {},
                "input_shape": _shape(inputs, lambda n, axis, d: -1 if axis == 0 else static(n, axis, d))}
    if "dynamic_image_size" in hints:
        return {"form": "hint", "options": {}, "input_shape": _shape(
            inputs, lambda n, axis, d: -1 if len(dict(inputs)[n]) == 4 and axis in (2, 3) else static(n, axis, d))}
    if "dynamic_dims" in hints or "input_shape_range" in hints or not axes:
        return {"form": "hint" if axes or hints else "static", "options": {},
                "input_shape": _shape(inputs, static)}
    gears_asked = any(a.gears for a in axes)
    if range_cann(cann_version) and not gears_asked:
        def ranged(name: str, axis: int, d: Any) -> Any:
            a = by_pos.get((name, axis))
            return f"{a.min}~{a.max}" if a is not None else static(name, axis, d)

        return {"form": "range", "options": {}, "input_shape": _shape(inputs, ranged)}

    def minus_one(name: str, axis: int, d: Any) -> Any:
        return -1 if (name, axis) in by_pos else static(name, axis, d)

    names = list(dict.fromkeys(a.name for a in axes))
    if all(a.axis == 0 for a in axes) and len(names) == 1:
        batch = next(a for a in axes)
        return {"form": "dynamic_batch_size", "input_shape": _shape(inputs, minus_one),
                "options": {"dynamic_batch_size": ",".join(map(str, gears_of(batch)))}}
    slots = [by_pos[(name, axis)].name for name, dims in inputs for axis in range(len(dims)) if (name, axis) in by_pos]
    first = {a.name: a for a in reversed(axes)}
    profiles = list(itertools.islice(itertools.product(*(gears_of(first[n]) for n in names)), MAX_GEARS))
    rows = [",".join(str(dict(zip(names, p, strict=True))[s]) for s in slots) for p in profiles]
    return {"form": "dynamic_dims", "input_shape": _shape(inputs, minus_one),
            "options": {"dynamic_dims": ";".join(rows), "input_format": "ND"}}
