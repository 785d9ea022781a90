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
from ..errors import OptionsError
from .versions import parse_cann_version

GEAR_OPTIONS = ("dynamic_batch_size", "dynamic_image_size", "dynamic_dims")


def range_cann(cann_version: str) -> bool:
    """Whether this CANN takes ``~`` ranges in --input_shape (8.0 and later)."""
    version = parse_cann_version(cann_version)
    return version is not None and version >= (8, 0)


def gears_of(a: DynamicAxis) -> list[int]:
    """An axis's gears: the ones asked, else the range's ends and the powers of two between them."""
    return a.points(gear_form=True)


def renders_gears(axes: list[DynamicAxis], cann_version: str, hints: dict[str, Any]) -> bool:
    """Whether atc_form renders the axes as gears (ATC builds exactly gears_of each axis): gears asked, or a
    CANN before 8; not when a user's hint gives the form."""
    if not axes or any(k in hints for k in (*GEAR_OPTIONS, "input_shape_range")):
        return False
    return any(a.gears for a in axes) or not range_cann(cann_version)


def check_profiles(axes: list[DynamicAxis], cann_version: str, hints: dict[str, Any]) -> None:
    """OptionsError when the gear form needs more than ATC's 100 --dynamic_dims profiles (the product of the
    dimensions' gear counts): ATC would refuse them, and cutting them would drop sizes the manifest claims."""
    if not renders_gears(axes, cann_version, hints):
        return
    names: dict[Any, DynamicAxis] = {}
    for a in axes:
        names.setdefault(a.name, a)
    if len(names) < 2:
        return  # one dimension: its gears, counted by the lint
    count = 1
    for a in names.values():
        count *= len(gears_of(a))
    if count > MAX_GEARS:
        shown = " x ".join(f"{n} {len(gears_of(a))} ({a.min}..{a.max})" for n, a in names.items())
        why = ("gears were asked on one axis, so every axis renders as gears" if range_cann(cann_version)
               else f"CANN {cann_version} takes no ranges")
        fix = ("give every axis a range instead (CANN >= 8 takes ranges in --input_shape)" if range_cann(cann_version)
               else "or target CANN >= 8.0 (--cann-version 8.0), which takes ranges")
        raise OptionsError(f"--dynamic: the axes render as --dynamic_dims profiles ({why}), one per combination of "
                           f"gears: {shown} = {count} profiles, past ATC's {MAX_GEARS} (E10001); give fewer gears "
                           f"(narrower ranges or explicit gear lists, e.g. batch:1,8,32), {fix}")


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
    check_profiles(axes, cann_version, hints)
    profiles = list(itertools.product(*(gears_of(first[n]) for n in names)))
    rows = [",".join(str(dict(zip(names, p, strict=True))[s]) for s in slots) for p in profiles]
    return {"form": "dynamic_dims", "input_shape": _shape(inputs, minus_one),
            "options": {"dynamic_dims": ";".join(rows), "input_format": "ND"}}
