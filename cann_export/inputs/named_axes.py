"""Two rules of the prepare stage's dynamic axes (inputs/dynamic_axes.py) on what the user asked by name or as gears:

- ``--dynamic DIM=LO..HI`` / ``DIM=G1,G2,...`` (the form a multi-graph bundle takes) gives every axis named DIM
  (a loader's ``batch_size``, a .pt2's ``batch``, ``INPUT_dimN``) that range or those gears;
- an axis the tool made dynamic by default takes what the user gave another axis of its name;
- gears asked on some dimensions leave the axes the tool made dynamic by default (a loader's task axes, the batch of
  the recorded calls) static at the example's size, with a warning: ATC builds gears with every other dimension
  static (``--dynamic_batch_size``) or enumerated in the same profiles (``--dynamic_dims``), and enumerating a
  dimension nobody asked for multiplies the profiles behind the user's back."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from .. import errors
from ..dynamic import FLAG, DynamicAxis

DEFAULTED = ("loader", "recorded calls")  # sources of axes the tool chose, not the user or the model's program


def default_name(a: DynamicAxis) -> str:
    """The name an axis gets when none was given (inputs/dynamic_axes._complete)."""
    return a.name or ("batch" if a.axis == 0 else f"{a.input}_dim{a.axis}")


def apply_by_name(named: list[DynamicAxis], found: dict[tuple[str, int], DynamicAxis]) -> list[DynamicAxis]:
    """The by-name axes' ranges or gears on every axis of ``found`` of that name; returns the axes they set (for
    the same checks as an axis asked by input). OptionsError for a name no dynamic axis has."""
    changed = []
    for n in named:
        hits = [key for key, a in found.items() if default_name(a) == n.name]
        if not hits:
            have = ", ".join(sorted({default_name(a) for a in found.values()})) or "none (every shape is static)"
            raise errors.OptionsError(f"{FLAG} {n.name}=...: no dynamic dimension of this model is named {n.name!r}; "
                                      f"its dynamic dimensions are {have}. Name one of those, or give an input's axis "
                                      f"as {FLAG} INPUT:AXIS={n.name}:LO..HI")
        for key in hits:
            found[key] = replace(found[key], name=n.name, min=n.min, max=n.max, gears=n.gears, source=FLAG)
            changed.append(found[key])
    return changed


def follow_asked(found: dict[tuple[str, int], DynamicAxis]) -> None:
    """An axis the tool made dynamic by default takes the range and gears the user gave another axis of its name
    (``input_ids:0=batch_size:1,2,4`` sets ``attention_mask``'s ``batch_size`` too): one name is one size."""
    asked = {a.name: a for a in found.values() if a.source == FLAG and a.name}
    for key, a in found.items():
        user = asked.get(a.name)
        if user is not None and a.source in DEFAULTED:
            found[key] = replace(a, min=user.min, max=user.max, gears=user.gears, source=f"{FLAG} (as {user.input})")


def fix_unasked(found: dict[tuple[str, int], DynamicAxis], feed: dict[str, Any], ctx: Any) -> None:
    """Gears asked: the axes the tool made dynamic by default, of other names, become static at the example's
    size, each named in ``warnings.dynamic``."""
    geared = sorted({a.name for a in found.values() if a.gears and a.name})
    if not geared:
        return
    fixed: dict[str, list[DynamicAxis]] = {}
    for key in [key for key, a in found.items() if a.source in DEFAULTED and not a.gears and a.name not in geared]:
        a = found.pop(key)
        fixed.setdefault(default_name(a), []).append(a)
    notes = []
    for name, axes in fixed.items():
        first = axes[0]
        size = int(feed[first.input].shape[first.axis]) if first.input in feed else None
        where = ", ".join(f"{a.input}:{a.axis}" for a in axes)
        notes.append(f"{name} ({where}) is exported static at {size}, the example's size: gears were asked for "
                     f"{', '.join(geared)}, and ATC builds gears with every other dimension static; give it gears "
                     f"too ({FLAG} {name}=G1,G2,...) to keep it dynamic")
    if notes:
        ctx.reports.warnings.dynamic = [*(ctx.reports.warnings.dynamic or []), *notes]
