#!/usr/bin/env python
"""Parity's output comparison (parity_metrics.py ``compare`` / ``compare_probe``): this checkout against the
module at an older git revision, on GPT-2-small-sized float32 outputs (logits 64x7x50257, one KV tensor
2x12x301x64; ``actual`` = ``expected`` + float noise), and with a NaN on both sides / an inf on one side in the
logits (the general path). Reports CPU seconds (process_time, median of --repeat) per call and checks that
both give the same numbers, bit for bit.

Usage::

    python benchmarks/bench_metrics.py [--old-rev 1506b4e] [--repeat 5]
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def old_module(rev: str):
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:cann_export/validators/metrics.py"],
                            check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "metrics_old.py"
    path.write_text(source.replace("from ..options import", "from cann_export.options import"))
    spec = importlib.util.spec_from_file_location("metrics_old", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def arrays(shape, seed, scale):
    rng = np.random.default_rng(seed)
    expected = (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))
    actual = expected + rng.standard_normal(shape, dtype=np.float32) * np.float32(scale * 1e-6)
    return actual, expected


def cpu(fn, repeat):
    """Median CPU seconds (every thread: OpenBLAS's dot workers included) and median wall seconds."""
    times, walls = [], []
    for _ in range(repeat):
        start, wall = time.process_time(), time.perf_counter()
        result = fn()
        times.append(time.process_time() - start)
        walls.append(time.perf_counter() - wall)
    return statistics.median(times), statistics.median(walls), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-rev", default="1506b4e")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    from cann_export.options import Tolerance
    from cann_export import parity_metrics as new

    old, tol = old_module(args.old_rev), Tolerance()
    logits, kv = arrays((64, 7, 50257), 0, 3.0), arrays((2, 12, 301, 64), 1, 1.0)
    special = (logits[0].copy(), logits[1].copy())
    special[0][0, 0, :3] = special[1][0, 0, :3] = np.nan
    special[0][-1, -1, -1] = np.inf
    cases = [("logits", logits, "compare", None), ("logits", logits, "compare", 1e-6),
             ("logits", logits, "compare_probe", None), ("kv", kv, "compare", None), ("kv", kv, "compare", 1e-6),
             ("logits NaN/inf", special, "compare", None)]
    print(f"{'output':<15} {'rule':<14} {'noise':<6} {'old cpu':>7} {'new cpu':>7} {'speedup':>7} {'old wall':>8} "
          f"{'new wall':>8}  same")
    for name, (a, e), rule, noise in cases:
        extra = (noise,) if rule == "compare" else ()
        t_old, w_old, r_old = cpu(functools.partial(getattr(old, rule), a, e, tol, *extra), args.repeat)
        t_new, w_new, r_new = cpu(functools.partial(getattr(new, rule), a, e, tol, *extra), args.repeat)
        same = all(np.float64(r_old[k]).tobytes() == np.float64(r_new[k]).tobytes() for k in r_old)
        print(f"{name:<15} {rule:<14} {str(noise):<6} {t_old:7.3f} {t_new:7.3f} {t_old / t_new:6.2f}x {w_old:8.3f} "
              f"{w_new:8.3f}  {same}")
        if not same:
            raise SystemExit(f"different numbers: {r_old} != {r_new}")


if __name__ == "__main__":
    main()
