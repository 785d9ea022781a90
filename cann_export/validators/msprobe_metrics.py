"""msprobe's comparison figures beside ours, per output in parity.json: what ``msprobe compare -m offline_model``
reports for a tensor (its result CSV's Cosine, MaxAbsErr, RelEuclidean distance, KL divergence, RMSE, mean relative
error and the one/five-thousandth error ratios), so a user comparing the real .om on a device reads the same
figures of the bundle's own graph. They are reported, never judged: the verdict stays this project's rule
(metrics.py). With ``b`` the reference (golden) and ``a`` the graph's output, over every element:

- cosine            a.b / (|a| |b|)  (1 when both are all zero, 0 when one is)
- max_abs           max |a - b|
- rel_euclidean     |a - b|_2 / |b|_2  (0 when both are zero, null when only b is)
- kl                KL(P || Q), P = softmax(b), Q = softmax(a) over the flattened tensor
- rmse              sqrt(mean((a - b)^2))
- mre               mean(|a - b| / |b|), elements with b == 0 counting |a - b| / EPS
- one_thousandth    share of elements with |a - b| / |b| <= 0.001 (|a - b| <= 0.001 * EPS where b == 0)
- five_thousandth   the same at 0.005
Computed in float64, a chunk at a time (a large vocabulary's logits are never copied whole). A tensor holding
NaN or infinity, an integer or boolean output, gets no figures (null)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

EPS = 1e-12  # msprobe's floor under a zero reference element
CHUNK = 1 << 20
FIELDS = ("cosine", "max_abs", "rel_euclidean", "kl", "rmse", "mre", "one_thousandth", "five_thousandth")
WORST = {"cosine": min, "one_thousandth": min, "five_thousandth": min}  # the rest: max


def figures(actual: Any, expected: Any) -> dict[str, float | None] | None:
    """msprobe's figures of one output on one input set, or None where they do not apply."""
    a = np.asarray(actual).reshape(-1)
    b = np.asarray(expected).reshape(-1)
    if a.shape != b.shape or a.size == 0 or a.dtype.kind != "f" or b.dtype.kind != "f":
        return None
    top_a = float(np.max(a))
    top_b = float(np.max(b))
    if not (math.isfinite(top_a) and math.isfinite(top_b)):
        return None
    sums = dict.fromkeys(("dot", "aa", "bb", "dd", "rel", "within1", "within5", "za", "zb", "pz"), 0.0)
    max_abs = 0.0
    for start in range(0, a.size, CHUNK):
        x = a[start:start + CHUNK].astype(np.float64)
        y = b[start:start + CHUNK].astype(np.float64)
        if not (np.isfinite(x).all() and np.isfinite(y).all()):
            return None
        signed = x - y
        ey = np.exp(y - top_b)
        sums["pz"] -= float(ey @ signed)  # sum exp(b - top_b) * (b - a)
        sums["zb"] += float(ey.sum())
        sums["za"] += float(np.exp(x - top_a).sum())
        sums["dot"] += float(x @ y)
        sums["aa"] += float(x @ x)
        sums["bb"] += float(y @ y)
        sums["dd"] += float(signed @ signed)
        diff = np.abs(signed, out=signed)
        rel = np.maximum(np.abs(y, out=ey), EPS, out=ey)
        np.divide(diff, rel, out=rel)
        sums["rel"] += float(rel.sum())
        sums["within1"] += float(np.count_nonzero(rel <= 1e-3))
        sums["within5"] += float(np.count_nonzero(rel <= 5e-3))
        max_abs = max(max_abs, float(diff.max()))
    n = a.size
    norm_a = math.sqrt(sums["aa"])
    norm_b = math.sqrt(sums["bb"])
    if norm_a == 0.0 and norm_b == 0.0:
        cosine = 1.0
    elif norm_a == 0.0 or norm_b == 0.0:
        cosine = 0.0
    else:
        cosine = max(-1.0, min(1.0, sums["dot"] / (norm_a * norm_b)))
    dist = math.sqrt(sums["dd"])
    rel_euclidean = 0.0 if dist == 0.0 else (dist / norm_b if norm_b > 0.0 else None)
    # KL(P||Q) = sum p (log p - log q) = sum p (b - a) - (top_b + log Zb) + (top_a + log Za)
    kl = sums["pz"] / sums["zb"] - top_b - math.log(sums["zb"]) + top_a + math.log(sums["za"])
    return {"cosine": cosine, "max_abs": max_abs, "rel_euclidean": rel_euclidean, "kl": max(kl, 0.0),
            "rmse": math.sqrt(sums["dd"] / n), "mre": sums["rel"] / n, "one_thousandth": sums["within1"] / n,
            "five_thousandth": sums["within5"] / n}


def worst(per_set: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The worst case of each figure over the input sets (None when any set has no figures)."""
    if not per_set or any(s is None for s in per_set):
        return None
    out: dict[str, Any] = {}
    for field in FIELDS:
        values = [s[field] for s in per_set if s[field] is not None]  # type: ignore[index]
        out[field] = WORST.get(field, max)(values) if len(values) == len(per_set) else None
    return out


def attach(rows: list[dict[str, Any]], actual: list[list[Any]], expected: list[list[Any]]) -> list[dict[str, Any]]:
    """``rows`` with each output row's ``msprobe`` figures set: output k's worst case over the sets (actual[s][k]
    against expected[s][k])."""
    for k, row in enumerate(rows):
        row["msprobe"] = worst([figures(a[k], e[k]) for a, e in zip(actual, expected, strict=True)])
    return rows
