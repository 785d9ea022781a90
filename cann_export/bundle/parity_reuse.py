"""A later graph's inputs at a parity shape from an earlier graph's references, not from another eager run: the
past of decode at ``batch_size=B, past_sequence_length=P`` is prefill's ``present.*`` at ``B, P``, and prefill's
parity already computed it (or a larger one) for its own shapes. Prefill's rows are independent and its cache
causal (all-ones masks, positions from 0), so the cache of a set at ``B' >= B`` and ``S' >= P`` holds the one at
``B, P`` as its first ``B`` rows and ``P`` positions: decode's prepare slices it instead of running prefill again
(GPT-2 small: 12 eager prefills, up to batch 51, gone). Only the sets no other kept set covers are kept, per
draw (GPT-2 small: batch 64 at 7 tokens and 301 tokens at batch 2), until the bundle is written; a shape none
covers (a user's gears past prefill's) runs prefill eagerly as before."""
from __future__ import annotations

from typing import Any

from ..plan import Component, Plan

REUSED = ("decoder-with-past",)  # kinds whose first graph is a causal prefill of independent rows


def keeper(plan: Plan, comp: Component) -> Any:
    """``(point, output names, outputs per draw) -> None`` storing what a later component takes from ``comp``
    (None when none does, or the plan's kind has no causal prefill)."""
    wanted = {out for src, out, dst, _ in plan.connections if src == comp.name and dst != comp.name}
    if plan.kind not in REUSED or not wanted:
        return None

    def keep(point: dict[str, int], names: list[str], outputs: list[Any]) -> None:
        for draw, arrays in enumerate(outputs):
            index = {n: k for k, n in enumerate(names) if n in wanted}
            if len(index) != len(wanted):
                return
            kept = plan.kept.setdefault(comp.name, [])
            if any(d == draw and _covers(p, point) for p, d, _ in kept):
                continue
            kept[:] = [e for e in kept if not (e[1] == draw and _covers(point, e[0]))]
            kept.append((dict(point), draw, {n: arrays[k] for n, k in index.items()}))  # not the logits

    return keep


def _covers(big: dict[str, int], small: dict[str, int]) -> bool:
    return big.keys() == small.keys() and all(big[n] >= small[n] for n in small)


def reused(plan: Plan, source: str, at: dict[str, int], draw: int | None, pairs: list[tuple[str, str]],
           consumer: Any, like: dict[str, Any]) -> dict[str, Any] | None:
    """``{consumer input: tensor}`` for ``pairs`` (source output, consumer input) at the source's point ``at``,
    sliced from a kept set of draw ``draw`` (any draw when None) that covers it; None when none does.
    ``like``: the consumer's example inputs (the dtype each takes)."""
    import torch

    axes = getattr(consumer, "graph_dynamic_axes", {}) or {}
    for point, d, arrays in plan.kept.get(source, []):
        if (draw is not None and d != draw) or not _covers(point, at):
            continue
        feed = {}
        for out, inp in pairs:
            array = arrays[out]
            cut = [slice(None)] * array.ndim
            for axis, label in axes.get(inp, {}).items():
                base, _, more = label.partition(" + ")
                plus = int(more or 0)
                name = base[len("past_"):] if base.startswith("past_") and base[len("past_"):] in at else base
                if name not in at or array.shape[axis] != point[name] + plus:
                    return None
                cut[axis] = slice(0, at[name] + plus)
            feed[inp] = torch.from_numpy(array[tuple(cut)].copy()).to(like[inp].dtype)
        return feed
    return None
