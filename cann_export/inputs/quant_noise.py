"""The fake-quant reference's own rounding noise: the model run again on its verdict sets with every float
input times (1 + 1e-6 noise). A deep int8 network carries one intermediate value flipped at a rounding point
on to its outputs, several steps on a poorly conditioned one (transformers' MobileNetV2 after a few steps:
5.1 output steps RMS, pooled), so a Q/DQ graph computing the same rounding in another float order can be
that far from the reference without being wrong (parity_metrics.compare_quantized)."""
from __future__ import annotations

from typing import Any

DRAWS = 3
RELATIVE = 1e-6


def int8_noise(ctx: Any, model: Any) -> list[list[dict[str, float]] | None]:
    """Per input set, per output: the worst of ``DRAWS`` perturbed runs against ``ctx.reference_outputs`` on every
    verdict set (pooled), in 8-bit output steps (``rms_steps``, ``max_steps``) and cosine; None for the sets not
    in ``verdict``."""
    import torch

    from ..parity_metrics import compare_quantized
    from .reference import reference_outputs

    verdict = [s for s, label in enumerate(ctx.input_set_labels) if label["role"] == "verdict"]
    out: list[list[dict[str, float]] | None] = [None] * len(ctx.input_sets)
    g = torch.Generator().manual_seed(5)
    for s in verdict:
        feed = ctx.input_sets[s]
        if not any(t.is_floating_point() for t in feed.values()):
            continue
        noisy = [{n: t * (1 + RELATIVE * torch.randn(t.shape, generator=g)).to(t.dtype) if t.is_floating_point()
                  else t for n, t in feed.items()} for _ in range(DRAWS)]
        _, runs = reference_outputs(ctx, model, "the fake-quant model", ctx.input_names, input_sets=noisy)
        row = []
        for k, expected in enumerate(ctx.reference_outputs[s]):
            metrics = [compare_quantized(r[k], expected) for r in runs if k < len(r)]
            if not metrics or not all(m.get("quant_step", 0) > 0 for m in metrics):
                row = None
                break
            row.append({"rms_steps": max(m["rms_steps"] for m in metrics),
                        "max_steps": max(m["max_steps"] for m in metrics),
                        "cosine": min(m["cosine"] for m in metrics)})
        out[s] = row if row is not None and well_formed([row], 1) else None  # a non-finite run: no floor
    return pooled(out)


def pooled(noise: list[list[dict[str, float]] | None]) -> list[list[dict[str, float]] | None]:
    """Each measured row replaced by the worst per output over every measured set: a flip happens in some draws
    and not in others (one in three on MobileNetV2), and how far one carries is the model's, not the input's."""
    rows = [r for r in noise if r is not None]
    if not rows or len({len(r) for r in rows}) != 1:
        return noise
    worst = [{"rms_steps": max(r[k]["rms_steps"] for r in rows), "max_steps": max(r[k]["max_steps"] for r in rows),
              "cosine": min(r[k]["cosine"] for r in rows)} for k in range(len(rows[0]))]
    return [None if r is None else [dict(w) for w in worst] for r in noise]


def well_formed(noise: Any, sets: int) -> bool:
    """Whether ``noise`` (read from a bundle: untrusted) is a list of ``sets`` rows, each None or a list of
    {rms_steps, max_steps, cosine} with finite non-negative numbers (cosine in [-1, 1])."""
    import math

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    def entry(e: Any) -> bool:
        return isinstance(e, dict) and set(e) == {"rms_steps", "max_steps", "cosine"} \
            and all(number(e[k]) for k in e) and e["rms_steps"] >= 0 and e["max_steps"] >= 0 \
            and -1 <= e["cosine"] <= 1
    return isinstance(noise, list) and len(noise) == sets and all(
        row is None or (isinstance(row, list) and all(entry(e) for e in row)) for row in noise)
