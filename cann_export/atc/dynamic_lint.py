"""ATC's dynamic-shape rules, checked on the options convert.sh passes (the user's hints and the form the
graph's dynamic axes give, atc/dynamic_form.py). Each finding names the error code ATC gives.

The rules, from the ATC guide's option pages (CANN 8.0.0, "--dynamic_batch_size" atlasatcparam_16_0018,
"--dynamic_dims" atlasatcparam_16_0020, "--input_shape" atlasatcparam_16_0016, "--input_shape_range"):
- a gear option needs -1 in --input_shape where it applies (batch: "the first place of the shape is set to
  -1"), and a -1 needs a gear option or a range (E10031 / E10040 / E10018, as ATC reports them);
- "the profile range is (1,100]" gears; batch values "[1, 2048]" (E10001: an invalid option value);
- dynamic_batch_size, dynamic_image_size, dynamic_dims and input_shape_range are mutually exclusive;
  dynamic_dims also with --insert_op_conf (AIPP) (E10001);
- dynamic_dims: "the number of -1 placeholders in --input_shape equals the number of dimension sizes of each
  profile" and it needs --input_format=ND (E10001);
- input_shape_range "will be deprecated in later versions": on CANN >= 8 write ranges in --input_shape.
"""
from __future__ import annotations

from typing import Any

from ..dynamic import MAX_BATCH, MAX_GEARS, MIN_GEARS
from .dynamic_form import range_cann

EXCLUSIVE = ("dynamic_batch_size", "dynamic_image_size", "dynamic_dims", "input_shape_range")


def shape_cells(text: str) -> list[tuple[str, list[str]]]:
    """``x:-1,3;y:1~8,4`` -> [("x", ["-1", "3"]), ("y", ["1~8", "4"])]."""
    out = []
    for part in str(text or "").split(";"):
        name, sep, dims = part.rpartition(":")
        if sep and name:
            out.append((name, dims.split(",")))
    return out


def check(options: dict[str, Any], cann_version: str, findings: Any) -> None:
    """Add a finding for each dynamic-shape rule ``options`` (ATC option name -> value) breaks."""
    cells = shape_cells(options.get("input_shape", ""))
    minus = [(name, axis) for name, dims in cells for axis, d in enumerate(dims) if d.strip() == "-1"]
    ranged = [(name, axis) for name, dims in cells for axis, d in enumerate(dims) if "~" in d]
    gear = [k for k in EXCLUSIVE[:3] if k in options]
    both = [k for k in EXCLUSIVE if k in options]
    if len(both) > 1:
        findings.add("error", "dynamic-exclusive",
                     f"{' and '.join('--' + k for k in both)} are mutually exclusive in ATC (E10001); keep one")
    if "dynamic_dims" in options and "aipp" in options:
        findings.add("error", "dynamic-aipp", "--dynamic_dims cannot be combined with AIPP (--insert_op_conf) in ATC "
                                              "(E10001); drop the aipp hint or use dynamic_batch_size")
    if gear and not minus:
        findings.add("error", "dynamic-minus-one",
                     f"--{gear[0]} is set but --input_shape ({options.get('input_shape')}) has no -1: ATC needs -1 "
                     "where the gears apply (the batch position for dynamic_batch_size) (E10031); put -1 there")
    if minus and not gear and "input_shape_range" not in options:
        findings.add("error", "dynamic-minus-one",
                     f"--input_shape has -1 at {', '.join(f'{n}:{a}' for n, a in minus)} but no gear option "
                     "(dynamic_batch_size / dynamic_dims / dynamic_image_size) gives its sizes (E10018); add one"
                     + (", or write a range LO~HI there (CANN >= 8)" if range_cann(cann_version) else ""))
    if ranged and not range_cann(cann_version):
        findings.add("error", "dynamic-range-version",
                     f"--input_shape has ranges (LO~HI) at {', '.join(f'{n}:{a}' for n, a in ranged)}, which ATC "
                     f"takes from CANN 8.0 on, not {cann_version} (E10001); use gears (--dynamic_batch_size / "
                     "--dynamic_dims) or target CANN >= 8.0")
    if ranged and gear:
        findings.add("error", "dynamic-exclusive",
                     f"--input_shape ranges (LO~HI) and --{gear[0]} together: ATC takes one form (E10001)")
    if "dynamic_batch_size" in options:
        values = _ints(options["dynamic_batch_size"].split(","))
        _count(values, "dynamic_batch_size", findings)
        bad = [v for v in values if not 1 <= v <= MAX_BATCH]
        if bad:
            findings.add("error", "dynamic-gear-value",
                         f"--dynamic_batch_size value {bad[0]} is outside 1..{MAX_BATCH}, ATC's batch range (E10001)")
        wrong = [(n, a) for n, a in minus if a != 0]
        if wrong:
            findings.add("error", "dynamic-minus-one",
                         f"--dynamic_batch_size applies to the first dimension only, but -1 is at "
                         f"{', '.join(f'{n}:{a}' for n, a in wrong)} (E10031); use --dynamic_dims for other axes")
    if "dynamic_dims" in options:
        profiles = [p.split(",") for p in str(options["dynamic_dims"]).split(";")]
        _count(profiles, "dynamic_dims", findings)
        off = [k for k, p in enumerate(profiles) if len(p) != len(minus)]
        if off:
            findings.add("error", "dynamic-dims-count",
                         f"--dynamic_dims profile {off[0]} ({','.join(profiles[off[0]])}) has "
                         f"{len(profiles[off[0]])} value(s) but --input_shape has {len(minus)} -1 (E10040); give one "
                         "value per -1 in every profile")
        if str(options.get("input_format", "")) != "ND":
            findings.add("error", "dynamic-dims-format",
                         "--dynamic_dims needs --input_format=ND (E10001); add --atc-hint input_format=ND")
    if "dynamic_image_size" in options:
        _count(str(options["dynamic_image_size"]).split(";"), "dynamic_image_size", findings)
    if "input_shape_range" in options and range_cann(cann_version):
        findings.add("warning", "dynamic-range-deprecated",
                     f"--input_shape_range is deprecated on CANN {cann_version}: write the ranges in --input_shape "
                     "(x:1~16,3,224,224)")


def _ints(values: list[str]) -> list[int]:
    out = []
    for v in values:
        try:
            out.append(int(v))
        except ValueError:
            out.append(-1)
    return out


def _count(gears: list[Any], option: str, findings: Any) -> None:
    if not MIN_GEARS <= len(gears) <= MAX_GEARS:
        findings.add("error", "dynamic-gear-count",
                     f"--{option} has {len(gears)} gear(s); ATC takes {MIN_GEARS}..{MAX_GEARS} (E10001)")
