"""Dynamic axes, the user's vocabulary: ``--dynamic NAME:AXIS=[DIM][:LO..HI | :G1,G2,...],...`` (``dynamic=`` in
Python), checked before any heavy work. An axis is a range (``seq:8..64``) or gears (``batch:1,2,4,8``: the
sizes ATC builds profiles for); the model's inputs are checked against them in the prepare stage
(inputs/dynamic_axes.py)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import OptionsError

FLAG = "--dynamic"
SYNTAX = ("write it as NAME:AXIS=[DIM][:LO..HI|:G1,G2,...][,AXIS=...], e.g. --dynamic input_ids:0=batch:1..16,"
          "1=seq:1..512 or --dynamic x:0=batch:1,2,4,8, or by dimension name as DIM=LO..HI|G1,G2,... (every axis of "
          "that name), e.g. --dynamic batch_size=1..8")
# ATC's own limits on gears (ATC guide, "--dynamic_batch_size": "the number of gears ranges over [2,100]" and
# "each value ranges over [1,2048]"; --dynamic_dims: "2 to 100 gears"); a range's max is bounded likewise.
MIN_GEARS, MAX_GEARS = 2, 100
MAX_BATCH = 2048
MAX_DIM = 1 << 20
MAX_INPUT_ELEMENTS = 1 << 28  # one --input-shape's example tensor: 1 GiB of float32
DEFAULT_BATCH_MAX = 16  # axis 0 with no range given (-1 in --input-shape, a loader's axis): parity runs at its end
DEFAULT_FACTOR = 4  # another axis with no range: 1 .. 4 x the example's size
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BY_NAME = re.compile(r"(?P<dim>[A-Za-z_][A-Za-z0-9_]*)=(?P<spec>[^:=]+)")
BY_NAME_AXIS = -1  # DynamicAxis.axis of a by-name axis (input "")


@dataclass(frozen=True)
class DynamicAxis:
    """One dynamic dimension: ``input``'s ``axis``, the symbolic ONNX dim ``name``, its range and, when asked,
    the gears ATC builds (then ``min``/``max`` are the gears' ends). ``min``/``max`` None: the default range,
    decided from the example in the prepare stage. ``source``: where it came from (--dynamic, --input-shape,
    program, loader)."""

    input: str
    axis: int
    name: str | None = None
    min: int | None = None
    max: int | None = None
    gears: tuple[int, ...] = ()
    source: str = FLAG
    note: str | None = field(default=None, compare=False)

    @property
    def by_name(self) -> bool:
        """``--dynamic DIM=LO..HI``: every axis named DIM, whichever input (resolved in the prepare stage)."""
        return self.input == "" and self.axis == BY_NAME_AXIS

    def points(self, gear_form: bool = False) -> list[int]:
        """The sizes parity runs at: the sizes ATC builds. Every gear asked; a range rendered as gears
        (``gear_form``: CANN < 8, or gears asked on another axis) its ends and the powers of two between them
        (atc/dynamic_form.gears_of); a ``~`` range its ends and middle."""
        if self.gears:
            return list(self.gears)
        lo, hi = int(self.min or 1), int(self.max or self.min or 1)
        if gear_form:
            return range_gears(lo, hi)
        return sorted({lo, (lo + hi) // 2, hi})

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"input": self.input, "axis": self.axis, "name": self.name, "min": self.min,
                               "max": self.max, "source": self.source}
        if self.gears:
            out["gears"] = list(self.gears)
        if self.note:
            out["note"] = self.note
        return out


def range_gears(low: int, high: int) -> list[int]:
    """A range as ATC gears: its ends and the powers of two between."""
    return sorted({low, *(1 << k for k in range(1, 12) if low < (1 << k) < high), high})


def parse_dynamic(text: str, flag: str = FLAG) -> list[DynamicAxis]:
    """``NAME:AXIS=[DIM][:SPEC],AXIS=...`` -> one DynamicAxis per axis (OptionsError naming ``flag``)."""
    if not isinstance(text, str):
        raise OptionsError(f"{flag} {text!r} is not text; {SYNTAX}")
    named = parse_by_name(text, flag)
    if named is not None:
        return [named]
    name, sep, rest = text.strip().partition(":")
    if not sep or not name.strip() or not rest.strip():
        raise OptionsError(f"{flag} {text!r} does not parse; {SYNTAX}")
    out = []
    for part in re.split(r",(?=\s*-?\d+\s*=)", rest):
        axis_text, eq, spec = part.partition("=")
        try:
            axis = int(axis_text.strip())
        except ValueError:
            raise OptionsError(f"{flag} {text!r}: {axis_text.strip()!r} is not an axis number; {SYNTAX}") from None
        if not eq or axis < 0:
            raise OptionsError(f"{flag} {text!r}: axis {axis_text.strip()!r} needs '=' and a number >= 0; {SYNTAX}")
        out.append(_axis(name.strip(), axis, spec.strip(), text, flag))
    seen = set()
    for a in out:
        if a.axis in seen:
            raise OptionsError(f"{flag} {text!r} names axis {a.axis} twice; give each axis once")
        seen.add(a.axis)
    return out


def parse_by_name(text: str, flag: str = FLAG) -> DynamicAxis | None:
    """``DIM=LO..HI`` or ``DIM=G1,G2,...`` (the form a multi-graph bundle takes) as a by-name axis, or None for
    text of another form. A name with "batch" in it is held to ATC's batch limits."""
    m = _BY_NAME.fullmatch(text.replace(" ", ""))
    if m is None:
        return None
    axis = _axis("", 0 if "batch" in m["dim"] else 1, f"{m['dim']}:{m['spec']}", text, flag)
    return replace(axis, axis=BY_NAME_AXIS)


def _axis(input_name: str, axis: int, spec: str, text: str, flag: str) -> DynamicAxis:
    dim_name, sep, values = spec.partition(":")
    if not sep and not _NAME.fullmatch(dim_name or "_"):  # "0=1..16" / "0=1,2,4": no name
        dim_name, values = "", spec
    if dim_name and not _NAME.fullmatch(dim_name):
        raise OptionsError(f"{flag} {text!r}: dimension name {dim_name!r} must be an identifier (batch, seq); "
                           f"{SYNTAX}")
    where = f"{flag} {text!r}: axis {axis}"
    values = values.replace(" ", "")
    low = high = None
    gears: tuple[int, ...] = ()
    if values:
        if ".." in values:
            lo_text, _, hi_text = values.partition("..")
            low, high = _int(lo_text, where), _int(hi_text, where)
            if low < 1 or high < low:
                raise OptionsError(f"{where}: range {values} is empty or inverted; write LO..HI with 1 <= LO <= HI, "
                                   f"e.g. 1..16")
            if high > MAX_DIM:
                raise OptionsError(f"{where}: range {values} is past {MAX_DIM}; give a realistic upper bound")
        else:
            gears = tuple(_int(v, where) for v in values.split(","))
            check_gears(gears, where, batch=axis == 0)
            low, high = min(gears), max(gears)
    return DynamicAxis(input_name, axis, dim_name or None, low, high, gears)


def _int(text: str, where: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise OptionsError(f"{where}: {text!r} is not an integer; {SYNTAX}") from None


def check_gears(gears: tuple[int, ...], where: str, batch: bool) -> None:
    """Gears ATC would take: 2..100 distinct positive values (1..2048 for a batch axis)."""
    if len(set(gears)) != len(gears):
        raise OptionsError(f"{where}: gears {','.join(map(str, gears))} repeat a value; give each size once")
    if not MIN_GEARS <= len(gears) <= MAX_GEARS:
        raise OptionsError(f"{where}: {len(gears)} gear(s); ATC takes {MIN_GEARS}..{MAX_GEARS} gears (E10001); "
                           "give at least two sizes, e.g. 1,2,4,8, or a range LO..HI")
    top = MAX_BATCH if batch else MAX_DIM
    bad = [g for g in gears if not 1 <= g <= top]
    if bad:
        raise OptionsError(f"{where}: gear {bad[0]} is outside 1..{top}" + (" (ATC's batch limit, E10001)" if batch
                           else "") + "; give sizes in that range")


def as_axes(value: Any) -> list[DynamicAxis]:
    """``dynamic=`` in Python: a --dynamic string, a list of them / of DynamicAxis, or a dict
    ``{input: {axis: "dim:LO..HI" | "dim" | (lo, hi)}}`` (Optimum's ``{input: {axis: name}}`` included)."""
    if value is None:
        return []
    if isinstance(value, str):
        return parse_dynamic(value)
    if isinstance(value, DynamicAxis):
        return [value]
    if isinstance(value, dict):
        out = []
        for name, axes in value.items():
            if not isinstance(axes, dict) or not axes:
                raise OptionsError(f"dynamic={{{name!r}: {axes!r}}}: give a dict of axis -> 'dim:LO..HI'")
            parts = []
            for axis, spec in axes.items():
                if isinstance(spec, (tuple, list)) and len(spec) == 2:
                    spec = f"{spec[0]}..{spec[1]}"
                parts.append(f"{axis}={spec}")
            out.extend(parse_dynamic(f"{name}:{','.join(parts)}", "dynamic="))
        return out
    if isinstance(value, (list, tuple)):
        return [a for item in value for a in as_axes(item)]
    raise OptionsError(f"dynamic={value!r} is not a --dynamic string, a list of them or a dict; {SYNTAX}")


def check_unique(axes: list[DynamicAxis]) -> None:
    seen: set[tuple[str, Any]] = set()
    for a in axes:
        key = ("", a.name) if a.by_name else (a.input, a.axis)
        if key in seen:
            what = f"dimension {a.name}" if a.by_name else f"{a.input}:{a.axis}"
            raise OptionsError(f"{FLAG} names {what} twice; give each input's axis (or dimension name) once")
        seen.add(key)


def from_records(records: Any, where: str = "manifest atc.dynamic.axes") -> list[DynamicAxis]:
    """Axes from their ``to_dict()`` records (a manifest: untrusted), each re-checked as ``--dynamic`` is."""
    if not isinstance(records, list) or len(records) > 256:
        raise OptionsError(f"{where} is not a list of axis records")
    out = []
    for r in records:
        if not isinstance(r, dict) or not isinstance(r.get("input"), str) or not isinstance(r.get("name"), str):
            raise OptionsError(f"{where}: {str(r)[:120]} is not an axis record")
        gears = r.get("gears")
        spec = ",".join(map(str, gears)) if isinstance(gears, list) else f"{r.get('min')}..{r.get('max')}"
        (axis,) = parse_dynamic(f"{r['input']}:{r.get('axis')}={r['name']}:{spec}", where)
        source = r.get("source")
        out.append(replace(axis, source=source if isinstance(source, str) else "manifest"))
    return out


def check_static_shape(spec: Any, shown: str) -> None:
    """An --input-shape (options.InputSpec) the example tensor can be made from: each dimension in 1..MAX_DIM (the
    bound a --dynamic range has) or -1, and the example at most MAX_INPUT_ELEMENTS; refused before torch allocates."""
    import math

    shape = spec.shape
    if (not isinstance(shape, (tuple, list)) or not shape
            or not all(type(d) is int and (d == -1 or 1 <= d <= MAX_DIM) for d in shape)):
        raise OptionsError(f"{shown}: every dimension must be an integer in 1..{MAX_DIM} (the bound --dynamic "
                           "ranges have) or -1; give the shape of one real input, e.g. pixel_values:1,3,224,224")
    elements = math.prod(spec.example_shape)
    if elements > MAX_INPUT_ELEMENTS:
        raise OptionsError(f"{shown}: the example tensor would hold {elements} elements, more than "
                           f"{MAX_INPUT_ELEMENTS} (1 GiB of float32); give the shape of one real input")
