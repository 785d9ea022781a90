"""A later graph's inputs at a parity shape from an earlier graph's outputs already computed, not from another
eager run. The past of decode at ``batch_size=B, past_sequence_length=P`` is prefill's ``present.*`` at ``B, P``,
and prefill's parity already computed it (or a larger one) for its own shapes; the decoder's
``encoder_hidden_states`` at batch B is the encoder's output at B, which the encoder's parity computed for its own
shapes and the decoder's sets ask for again at each of their own. Each component's rows are independent, so the
outputs of a set at batch ``B' >= B`` hold those at ``B`` as their first ``B`` rows; a causal prefill (all-ones
masks, positions from 0) also holds a shorter prompt's cache as its first positions (GPT-2 small: 12 eager prefills,
up to batch 51, gone), while an encoder attends to every position, so only its batch is sliced and every other size
must match (Whisper at its 3000-frame window: the encoder ran 8 times for the decoders' sets, now once).

What is kept: a component's parity references at its shapes (``keeper``) and a feeding run made for a later graph
(``remember``), each only the outputs a later graph takes, per draw, and only the sets no other kept set covers,
within a budget (KEPT_SHARE of the weights' bytes, at least KEPT_FLOOR: an encoder-decoder's decoder keeps every
layer's cross-attention cache), until no component left to export reads them (``release``); a shape none covers
runs the earlier graph eagerly as before."""
from __future__ import annotations

from typing import Any

from ..plan import Component, Plan

CAUSAL = ("decoder-with-past",)  # kinds whose first graph is a causal prefill: a longer prompt holds a shorter one
KEPT_SHARE = 0.25  # of the plan's weight bytes: what the kept outputs may hold at once ...
KEPT_FLOOR = 64 << 20  # ... and at least this (a small model's outputs are kept whole)


def keeper(plan: Plan, comp: Component) -> Any:
    """``(point, output names, outputs per draw) -> None`` storing what a later component takes from ``comp``'s
    parity references (None when no later component takes anything from it)."""
    wanted = taken_from(plan, comp.name)
    if not wanted:
        return None

    def keep(point: dict[str, int], names: list[str], outputs: list[Any]) -> None:
        index = {n: k for k, n in enumerate(names) if n in wanted}
        if len(index) != len(wanted):
            return
        for draw, arrays in enumerate(outputs):
            _store(plan, comp.name, point, draw, {n: arrays[k] for n, k in index.items()})  # not the logits

    return keep


def remember(plan: Plan, source: str, at: dict[str, int], draw: int | None, outputs: dict[str, Any]) -> None:
    """Keep what a later component takes of ``source``'s eager run at ``at`` (made to feed a set of draw ``draw``)."""
    wanted = taken_from(plan, source)
    if wanted and wanted <= outputs.keys():
        _store(plan, source, at, draw or 0, {n: _array(outputs[n]) for n in wanted})


def _array(tensor: Any) -> Any:
    """``tensor`` as numpy (bfloat16, which numpy lacks, as float32: exact; ``reused`` casts it back)."""
    import torch

    tensor = tensor.detach()
    return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).cpu().numpy()


def release(plan: Plan, exported: set[str]) -> None:
    """Let go what no component left to export can read, directly or through the earlier graph it runs eagerly."""
    needed: set[str] = set()
    left = [c.name for c in plan.components if c.name not in exported]
    while left:
        name = left.pop()
        for src, _, dst, _ in plan.connections:
            if dst == name and src != name and src not in needed:
                needed.add(src)
                left.append(src)
    for source in [s for s in plan.kept if s not in needed]:
        del plan.kept[source]


def taken_from(plan: Plan, source: str) -> set[str]:
    """The outputs of component ``source`` a later component takes as an input."""
    return {out for src, out, dst, _ in plan.connections if src == source and dst != source}


def _store(plan: Plan, source: str, point: dict[str, int], draw: int, arrays: dict[str, Any]) -> None:
    """Keep ``arrays`` unless a kept set covers them or they would pass the budget; the sets they cover go."""
    kept = plan.kept.setdefault(source, [])
    if any(d == draw and _covers(plan, p, point) for p, d, _ in kept):
        return
    rest = [e for e in kept if not (e[1] == draw and _covers(plan, point, e[0]))]
    others = sum(_bytes(e) for name, entries in plan.kept.items() if name != source for e in entries)
    if others + sum(_bytes(e) for e in rest) + _bytes((point, draw, arrays)) > _budget(plan):
        return  # a later set at this point runs the earlier graph eagerly
    kept[:] = [*rest, (dict(point), draw, arrays)]


def _bytes(entry: tuple[dict[str, int], int, dict[str, Any]]) -> int:
    return sum(int(a.nbytes) for a in entry[2].values())


def _budget(plan: Plan) -> int:
    """KEPT_SHARE of the weights' bytes (the components' modules share one model: its largest count), or KEPT_FLOOR."""
    from ..inputs.parity_budget import weight_bytes

    weights = max(weight_bytes(comp.module) for comp in plan.components)
    return max(KEPT_FLOOR, int(KEPT_SHARE * weights))


def _covers(plan: Plan, big: dict[str, int], small: dict[str, int]) -> bool:
    """Whether the outputs at ``big`` hold those at ``small``: a batch at least as large, and (but for a causal
    prefill's lengths, which may be longer) every other size equal."""
    if big.keys() != small.keys():
        return False
    if plan.kind in CAUSAL:
        return all(big[n] >= small[n] for n in small)
    return all(big[n] >= small[n] if n == "batch_size" else big[n] == small[n] for n in small)


def reused(plan: Plan, source: str, at: dict[str, int], draw: int | None, pairs: list[tuple[str, str]],
           consumer: Any, like: dict[str, Any]) -> dict[str, Any] | None:
    """``{consumer input: tensor}`` for ``pairs`` (source output, consumer input) at the source's point ``at``,
    sliced from a kept set of draw ``draw`` (any draw when None) that covers it; None when none does.
    ``like``: the consumer's example inputs (the dtype each takes). An axis whose size is none of the source's
    dimensions (Whisper's 1500 encoder positions at its fixed window) is the source's own: kept whole."""
    import torch

    axes = getattr(consumer, "graph_dynamic_axes", {}) or {}
    for point, d, arrays in plan.kept.get(source, []):
        if (draw is not None and d != draw) or not _covers(plan, point, at):
            continue
        cuts = {inp: _cut(arrays[out], axes.get(inp, {}), point, at) for out, inp in pairs}
        if all(cut is not None for cut in cuts.values()):
            return {inp: torch.from_numpy(arrays[out][cuts[inp]].copy()).to(like[inp].dtype) for out, inp in pairs}
    return None


def _cut(array: Any, axes: dict[int, str], point: dict[str, int], at: dict[str, int]) -> tuple[slice, ...] | None:
    """The slice of ``array`` (kept at ``point``) that is its value at ``at``, by the consumer input's ``axes``
    labels; None when an axis is not the size its label says."""
    cut = [slice(None)] * array.ndim
    for axis, label in axes.items():
        base, _, more = label.partition(" + ")
        plus = int(more or 0)
        name = base[len("past_"):] if base.startswith("past_") and base[len("past_"):] in at else base
        if name not in at:
            continue
        if array.shape[axis] != point[name] + plus:
            return None
        cut[axis] = slice(0, at[name] + plus)
    return tuple(cut)
