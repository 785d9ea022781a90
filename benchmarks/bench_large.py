#!/usr/bin/env python
"""Benchmark the large-model path: peak memory and wall time of exporting a Linear stack past the sizes where
the graph must carry external data. 18 x Linear(4096, 4096) is 1.21 GB of fp32 weights, 36 x is 2.42 GB.

Each case runs in a fresh child process that builds the model (random weights), calls ``cann_export.export``
with validation on (parity from onnxruntime on the written file), and reports its own peak RSS
(``getrusage(RUSAGE_SELF).ru_maxrss``, which counts the model the caller holds). The figure of merit is
peak RSS / weight bytes (target <= 2.0). Results go to ``benchmarks/results/large.json``.

Usage::

    python benchmarks/bench_large.py [--depth 18 --depth 36] [--format onnx] [--exporter auto]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
import torch
import cann_export

depth, width, fmt, exporter, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], Path(sys.argv[5])
torch.manual_seed(0)
with torch.no_grad():
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)])
    for m in model:  # keep activations O(1) through the stack, so parity compares meaningful numbers
        m.weight.mul_(1.0 / width ** 0.5)
weights = sum(p.numel() * p.element_size() for p in model.parameters())
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
t0 = time.perf_counter()
result = cann_export.export(model, out, fmt, example_inputs=torch.randn(1, width), exporter=exporter)
wall = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"depth": depth, "width": width, "format": fmt, "weights_bytes": weights,
                  "rss_after_build_bytes": base, "peak_rss_bytes": peak, "peak_over_weights": peak / weights,
                  "wall_s": wall, "ok": result.ok, "parity_passed": (result.parity or {}).get("passed"),
                  "exporter": result.onnx["exporter"], "onnxsim": result.manifest.get("optimize", {}).get("onnxsim"),
                  "files": {Path(f).name: Path(f).stat().st_size for f in result.files}}))
"""


def run_case(depth: int, width: int, fmt: str, exporter: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory(prefix="bench-large-") as tmp:
        out = Path(tmp) / ("model.onnx" if fmt == "onnx" else "bundle")
        proc = subprocess.run([sys.executable, "-c", CHILD, str(depth), str(width), fmt, exporter, str(out)],
                              env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {"depth": depth, "width": width, "format": fmt, "error": proc.stderr.strip().splitlines()[-3:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depth", type=int, action="append", help="Linear layers (repeatable; default 18 and 36)")
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--format", default="atc_ready")
    ap.add_argument("--exporter", default="auto")
    ap.add_argument("--results", type=Path, default=HERE / "results" / "large.json")
    args = ap.parse_args()
    rows = [run_case(d, args.width, args.format, args.exporter) for d in (args.depth or [18, 36])]
    print(f"{'weights GB':>10} {'peak RSS GB':>11} {'peak/weights':>12} {'wall s':>7}  exporter   parity")
    for r in rows:
        if "error" in r:
            print(f"depth {r['depth']}: FAILED {' | '.join(r['error'])}")
            continue
        print(f"{r['weights_bytes'] / 1e9:>10.2f} {r['peak_rss_bytes'] / 1e9:>11.2f} {r['peak_over_weights']:>12.2f} "
              f"{r['wall_s']:>7.1f}  {r['exporter']:<10} {r['parity_passed']}")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
