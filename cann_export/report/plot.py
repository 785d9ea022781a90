"""The per-layer curve as inline SVG: cosine (top panel) and max relative error on a log scale (bottom),
one point per compared value in graph order; failing values red, keep_dtype nodes hollow, the first
divergence marked by a vertical line. Points carry ``data-i`` (their index in the embedded JSON) for the
page's hover box."""
from __future__ import annotations

import math
from html import escape
from typing import Any

WIDTH, PANEL, GAP, LEFT, RIGHT, TOP = 960, 200, 40, 64, 16, 16
REL_FLOOR = 1e-7


def finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def svg(layers: dict[str, Any], first_tensor: str | None, ident: str = "curve", view: int = 0) -> str:
    """The curve; a value whose cosine or max rel error is not a finite number (None, NaN, inf) leaves a gap in
    its trace and a "n/a" label at the panel's foot instead of a point."""
    points = layers["points"]
    n = len(points)
    inner = WIDTH - LEFT - RIGHT

    def x(i: float) -> float:
        return LEFT + inner * (i / (n - 1) if n > 1 else 0.5)

    cos_values = [p["cosine"] if finite(p.get("cosine")) else None for p in points]
    low = min([*(c for c in cos_values if c is not None), 0.99])
    low = max(-1.0, low - (1.0 - low) * 0.05)

    def y_cos(c: float) -> float:
        return TOP + PANEL * (1.0 - (c - low) / ((1.0 - low) or 1.0))

    top_rel = max([*(p["max_rel"] for p in points if finite(p.get("max_rel"))), 1e-3])
    rels = [10.0 ** math.ceil(math.log10(top_rel)) if p.get("overflow") else max(p["max_rel"], REL_FLOOR)
            if finite(p.get("max_rel")) else None for p in points]  # inf/nan (or saturated) on the device: at the top
    lo_exp, hi_exp = math.log10(REL_FLOOR), math.ceil(math.log10(top_rel))
    base2 = TOP + PANEL + GAP

    def y_rel(r: float) -> float:
        return base2 + PANEL * (1.0 - (math.log10(max(r, REL_FLOOR)) - lo_exp) / ((hi_exp - lo_exp) or 1))

    height = base2 + PANEL + 36
    parts = [f'<svg id="{ident}" class="curve" data-view="{view}" xmlns="http://www.w3.org/2000/svg" '
             f'viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" '
             f'height="{height}" role="img" aria-label="per-layer cosine and max relative error">']
    parts += _axes(LEFT, TOP, inner, [(y_cos(v), f"{v:.4g}") for v in _ticks(low, 1.0)], "cosine")
    parts += _axes(LEFT, base2, inner, [(y_rel(10.0 ** e), f"1e{e}") for e in range(int(lo_exp), int(hi_exp) + 1)],
                   "max rel error")
    parts.append(f'<text x="{LEFT + inner / 2}" y="{height - 6}" class="label" text-anchor="middle">value in graph '
                 f'order ({n} compared)</text>')
    if first_tensor is not None:
        at = next((p["index"] for p in points if p["tensor"] == first_tensor), None)
        if at is not None:
            mark = "first-divergence" if ident == "curve" else f"{ident}-first-divergence"
            parts.append(f'<line id="{mark}" x1="{x(at):.1f}" x2="{x(at):.1f}" y1="{TOP}" '
                         f'y2="{base2 + PANEL}" class="first"/>')
    for series, ys, cls, foot in ((cos_values, y_cos, "cos", TOP + PANEL), (rels, y_rel, "rel", base2 + PANEL)):
        parts += [f'<polyline class="trace" points="{line}"/>' for line in _segments(series, x, ys)]
        for i, (p, v) in enumerate(zip(points, series, strict=True)):
            kind = "fail" if not p.get("passed") else "ok"
            kept = " kept" if p.get("kept") else ""
            if v is None:  # not a finite number: a gap in the trace, labelled at the panel's foot
                parts.append(f'<text class="pt gap {cls}" data-i="{i}" x="{x(i):.1f}" y="{foot - 4}" '
                             f'text-anchor="middle">n/a<title>{escape(_title(p))}: not a finite number</title></text>')
                continue
            parts.append(f'<circle class="pt {cls} {kind}{kept}" data-i="{i}" cx="{x(i):.1f}" cy="{ys(v):.1f}" '
                         f'r="3.5"><title>{escape(_title(p))}</title></circle>')
    parts.append("</svg>")
    return "\n".join(parts)


def _segments(series: list[float | None], x: Any, y: Any) -> list[str]:
    """The trace's runs of finite values (a None breaks it)."""
    runs: list[list[str]] = [[]]
    for i, v in enumerate(series):
        if v is None:
            runs.append([])
        else:
            runs[-1].append(f"{x(i):.1f},{y(v):.1f}")
    return [" ".join(run) for run in runs if run]


def _title(p: dict[str, Any]) -> str:
    return f"{p.get('node')} ({p.get('op_type')}) {p.get('module') or ''}"


def _ticks(low: float, high: float) -> list[float]:
    return [low + (high - low) * k / 4 for k in range(5)]


def _axes(left: float, top: float, inner: float, ticks: list[tuple[float, str]], name: str) -> list[str]:
    out = [f'<rect x="{left}" y="{top}" width="{inner}" height="{PANEL}" class="panel"/>']
    for y, label in ticks:
        out.append(f'<line x1="{left}" x2="{left + inner}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{escape(label)}</text>')
    out.append(f'<text x="12" y="{top + PANEL / 2}" class="label" transform="rotate(-90 12 {top + PANEL / 2})" '
               f'text-anchor="middle">{escape(name)}</text>')
    return out
