"""Parity of a multi-graph component at its dynamic sizes, as a single graph's runs at its axes' points: each
dimension of the component (``batch_size``, ``sequence_length``, ``past_sequence_length``, ...) at its range's
ends and middle in turn, the others at the example's size, or at the gears a user's ATC hint gives
(``dynamic_batch_size``, ``dynamic_dims``). The inputs of every shape are consistent across the graphs: what one
component takes from another (decode's ``past_key_values.*``, the decoder's ``encoder_hidden_states``) is that
component's output, run eagerly at the matching size (decode's past length P is prefill's sequence length P),
and the rest follows the dimensions (an ``attention_mask`` of ``P + 1``, positions after the past)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..atc.hint_gears import hint_sizes
from ..plan import Component, Plan

MAX_POINTS = 8  # shapes per component besides the example's: parity's cost stays bounded
DRAWS = 1  # input sets per extra shape, as a single graph's (inputs/dynamic_axes.py); the example's shape keeps several
MAX_LENGTH = 1024  # a sequence dimension's largest parity size (T5's relative positions range to 4096)


def dims(module: Any, feed: dict[str, Any]) -> dict[str, tuple[int, int, int]]:
    """``{dimension: (example size, min, max)}`` of a component from its ``graph_dynamic_axes`` (``NAME + k``:
    an axis k longer than NAME) and ``dim_bounds``."""
    out: dict[str, tuple[int, int, int]] = {}
    for name in getattr(module, "graph_input_names", ()):
        for axis, label in (getattr(module, "graph_dynamic_axes", {}) or {}).get(name, {}).items():
            base, plus = split(label)
            low, high = module.dim_bounds[base]
            out.setdefault(base, (int(feed[name].shape[axis]) - plus, low, high))
    return out


def split(label: str) -> tuple[str, int]:
    base, _, plus = label.partition(" + ")
    return base, int(plus or 0)


def slots(module: Any) -> list[tuple[str, int]]:
    """The (dimension, offset) of each symbolic input dim in order: the -1s of ATC's ``--input_shape``, which a
    ``dynamic_dims`` profile gives one value each."""
    axes = getattr(module, "graph_dynamic_axes", {}) or {}
    return [split(axes[n][axis]) for n in getattr(module, "graph_input_names", ()) for axis in sorted(axes.get(n, {}))]


Point = dict[str, int]


def points(module: Any, feed: dict[str, Any], hints: dict[str, Any] | None = None, budget: int | None = None,
           elements: Any = None, combos: bool = False) -> tuple[Point, list[Point], list[str], list[dict[str, Any]]]:
    """(the example's point, the extra points parity runs at, notes on what the caps left out, the records of the
    sizes the element budget left out: inputs/parity_budget.py): each dimension at its hint gears or its range's ends
    and middle, in turn; a length past MAX_LENGTH (T5's 4096) at MAX_LENGTH."""
    return points_of(dims(module, feed), slots(module), hints, budget, elements, combos)


def points_of(found: dict[str, tuple[int, int, int]], order: list[tuple[str, int]], hints: dict[str, Any] | None,
              budget: int | None = None, elements: Any = None,
              combos: bool = False) -> tuple[Point, list[Point], list[str], list[dict[str, Any]]]:
    """``points`` from the dimensions (``dims``) and the -1 slots (``slots``): validate re-derives them from a
    component's graph, its ATC ranges and its recorded budget (``elements``: point -> the elements of one input
    set there, inputs + outputs). ``combos`` (--parity full): then every combination of the gears, or of the
    range ends, with no cap on their count."""
    from ..inputs.parity_budget import within

    example = {n: v[0] for n, v in found.items()}
    gears = hint_sizes(hints or {}, order, batch_names=("batch_size",))
    out: list[dict[str, int]] = []
    notes: list[str] = []
    left: list[dict[str, Any]] = []
    ends = {}
    for name, (_, low, high) in found.items():
        sizes = gears.get(name) or sorted({low, (low + high) // 2, high})
        ends[name] = gears.get(name) or sorted({low, min(high, MAX_LENGTH) if name != "batch_size" else high})
        if name != "batch_size" and max(sizes) > MAX_LENGTH:
            notes.append(f"{name}: parity ran up to {MAX_LENGTH}, not at {max(sizes)} (the cap on a component's "
                         "parity lengths)")
            sizes = sorted({min(size, MAX_LENGTH) for size in sizes})
        sizes, gone = within(name, sizes, example, budget, elements, bool(gears.get(name)))
        left += gone
        notes += [f"{name}={g['size']}: {g['reason']}" for g in gone]
        for size in sizes:
            point = {**example, name: size}
            if point != example and point not in out:
                out.append(point)
    if combos:
        return example, _combined(example, out, ends), notes, left
    if len(out) > MAX_POINTS:
        notes.append(f"parity ran at {MAX_POINTS} of the {len(out)} shapes (the ranges' ends first, then spread over "
                     "the rest: the cap on a component's parity shapes)")
    return example, _capped(out), notes, left


def _combined(example: Point, out: list[Point], ends: dict[str, list[int]]) -> list[Point]:
    """``out``, then every combination of ``ends`` (each dimension's gears or range ends) not among them."""
    import itertools

    for combo in itertools.product(*ends.values()):
        point = {**example, **dict(zip(ends, combo, strict=True))}
        if point != example and point not in out:
            out.append(point)
    return out


def _capped(found: list[dict[str, int]]) -> list[dict[str, int]]:
    """At most MAX_POINTS, spread over the list (its first and last kept: the ranges' ends come first)."""
    if len(found) <= MAX_POINTS:
        return found
    step = (len(found) - 1) / (MAX_POINTS - 1)
    return [found[round(k * step)] for k in range(MAX_POINTS)]


def shape_sets(plan: Plan, comp: Component, hints: dict[str, Any] | None,
               full: bool = False, combos: bool = False) -> Callable[[int], Any] | None:
    """What a component's export runs parity at besides its example (``graph_shape_sets`` on its module, read by
    the prepare stage): ``seed -> (example point, iterator of (point, [input sets]) made one point at a time,
    notes on what the caps left out, the manifest's parity.shape_budget record)``; None for a component with no
    dynamic axis. ``full``: no element budget (inputs/parity_budget.py), every range end runs; ``combos`` (--parity
    full): also every combination of the gears or range ends."""
    if not dims(comp.module, comp.example_inputs):
        return None

    def make(seed: int) -> Any:
        import torch

        from ..inputs.parity_budget import budget_for, record, weight_elements

        weights = weight_elements(comp.module)
        budget, elements, terms = None, None, []
        if not full:
            elements, terms = set_elements(plan, plan.components.index(comp), torch.Generator().manual_seed(seed + 97))
            at = {n: v[0] for n, v in dims(comp.module, comp.example_inputs).items()}
            budget = budget_for(weights, elements(at))
        example, chosen, notes, left = points(comp.module, comp.example_inputs, hints, budget, elements, combos)

        def sets_of() -> Any:
            for k, point in enumerate(chosen):
                sets = []
                for draw in range(DRAWS):
                    gen = torch.Generator().manual_seed(seed + 101 + 2 * k + draw)  # draw 0's seed as with two draws
                    sets.append(feed_at(plan, plan.components.index(comp), point, gen, draw))
                yield point, sets

        return example, sets_of(), notes, record(budget, weights, left, terms)

    from .parity_reuse import keeper

    make.keep = keeper(plan, comp)  # what a later component takes from this one's references (given_shapes)
    return make


def feed_at(plan: Plan, index: int, point: dict[str, int], gen: Any, draw: int | None = None) -> dict[str, Any]:
    """Component ``index``'s inputs at ``point``: what a connection brings from an earlier component is its
    output at the matching point (its ``X`` is the consumer's ``past_X`` when there is one, else the consumer's
    ``X``), sliced from what that component computed for draw ``draw`` (its parity references, an earlier feeding
    run) when it covers the point (bundle/parity_reuse.py), else run eagerly; the rest drawn at the point's sizes."""
    import torch

    from .parity_reuse import remember, reused

    comp = plan.components[index]
    feed: dict[str, Any] = {}
    sources: dict[str, list[tuple[str, str]]] = {}
    for src, out, dst, inp in plan.connections:
        if dst == comp.name and src != comp.name:
            sources.setdefault(src, []).append((out, inp))
    for src, pairs in sources.items():
        j = next(i for i, c in enumerate(plan.components) if c.name == src)
        own = {n: v[0] for n, v in dims(plan.components[j].module, plan.components[j].example_inputs).items()}
        if all(_fixed_by(comp, inp, own, point) for _, inp in pairs):
            continue  # the earlier graph gives none of them at this point's sizes: drawn below
        at = {n: point.get(f"past_{n}", point.get(n, size)) for n, size in own.items()}
        found = reused(plan, src, at, draw, pairs, comp.module, comp.example_inputs)
        if found is None:
            with torch.no_grad():
                outputs = plan.components[j].module(**feed_at(plan, j, at, gen))
            remember(plan, src, at, draw, outputs)  # the next set at this batch or a smaller one slices it
            found = {inp: outputs[out] for out, inp in pairs}
        for name, tensor in found.items():  # one the earlier graph gives at a size of its own is drawn instead
            shape = _shape_at(comp, name, list(tensor.shape), point)
            feed[name] = tensor if list(tensor.shape) == shape else _drawn(name, tensor, shape, point, comp.module,
                                                                           gen)
    for name in comp.module.graph_input_names:
        if name not in feed:
            shape = _shape_at(comp, name, list(comp.example_inputs[name].shape), point)
            feed[name] = _drawn(name, comp.example_inputs[name], shape, point, comp.module, gen)
    return feed


def _fixed_by(comp: Any, name: str, own: dict[str, int], point: dict[str, int]) -> bool:
    """Whether the earlier graph, whose dimensions are ``own``, gives input ``name`` at a size of its own at
    ``point``: one of the input's dynamic axes is none of that graph's dimensions (nor their ``past_``) and the point
    puts it at another size than the example's."""
    example = {n: v[0] for n, v in dims(comp.module, comp.example_inputs).items()}
    for label in (getattr(comp.module, "graph_dynamic_axes", {}) or {}).get(name, {}).values():
        base, _ = split(label)
        if base not in own and base.removeprefix("past_") not in own and point.get(base) != example.get(base):
            return True
    return False


def _shape_at(comp: Any, name: str, shape: list[int], point: dict[str, int]) -> list[int]:
    """``shape`` with each dynamic axis of input ``name`` at ``point``'s size. An earlier graph can fix what it
    gives: Whisper's encoder gives 1500 positions at its 3000-frame window whatever the decoder's
    ``encoder_sequence_length``, so a set labelled with another length must be drawn at it to run there."""
    for axis, label in (getattr(comp.module, "graph_dynamic_axes", {}) or {}).get(name, {}).items():
        base, plus = split(label)
        if base in point:
            shape[axis] = point[base] + plus
    return shape


def _drawn(name: str, example: Any, shape: list[int], point: dict[str, int], module: Any, gen: Any) -> Any:
    """An input no other graph gives: masks all ones (no row is padding), positions after the past, token ids
    across the vocabulary, floats from N(0, 1)."""
    import torch

    if example.dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(example.dtype)
    if "mask" in name or example.dtype == torch.bool:
        return torch.ones(shape, dtype=example.dtype)
    if name == "position_ids":
        start = point.get("past_sequence_length", 0)
        return (start + torch.arange(shape[-1])).expand(shape).to(example.dtype).contiguous()
    vocab = getattr(getattr(getattr(module, "model", None), "config", None), "vocab_size", None)
    high = vocab if isinstance(vocab, int) and vocab > 2 else int(example.max()) + 1
    return torch.randint(1, high, shape, generator=gen).to(example.dtype)


def set_elements(plan: Plan, index: int, gen: Any) -> tuple[Callable[[Point], int], list[dict[str, Any]]]:
    """(``point -> elements`` of component ``index``'s set with the earlier components that feed it (parity_budget.fed):
    what making and judging one set holds, the component's own activation terms: inputs/activations.py). Its own
    largest intermediate counts (parity_budget.with_activations); a feeding component's inputs and outputs do, its
    intermediates not (it runs eagerly while the set is made, long before this graph runs it)."""
    from ..inputs.parity_budget import fed, with_activations

    comp = plan.components[index]
    sources = _feeding(plan, comp, gen)
    own, terms = module_elements(plan, comp, gen)
    example = {n: v[0] for n, v in dims(comp.module, comp.example_inputs).items()}
    return with_activations(fed(own, sources), terms, example), terms


def io_elements(plan: Plan, index: int, gen: Any) -> Callable[[Point], int]:
    """``point -> elements`` of component ``index``'s inputs and outputs, with those of the components that feed it."""
    from ..inputs.parity_budget import fed

    comp = plan.components[index]
    sources = _feeding(plan, comp, gen)
    return fed(module_elements(plan, comp, gen)[0], sources)


def _feeding(plan: Plan, comp: Any, gen: Any) -> list[tuple[Callable[[Point], int], dict[str, int]]]:
    """The components that feed ``comp``: each one's ``point -> elements`` of its inputs and outputs (io_elements),
    with its example's sizes."""
    sources = []
    for src in dict.fromkeys(s for s, _, d, _ in plan.connections if d == comp.name and s != comp.name):
        j = next(i for i, c in enumerate(plan.components) if c.name == src)
        example = {n: v[0] for n, v in dims(plan.components[j].module, plan.components[j].example_inputs).items()}
        sources.append((io_elements(plan, j, gen), example))
    return sources


def module_elements(plan: Any, comp: Any, gen: Any) -> tuple[Callable[[Point], int], list[dict[str, Any]]]:
    """(``point -> elements`` of the inputs and outputs of one of the component's input sets at export, its
    activation terms): its inputs' shapes from its dynamic axes, its outputs' from the module run at the example
    and at each dimension's low end (an output axis that moves with a dimension is ``NAME + k``, as the exported
    graph writes it; one that moves otherwise counts 1, as validate counts a graph dim it cannot size), its largest
    intermediate's estimate from the ops of the same runs (inputs/activations.py). Measured once per component of a
    plan (``plan.sized``): decode's budget counts prefill's, which prefill's own budget measured (shapes and op
    sizes, whatever the random ids ``gen`` draws)."""
    sized = getattr(plan, "sized", None)
    if sized is not None and comp.name in sized:
        return sized[comp.name]
    found = _module_elements(plan, comp, gen)
    if sized is not None:
        sized[comp.name] = found
    return found


def _module_elements(plan: Any, comp: Any, gen: Any) -> tuple[Callable[[Point], int], list[dict[str, Any]]]:
    import torch

    from ..inputs.activations import op_sizes, terms_of
    from ..inputs.parity_budget import dim_size, shape_elements

    module, feed = comp.module, comp.example_inputs
    found = dims(module, feed)
    example = {n: v[0] for n, v in found.items()}
    axes = getattr(module, "graph_dynamic_axes", {}) or {}
    shapes = [[axes.get(n, {}).get(a, size) for a, size in enumerate(feed[n].shape)] for n in module.graph_input_names]
    with torch.no_grad(), op_sizes() as ops:
        base = {k: list(v.shape) for k, v in module(**feed).items()}
    outputs = {k: list(v) for k, v in base.items()}
    index = plan.components.index(comp)
    probes = {}
    for name, (size, low, high) in found.items():
        probe = low if low != size else high
        if probe == size:
            continue
        moved_feed = feed_at(plan, index, {**example, name: probe}, gen)
        with torch.no_grad(), op_sizes() as probed:
            moved = module(**moved_feed)
        probes[name] = (probe, probed)
        for key, shape in base.items():
            for a, (was, now) in enumerate(zip(shape, moved[key].shape, strict=False)):
                k = was - size
                if was != now and now - probe == k and k >= 0:
                    outputs[key][a] = f"{name} + {k}" if k else name
                elif was != now and isinstance(outputs[key][a], int):  # it scales (a VAE's image side, twice the
                    outputs[key][a] = 1  # latent's): no dim name validate sizes, so counted as validate counts it
        del moved
    return shape_elements([*shapes, *outputs.values()], dim_size), terms_of(example, ops, probes)
