"""Row reuse of the eager reference across the batch sizes parity runs at (issue 44).

The shape sets of a dynamic batch (the range's ends and middle, or the gears, the other dimensions at the
example's size) differ only in their count of rows. Where every input holds the batch at axis 0, the largest of
them is composed of the rows the example's own sets already hold (the example and its random variants, whose
references ran in prepare) plus freshly drawn rows for the rest, and each smaller one is its leading rows: eager
runs only on the rows no set holds yet, and every output is sliced along its batch axis. The graph still runs at
every size; only its reference is shared.

That holds only where the model's rows are independent. It is proved, not assumed: the smallest batch set runs
eagerly too and must match its slice within ``PROOF_SHARE`` of each output's peak (fp32 batched-GEMM noise is
~1e-6 relative; a model that mixes rows, such as a norm over the batch, differs by the size of its outputs); an
output whose batch axis is not the one axis that follows the batch between the example's size and the smallest
(a flattened or batch-by-batch output) proves nothing. Either way the sets run one by one, as before, and the
record (``parity.reference_reuse`` in the manifest) says why."""
from __future__ import annotations

from typing import Any

from .. import errors

PROOF_SHARE = 1e-5  # of an output's peak |value|: the most a sliced row may differ from its own eager run
POOL_SOURCES = ("example", "random")  # the example-shape sets whose rows the largest batch set takes


def batch_dimension(axes: list[Any], feed: dict[str, Any]) -> str | None:
    """The dimension that is axis 0 of every input holding a dimension, and no other axis, else None."""
    names = {a.name for a in axes if a.axis == 0}
    if len(names) != 1:
        return None
    name = names.pop()
    on = {a.input for a in axes if a.name == name}
    ranked = [n for n, t in feed.items() if hasattr(t, "dim") and t.dim() >= 1]
    if any(a.name == name and a.axis != 0 for a in axes) or set(ranked) != on or len(ranked) != len(feed):
        return None
    return name


def shared_references(ctx: Any, drawn: list[tuple[dict[str, int], list[dict[str, Any]], list[dict[str, Any]]]],
                      run: Any) -> dict[int, list[list[Any]]]:
    """``{index in drawn: reference outputs of its sets}`` for the batch points whose references were shared (their
    sets in ``drawn`` replaced by the rows they were sliced from); empty when reuse does not apply or is refused.
    ``run(sets)`` is the eager reference of ``sets`` (inputs/reference.py). ``ctx.reports.reference.row_reuse``
    records what happened."""
    record, found = _plan(ctx, drawn)
    if found is None:
        ctx.reports.reference.row_reuse = record
        return {}
    name, batch_points, pool = found
    try:
        shared, record = _share(ctx, drawn, name, batch_points, pool, run)
    except _Refused as e:
        shared, record = {}, {"used": False, "dimension": name, "reason": str(e)}
    except errors.PrepareError as e:  # the sets run one by one, where a failing size is handled as before
        shared, record = {}, {"used": False, "dimension": name, "reason": f"an eager run failed: {e.message[:200]}"}
    ctx.reports.reference.row_reuse = record
    return shared


class _Refused(Exception):
    """Why the rows are not shared (the record's reason)."""


def _plan(ctx: Any, drawn: list[Any]) -> tuple[dict[str, Any], Any]:
    """(a refusal record, None) or (None, (batch dimension, indices of its points by size, pooled set indices))."""
    feed = ctx.example_inputs
    name = batch_dimension(ctx.dynamic_axes, feed)
    if name is None:
        return {"used": False, "reason": "no dimension is the batch (axis 0) of every input"}, None
    example = {a.name: int(feed[a.input].shape[a.axis]) for a in ctx.dynamic_axes}
    batch_points = [k for k, (point, sets, _) in enumerate(drawn)
                    if len(sets) == 1 and {n for n in point if point[n] != example[n]} == {name}]
    if len(batch_points) < 2:
        return {"used": False, "dimension": name, "reason": "fewer than two batch sizes besides the example's"}, None
    shapes = {n: tuple(t.shape) for n, t in feed.items()}
    pool = [s for s, label in enumerate(ctx.input_set_labels)
            if label["source"] in POOL_SOURCES and label["role"] == "verdict"
            and {n: tuple(t.shape) for n, t in ctx.input_sets[s].items()} == shapes
            and isinstance(ctx.reference_outputs[s], list)]  # spilled references (a large model) stay on disk
    return None, (name, sorted(batch_points, key=lambda k: drawn[k][0][name]), pool)


def _share(ctx: Any, drawn: list[Any], name: str, batch_points: list[int], pool: list[int],
           run: Any) -> tuple[dict[int, list[list[Any]]], dict[str, Any]]:
    import torch

    example_batch = int(next(iter(ctx.example_inputs.values())).shape[0])
    smallest, largest = batch_points[0], batch_points[-1]
    size = drawn[largest][0][name]
    big = drawn[largest][1][0]
    taken = min(size, example_batch * len(pool))
    rows = {n: [ctx.input_sets[s][n] for s in pool] for n in big}
    composed = {n: torch.cat([*rows[n], big[n]])[:size] if rows[n] else big[n] for n in big}
    fresh = size - taken
    parts = [(example_batch, list(ctx.reference_outputs[s])) for s in pool]
    if fresh:  # the rows no example set holds: their own eager run
        parts.append((fresh, run([{n: t[taken:] for n, t in composed.items()}])[0]))
    outputs = [out for _, out in parts]
    low = drawn[smallest][0][name]
    proof = run([{n: t[:low] for n, t in composed.items()}])[0]
    axes = _batch_axes(parts[0][1], parts[0][0], proof, low)
    joined = [_joined([o[i] for o in outputs], axis, size) for i, axis in enumerate(axes)]
    worst = _proved(ctx.output_names, proof, [_rows(j, a, low) for j, a in zip(joined, axes, strict=True)], axes)
    shared: dict[int, list[list[Any]]] = {}
    for k in batch_points:
        count = drawn[k][0][name]
        drawn[k][1][0] = {n: t[:count] for n, t in composed.items()}
        shared[k] = [proof] if k == smallest else [[_rows(j, a, count) for j, a in zip(joined, axes, strict=True)]]
    record = {"used": True, "dimension": name, "sizes": [drawn[k][0][name] for k in batch_points],
              "rows_from_example_sets": taken, "eager_rows": fresh + low,
              "proof": {"size": low, "max_share": worst, "limit": PROOF_SHARE}}
    return shared, record


def _batch_axes(at_example: list[Any], example_batch: int, at_low: list[Any], low: int) -> list[int]:
    """Per output, the one axis that is the batch at both sizes (the others alike), else refused."""
    if len(at_example) != len(at_low):
        raise _Refused("the outputs differ in number between batch sizes")
    axes = []
    for k, (a, b) in enumerate(zip(at_example, at_low, strict=True)):
        found = [i for i in range(min(a.ndim, b.ndim)) if a.shape[i] == example_batch and b.shape[i] == low]
        alike = a.ndim == b.ndim and all(a.shape[i] == b.shape[i] for i in range(a.ndim) if i not in found)
        if len(found) != 1 or not alike:
            raise _Refused(f"output {k}'s batch axis is not identifiable (shape {list(a.shape)[:8]} at batch "
                           f"{example_batch}, {list(b.shape)[:8]} at {low})")
        axes.append(found[0])
    return axes


def _joined(parts: list[Any], axis: int, size: int) -> Any:
    import numpy as np

    return np.concatenate([np.asarray(p) for p in parts], axis=axis)[_cut(axis, size)]


def _rows(array: Any, axis: int, count: int) -> Any:
    import numpy as np

    return np.ascontiguousarray(array[_cut(axis, count)])


def _cut(axis: int, count: int) -> tuple[slice, ...]:
    return (slice(None),) * axis + (slice(0, count),)


def _proved(names: list[str], eager: list[Any], sliced: list[Any], axes: list[int]) -> float:
    """The largest share of an output's peak by which a sliced row differs from its eager run, refused past
    PROOF_SHARE (or a non-float output not equal)."""
    import numpy as np

    worst = 0.0
    for k, (a, b) in enumerate(zip(eager, sliced, strict=True)):
        label = names[k] if k < len(names) else f"output {k}"
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            raise _Refused(f"{label}: shape {list(a.shape)[:8]} eagerly, {list(b.shape)[:8]} sliced")
        if not np.issubdtype(a.dtype, np.floating):
            if not np.array_equal(a, b):
                raise _Refused(f"{label}: the rows differ from the larger batch's (rows are not independent)")
            continue
        finite = np.isfinite(a)
        if not np.array_equal(finite, np.isfinite(b)) or not np.array_equal(a[~finite], b[~finite]):
            raise _Refused(f"{label}: non-finite values differ from the larger batch's rows")
        peak = float(np.abs(a[finite]).max()) if finite.any() else 0.0
        gap = float(np.abs(a[finite].astype(np.float64) - b[finite]).max()) if finite.any() else 0.0
        share = gap / peak if peak > 0 else (0.0 if gap == 0 else float("inf"))
        if share > PROOF_SHARE:
            raise _Refused(f"{label}: the batch-{a.shape[axes[k]]} rows differ from the larger batch's by "
                           f"{share:.2e} of the output's peak (more than {PROOF_SHARE:g}): rows are not independent")
        worst = max(worst, share)
    return float(f"{worst:.3g}")
