"""bench_vs_optimum.py's rows as tables: one row per model (both tools' wall / CPU / peak RSS, ratios ours /
Optimum, the ``--no-validate`` side's ratios, the checks' own seconds), then the medians of each family and of the
whole set against issue 44's targets."""
from __future__ import annotations

import statistics

TARGET_MEDIAN = 1.0  # median wall (and CPU) ratio over the set
TARGET_FAMILY = 1.3  # no family's median wall (or CPU) ratio above it
TARGET_RSS = 1.2  # peak RSS ratio, every model
TARGET_NOVALIDATE = 0.8  # like-for-like (no checks Optimum lacks): median wall (and CPU) ratio
RATIOS = ("wall", "cpu", "rss", "nv_wall", "nv_cpu", "nv_rss")


def ratios(row: dict) -> dict[str, float]:
    """The row's ratios ours / Optimum that both tools measured (``nv_``: our ``--no-validate`` side)."""
    out: dict[str, float] = {}
    opt = row.get("optimum")
    if not opt:
        return out
    for prefix, side in (("", "ours"), ("nv_", "novalidate")):
        mine = row.get(side)
        if mine:
            out[f"{prefix}wall"] = mine["wall_s"] / opt["wall_s"]
            out[f"{prefix}cpu"] = mine["cpu_s"] / opt["cpu_s"]
            out[f"{prefix}rss"] = mine["peak_mib"] / opt["peak_mib"]
    return out


def medians(rows: list[dict]) -> dict[str, float | int]:
    """Median of each ratio over ``rows`` (those that have it), and how many rows had both tools' numbers."""
    out: dict[str, float | int] = {"models": sum(1 for r in rows if "wall" in r["ratios"])}
    for key in RATIOS:
        values = [r["ratios"][key] for r in rows if key in r["ratios"]]
        if values:
            out[key] = round(statistics.median(values), 3)
    return out


def summary(rows: dict[str, dict]) -> dict:
    """Per-family and overall medians, and each target met or missed (with the offenders)."""
    families: dict[str, list[dict]] = {}
    for row in rows.values():
        families.setdefault(row["family"], []).append(row)
    by_family = {name: medians(members) for name, members in families.items()}
    overall = medians(list(rows.values()))
    over_rss = [n for n, r in rows.items() if r["ratios"].get("rss", 0.0) > TARGET_RSS]
    targets = {
        f"median wall <= {TARGET_MEDIAN}x": _met(overall.get("wall"), TARGET_MEDIAN),
        f"no family's wall > {TARGET_FAMILY}x": _none_over(by_family, "wall", TARGET_FAMILY),
        f"median CPU <= {TARGET_MEDIAN}x": _met(overall.get("cpu"), TARGET_MEDIAN),
        f"no family's CPU > {TARGET_FAMILY}x": _none_over(by_family, "cpu", TARGET_FAMILY),
        f"peak RSS <= {TARGET_RSS}x on every model": {"met": not over_rss, "over": over_rss},
        f"--no-validate median wall <= {TARGET_NOVALIDATE}x": _met(overall.get("nv_wall"), TARGET_NOVALIDATE),
        f"--no-validate median CPU <= {TARGET_NOVALIDATE}x": _met(overall.get("nv_cpu"), TARGET_NOVALIDATE),
    }
    return {"families": by_family, "overall": overall, "targets": targets}


def _met(value: float | None, target: float) -> dict:
    return {"met": value is not None and value <= target, "value": value}


def _none_over(by_family: dict[str, dict], key: str, target: float) -> dict:
    over = [f"{name} {m[key]:.2f}x" for name, m in by_family.items() if m.get(key, 0.0) > target]
    return {"met": not over, "over": over}


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _side(row: dict, side: str, key: str, fmt: str) -> str:
    numbers = row.get(side)
    return "-" if not numbers else format(numbers[key], fmt)


def print_rows(rows: dict[str, dict], title: str) -> None:
    print(f"\n{title}")
    print("| model | family | task | ours s | Optimum s | wall | ours CPU s | Optimum CPU s | CPU | ours MiB | "
          "Optimum MiB | RSS | no-validate wall / CPU / RSS | checks s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        q = r["ratios"]
        checks = "-" if r.get("checks_s") is None else f"{r['checks_s']:.1f}"
        print(f"| {name} | {r['family']} | {r['task']} | {_side(r, 'ours', 'wall_s', '.2f')} | "
              f"{_side(r, 'optimum', 'wall_s', '.2f')} | {_x(q.get('wall'))} | {_side(r, 'ours', 'cpu_s', '.1f')} | "
              f"{_side(r, 'optimum', 'cpu_s', '.1f')} | {_x(q.get('cpu'))} | {_side(r, 'ours', 'peak_mib', '.0f')} | "
              f"{_side(r, 'optimum', 'peak_mib', '.0f')} | {_x(q.get('rss'))} | "
              f"{_x(q.get('nv_wall'))} / {_x(q.get('nv_cpu'))} / {_x(q.get('nv_rss'))} | {checks} |")
    for name, r in rows.items():
        for side, reason in r.get("unavailable", {}).items():
            print(f"  {name}: {side} could not export it: {reason}")


def print_summary(result: dict) -> None:
    print("\nmedians of ours / Optimum (no-validate: our side without the checks Optimum lacks)")
    print("| family | models | wall | CPU | RSS | no-validate wall | no-validate CPU | no-validate RSS |")
    print("|---|---|---|---|---|---|---|---|")
    for name, m in [*result["families"].items(), ("**all**", result["overall"])]:
        print(f"| {name} | {m['models']} | {_x(m.get('wall'))} | {_x(m.get('cpu'))} | {_x(m.get('rss'))} | "
              f"{_x(m.get('nv_wall'))} | {_x(m.get('nv_cpu'))} | {_x(m.get('nv_rss'))} |")
    print("targets (issue 44):")
    for what, verdict in result["targets"].items():
        detail = _x(verdict["value"]) if "value" in verdict else ", ".join(verdict["over"]) or "none over"
        print(f"  {'met   ' if verdict['met'] else 'MISSED'} {what}: {detail}")


def print_stages(rows: dict[str, dict]) -> None:
    """Where our time goes: the median seconds of each of our stages, summed over a bundle's graphs."""
    print("\nour stages (median s, summed over a bundle's graphs, each graph's in the JSON; checks: the CLI's own "
          "line, parity sets + eager reference + onnxruntime runs)")
    for name, r in rows.items():
        st = r.get("stage_median_s")
        if st:
            print(f"  {name}: " + ", ".join(f"{s} {v:.2f}" for s, v in st.items() if v >= 0.01 and ":" not in s)
                  + f"; {r['input_sets']} parity sets; checks {r['checks_s']:.2f} s")
