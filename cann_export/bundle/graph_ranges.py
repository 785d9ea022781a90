"""A multi-graph bundle's dimensions narrowed by the user, and ATC hints for one component.

``--dynamic DIM=LO..HI`` (``dynamic=["batch_size=1..8"]``) narrows the dimension ``DIM`` (``batch_size``,
``sequence_length``, ``past_sequence_length``, ...) in every component that has it; ``COMPONENT:DIM=LO..HI``
(``decode:past_sequence_length=1..1024``) in that component only. A dimension is named, not an input, since one
dimension spans several inputs and graphs. The range replaces the component's ``dim_bounds``, which drive the
torch.export Dims, the ATC ranges of its convert.sh and its parity shapes (validate re-derives those from the
recorded ranges). ``DIM=G1,G2,...`` gives the dimension ATC gears instead (bundle/graph_gear_hints.py renders them as
the component's ``dynamic_batch_size`` / ``dynamic_dims`` options). ``--atc-hint COMPONENT:KEY=VALUE`` gives one
component an ATC option (the unprefixed form gives it to every component)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import OptionsError
from ..plan import KINDS, Plan

DIMENSIONS = ("batch_size", "sequence_length", "past_sequence_length", "decoder_sequence_length",
              "past_decoder_sequence_length", "encoder_sequence_length",
              "height", "width", "image_height", "image_width")  # a pipeline's latent and image sides
COMPONENTS = tuple(dict.fromkeys(n for names in KINDS.values() for n in names))
_FORM = re.compile(r"(?:(?P<comp>[a-z][a-z0-9_]{0,63}):)?(?P<dim>[A-Za-z_][A-Za-z0-9_]*)=(?P<spec>[^=]*)")
SYNTAX = ("a multi-graph bundle takes --dynamic DIM=LO..HI or DIM=G1,G2,... (ATC gears; every graph with that "
          "dimension) or COMPONENT:DIM=... (one graph), e.g. --dynamic batch_size=1..8 --dynamic "
          "sequence_length=1..512 --dynamic decode:past_sequence_length=1..1024 --dynamic batch_size=1,2,4,8; "
          "dimensions: " + ", ".join(DIMENSIONS))


@dataclass(frozen=True)
class DimRange:
    component: str | None
    dim: str
    low: int
    high: int
    gears: tuple[int, ...] = ()  # DIM=G1,G2,...: what ATC builds (low, high: the first and last)

    @property
    def text(self) -> str:
        spec = ",".join(map(str, self.gears)) if self.gears else f"{self.low}..{self.high}"
        return f"{self.component + ':' if self.component else ''}{self.dim}={spec}"


def parse_ranges(values: Any) -> list[DimRange]:
    """``--dynamic`` values of a multi-graph export -> DimRange (OptionsError naming the flag: checked before any
    model is loaded)."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, (list, tuple)):
        raise OptionsError(f"--dynamic {values!r}: {SYNTAX}")
    out: list[DimRange] = []
    for value in values:
        m = _FORM.fullmatch(value.replace(" ", "")) if isinstance(value, str) else None
        if m is None or m["dim"].isdigit():
            raise OptionsError(f"--dynamic {value!r} does not name a dimension; {SYNTAX}")
        comp, dim, spec = m["comp"], m["dim"], m["spec"]
        if comp is not None and comp not in COMPONENTS:
            raise OptionsError(f"--dynamic {value!r}: no component is called {comp!r}; the components are "
                               f"{', '.join(COMPONENTS)}")
        if dim not in DIMENSIONS:
            raise OptionsError(f"--dynamic {value!r}: {dim!r} is not a dimension of a multi-graph bundle; {SYNTAX}")
        found = _spec(value, comp, dim, spec)
        if any((r.component, r.dim) == (comp, dim) for r in out):
            raise OptionsError(f"--dynamic names {found.text.split('=')[0]} twice; give each dimension once")
        out.append(found)
    return out


def _spec(value: str, comp: str | None, dim: str, spec: str) -> DimRange:
    """``LO..HI`` or ``G1,G2,...`` (2..100 distinct gears, as ATC takes) of one ``--dynamic`` value."""
    from ..dynamic import MAX_GEARS, MIN_GEARS

    if "," in spec:
        if not all(g.isdigit() for g in spec.split(",")):
            raise OptionsError(f"--dynamic {value!r}: {spec!r} is not a list of gears G1,G2,... (positive sizes); "
                               f"{SYNTAX}")
        gears = tuple(sorted({int(g) for g in spec.split(",")}))
        if not MIN_GEARS <= len(gears) <= MAX_GEARS or gears[0] < 1:
            raise OptionsError(f"--dynamic {value!r}: {len(gears)} distinct gear(s); ATC takes {MIN_GEARS}.."
                               f"{MAX_GEARS} gears of sizes >= 1 (E10001), e.g. batch_size=1,2,4,8")
        return DimRange(comp, dim, gears[0], gears[-1], gears)
    lo, dots, hi = spec.partition("..")
    if not dots or not lo.isdigit() or not hi.isdigit():
        raise OptionsError(f"--dynamic {value!r}: {spec!r} is neither a range LO..HI nor gears G1,G2,...; {SYNTAX}")
    low, high = int(lo), int(hi)
    if not 1 <= low <= high:
        raise OptionsError(f"--dynamic {value!r}: the range {low}..{high} is empty or inverted; write LO..HI "
                           "with 1 <= LO <= HI, e.g. batch_size=1..8")
    return DimRange(comp, dim, low, high)


def narrow(plan: Plan, ranges: list[DimRange]) -> None:
    """Set each component's ``dim_bounds`` to the user's ranges: a named component must be in the plan and have
    the dimension, a dimension must be in some component, and a range must lie inside the model's own limits
    (batch 1..64, the position table) and hold the example's size (the graphs are captured at it)."""
    from .graph_shapes import dims

    names = [c.name for c in plan.components]
    for r in ranges:
        if r.component is not None and r.component not in names:
            raise OptionsError(f"--dynamic {r.text}: this bundle ({plan.kind}) has no component {r.component!r}; "
                               f"its components are {', '.join(names)}")
        hit = [c for c in plan.components if r.component in (None, c.name)
               and r.dim in dims(c.module, c.example_inputs)]
        if not hit:
            where = f"component {r.component!r}" if r.component else f"this bundle ({plan.kind})"
            have = sorted({d for c in plan.components if r.component in (None, c.name)
                           for d in dims(c.module, c.example_inputs)})
            raise OptionsError(f"--dynamic {r.text}: {where} has no dynamic dimension {r.dim!r}; its dimensions "
                               f"are {', '.join(have) or 'none (every shape is fixed)'}")
        for comp in hit:
            example, low, high = dims(comp.module, comp.example_inputs)[r.dim]
            if not low <= r.low <= r.high <= high:
                raise OptionsError(f"--dynamic {r.text}: {comp.name}'s {r.dim} ranges over {low}..{high} at most "
                                   "(batch: 64; a length: the model's position table); give a range inside it")
            if not r.low <= example <= r.high or (r.gears and example not in r.gears):
                fix = f"add the gear {example}" if r.gears else f"give LO <= {example} <= HI"
                raise OptionsError(f"--dynamic {r.text}: {comp.name} is captured at {r.dim} {example} (its example "
                                   f"input), which the {'gears' if r.gears else 'range'} must hold; {fix}")
    for r in sorted(ranges, key=lambda r: r.component is not None):  # a component's own range wins
        for comp in plan.components:
            if r.component in (None, comp.name) and r.dim in comp.module.dim_bounds:
                comp.module.dim_bounds[r.dim] = (r.low, r.high)


def split_hints(hints: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``--atc-hint`` values -> (those for every component, ``{component: its own}``); a prefix that names no
    component is refused before any work."""
    from ..hooks.manager import registry

    known = registry().atc_hints()
    common: dict[str, Any] = {}
    own: dict[str, dict[str, Any]] = {}
    for key, value in (hints or {}).items():
        comp, sep, name = str(key).partition(":")
        if not sep:
            common[key] = value
            continue
        if comp in COMPONENTS and name not in known:
            raise OptionsError(f"--atc-hint {key}={value}: unknown ATC hint {name!r}; known hints: "
                               f"{', '.join(sorted(known))}")
        if comp not in COMPONENTS or not name:
            raise OptionsError(f"--atc-hint {key}={value}: {comp!r} is not a component of a multi-graph bundle; "
                               f"write COMPONENT:KEY=VALUE with a component of {', '.join(COMPONENTS)}, or "
                               "KEY=VALUE for every component")
        own.setdefault(comp, {})[name] = value
    return common, own


def check_known_components(task: str | None, dynamic: Any, hints: dict[str, Any] | None) -> None:
    """Before the load: ``COMPONENT:`` prefixes of --dynamic / --atc-hint name components of the bundle ``task``
    exports (a decoder's prefill and decode, an encoder-decoder's encoder, decoder and, with past, decoder_with_past);
    with no task known, ``narrow`` / ``component_hints`` check them against the plan."""
    from ..hf.graph_plans import DECODER_TASKS, SEQ2SEQ_TASKS

    if task in DECODER_TASKS:
        names = KINDS["decoder-with-past"]
    elif task in SEQ2SEQ_TASKS:
        names = KINDS["encoder-decoder-with-past" if task.endswith("-with-past") else "encoder-decoder"]
    else:
        return
    asked = [(f"--dynamic {r.text}", r.component) for r in parse_ranges(dynamic) if r.component]
    asked += [(f"--atc-hint {k}", str(k).partition(":")[0]) for k in (hints or {}) if ":" in str(k)]
    for flag, comp in asked:
        if comp not in names:
            raise OptionsError(f"{flag}: a {task} export has no component {comp!r}; its components are "
                               f"{', '.join(names)}")


def component_hints(plan: Plan, hints: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Each component's ATC hints: the common ones, then its own (which win)."""
    common, own = split_hints(hints)
    names = [c.name for c in plan.components]
    for comp in own:
        if comp not in names:
            raise OptionsError(f"--atc-hint {comp}:...: this bundle ({plan.kind}) has no component {comp!r}; its "
                               f"components are {', '.join(names)}")
    return {n: {**common, **own.get(n, {})} for n in names}
