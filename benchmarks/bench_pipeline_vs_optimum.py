#!/usr/bin/env python
"""Benchmark ``cann-export PIPELINE_DIR`` against ``optimum-cli export onnx`` on the same diffusers pipeline directory
(issue 43's Numbers): diffusers' tiny SD3 fast-test pipeline (benchmarks/pipeline_models.py: random weights, local
tokenizers, ``save_pretrained``; nothing is downloaded).

Sides, interleaved (the order rotates each round), ``--repeat`` rounds, medians reported:

- ``ours``: ``cann-export DIR -o OUT``, no flags, as a user types it: atc_ready, every component captured and
  validated (fp32 parity and the device emulation, ATC lint) and the end-to-end check (diffusers' loop on the
  exported graphs in onnxruntime, fp32 and device, against diffusers' eager pipeline);
- ``ours-novalidate``: the same with ``--no-validate`` (no parity, no end-to-end check): the like-for-like capture;
- ``optimum``: ``optimum-cli export onnx --model DIR --task text-to-image OUT`` (its own validation on: one random
  set per component, atol);
- ``floor``: ``cann-export trivial.pt2 -o OUT`` (a Linear 4 -> 4): the runtime's floor, what any export of ours
  holds in memory (torch, onnx, onnxruntime imported, the confined child), measured in the same run.

Wall seconds (spawn to exit), user+sys CPU seconds and peak RSS (``os.wait4``'s ``ru_maxrss``: the largest of the
process and its reaped children) per side. Targets: ours' wall <= 1.0x Optimum's; ours' peak RSS <= 1.5x the
pipeline's weight bytes (its safetensors files) plus the floor. The end-to-end check's cost is its own line (the
CLI's "end-to-end check ... done (N s)" line), with the seconds of our stages summed over the components.

Optimum runs from a side virtualenv (``--venv``; bench_vs_optimum.py's, made by it when missing, or
``/work/optimum-venv``) with diffusers added (``DIFFUSERS_PINS``: a release that works with its transformers < 4.58).
The directory is written by that venv's Python, so both sides read files its older transformers can load (the slow
CLIP tokenizer's vocab.json / merges.txt). Where Optimum is not there, cannot be made, or cannot export the pipeline,
the benchmark says why and exits 0 without a table. Results go to ``benchmarks/results/pipeline_vs_optimum.json``.

Our sides run on the same package versions as Optimum's by default (``--ours-env same``: same_env.py's venv, made
from that side venv after diffusers is added, plus this checkout), so the ratio compares the tools, not two
diffusers / transformers releases; ``--ours-env here`` runs them in this interpreter's environment.

Usage::

    python benchmarks/bench_pipeline_vs_optimum.py [--repeat 3] [--venv /work/optimum-venv] [--no-install]
        [--ours-env same|here] [--ours-venv DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_vs_optimum import OUR_BIN, OURS_VENV, SITE_CUSTOMIZE, VENV, compiled, optimum_cli, our_cli, run_measured
from same_env import add_options, our_environment

HERE = Path(__file__).resolve().parent
DIFFUSERS_PINS = ["diffusers==0.37.1", "huggingface-hub>=0.34,<1.0"]  # 0.35/0.36 fail to import beside torchao 0.18
TARGET_WALL, TARGET_RSS_WEIGHTS = 1.0, 1.5
SIDES = ("ours", "ours-novalidate", "optimum", "floor")
STAGE_LINE = re.compile(r"^\[(?:\S+ )?\d+/\d+\] (\S+) \.\.\. .* \(([\d.]+)s\)\s*$")
E2E_LINE = re.compile(r"^end-to-end check .*\(([\d.]+)s\)\s*$")
MIB = 1 << 20


def tail(path: Path, n: int = 15) -> str:
    """The last ``n`` lines of a run's log."""
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


def with_diffusers(venv: Path, install: bool) -> str | None:
    """None when the side venv's Python imports diffusers beside optimum's exporter; else why not."""
    python = str(venv / "bin" / "python")
    probe = [python, "-c", "import diffusers; from optimum.exporters.onnx import main_export"]
    if subprocess.run(probe, capture_output=True, check=False).returncode == 0:
        return None
    if not install:
        return f"{venv} has no working diffusers (pip install {' '.join(DIFFUSERS_PINS)}) and --no-install was given"
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *DIFFUSERS_PINS], capture_output=True,
                         text=True, check=False, timeout=1800)
    if pip.returncode != 0 or subprocess.run(probe, capture_output=True, check=False).returncode != 0:
        lines = (pip.stderr or "").strip().splitlines()
        return f"pip install {' '.join(DIFFUSERS_PINS)} into {venv} failed: {lines[-1] if lines else 'import fails'}"
    return None


def commands(side: str, cli: Path, tmp: Path, out: Path) -> list[str]:
    if side == "optimum":
        return [str(cli), "export", "onnx", "--model", str(tmp / "sd3-tiny"), "--task", "text-to-image", str(out)]
    if side == "floor":
        return [*our_cli(), str(tmp / "trivial.pt2"), "-o", str(out), "--overwrite"]
    extra = ["--no-validate"] if side == "ours-novalidate" else []
    return [*our_cli(), str(tmp / "sd3-tiny"), "-o", str(out), "--overwrite", *extra]


def our_lines(log: Path) -> dict:
    """Seconds per stage summed over the components, and the end-to-end check's own seconds (None: not run)."""
    found: dict[str, float] = {}
    e2e = None
    for line in log.read_text(errors="replace").splitlines():
        if m := STAGE_LINE.match(line.strip()):
            found[m.group(1)] = round(found.get(m.group(1), 0.0) + float(m.group(2)), 2)
        elif m := E2E_LINE.match(line.strip()):
            e2e = float(m.group(1))
    return {"stages": found, "end_to_end_s": e2e}


def bench(cli: Path, tmp: Path, args: argparse.Namespace, env: dict, opt_env: dict) -> dict | str:
    """Every side's runs (or why Optimum could not export the pipeline)."""
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for rep in range(args.repeat):
        for side in SIDES[rep % len(SIDES):] + SIDES[:rep % len(SIDES)]:
            out, log = tmp / f"{side}-{rep}", tmp / f"{side}-{rep}.log"
            m = run_measured(commands(side, cli, tmp, out), opt_env if side == "optimum" else env, log, args.timeout)
            if m["rc"] != 0 and side == "optimum":
                return f"optimum-cli export onnx exited {m['rc']} on the pipeline:\n{tail(log, 8)}"
            if m["rc"] != 0:
                raise SystemExit(f"{side} failed (rc {m['rc']}): {' '.join(commands(side, cli, tmp, out))}\n"
                                 f"{tail(log)}")
            if side.startswith("ours"):
                m.update(our_lines(log))
            runs[side].append(m)
            shutil.rmtree(out, ignore_errors=True)
            print(f"  {rep + 1}/{args.repeat} {side:16s} {m['wall_s']:7.2f} s {m['peak_mib']:8.1f} MiB "
                  f"cpu {m['cpu_s']:.1f} s", file=sys.stderr, flush=True)
    return runs


def summary(runs: dict[str, list[dict]], weights_bytes: int) -> dict:
    def med(side: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[side])

    floor, weights_mib = med("floor", "peak_mib"), weights_bytes / MIB
    budget = TARGET_RSS_WEIGHTS * weights_mib + floor
    row = {side: {k: med(side, k) for k in ("wall_s", "cpu_s", "peak_mib")} for side in SIDES}
    stages = runs["ours"][0]["stages"]
    return {**row, "weights_mib": round(weights_mib, 2), "floor_mib": floor, "rss_budget_mib": round(budget, 1),
            "rss_over_budget": med("ours", "peak_mib") / budget,
            "wall_ratio": med("ours", "wall_s") / med("optimum", "wall_s"),
            "novalidate_wall_ratio": med("ours-novalidate", "wall_s") / med("optimum", "wall_s"),
            "cpu_ratio": med("ours", "cpu_s") / med("optimum", "cpu_s"),
            "rss_ratio_optimum": med("ours", "peak_mib") / med("optimum", "peak_mib"),
            "end_to_end_s": statistics.median(r["end_to_end_s"] or 0.0 for r in runs["ours"]),
            "stage_median_s": {s: statistics.median(r["stages"].get(s, 0.0) for r in runs["ours"]) for s in stages}}


def print_table(s: dict, repeat: int) -> None:
    print(f"\ncann-export PIPELINE_DIR vs optimum-cli export onnx, tiny SD3 (median of {repeat} interleaved rounds)")
    print("| side | wall s | CPU s | peak MiB | wall / Optimum |")
    print("|---|---|---|---|---|")
    opt = s["optimum"]["wall_s"]
    for side, what in (("ours", "cann-export DIR (validation + end-to-end check)"),
                       ("ours-novalidate", "cann-export DIR --no-validate"),
                       ("optimum", "optimum-cli export onnx --task text-to-image"),
                       ("floor", "cann-export trivial.pt2 (the runtime's floor)")):
        r = s[side]
        ratio = f"{r['wall_s'] / opt:.2f}x" if side != "floor" else "-"
        print(f"| {what} | {r['wall_s']:.2f} | {r['cpu_s']:.1f} | {r['peak_mib']:.0f} | {ratio} |")
    flag_w = "" if s["wall_ratio"] <= TARGET_WALL else " (missed)"
    flag_r = "" if s["rss_over_budget"] <= 1.0 else " (missed)"
    print(f"wall: ours {s['wall_ratio']:.2f}x Optimum's (target <= {TARGET_WALL}x){flag_w}; --no-validate "
          f"{s['novalidate_wall_ratio']:.2f}x; CPU {s['cpu_ratio']:.2f}x")
    print(f"peak RSS: ours {s['ours']['peak_mib']:.0f} MiB against {TARGET_RSS_WEIGHTS} x weights "
          f"({s['weights_mib']:.2f} MiB) + floor ({s['floor_mib']:.0f} MiB) = {s['rss_budget_mib']:.0f} MiB: "
          f"{s['rss_over_budget']:.2f} of the budget{flag_r}; {s['rss_ratio_optimum']:.2f}x Optimum's")
    print(f"end-to-end check (diffusers' loop on the exported graphs, fp32 + device emulation): "
          f"{s['end_to_end_s']:.2f} s of ours' {s['ours']['wall_s']:.2f} s")
    print("our stages, summed over the components (s): "
          + ", ".join(f"{k} {v:.2f}" for k, v in s["stage_median_s"].items() if v >= 0.01))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--no-install", action="store_true", help="do not create or add to the Optimum virtualenv")
    ap.add_argument("--venv", type=Path, default=VENV)
    ap.add_argument("--output", type=Path, default=HERE / "results" / "pipeline_vs_optimum.json")
    add_options(ap, OURS_VENV)
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    cli, how = optimum_cli(args.venv, not args.no_install)
    why = with_diffusers(args.venv, not args.no_install) if cli is not None else how
    if cli is None or why:
        print(f"skipped: Optimum cannot run here ({why}); nothing was measured")
        return 0
    ours = our_environment(args, HERE.parent)
    if ours is None:
        return 0
    OUR_BIN[:] = [ours[0]] if ours[0] else []
    ours_env = ours[1]
    tmp = Path(tempfile.mkdtemp(prefix="bench-pipeline-optimum-"))
    try:
        (tmp / "sitecustomize.py").write_text(SITE_CUSTOMIZE)
        env = dict(os.environ, PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        env["PYTHONPATH"] = os.pathsep.join([str(tmp), str(HERE.parent), *filter(None, [env.get("PYTHONPATH")])])
        opt_env = dict(env, PYTHONPATH=str(tmp))
        setup = subprocess.run([str(args.venv / "bin" / "python"), str(HERE / "pipeline_models.py"), str(tmp),
                                "sd3-tiny,trivial"], env=opt_env, capture_output=True, text=True, check=False)
        if setup.returncode != 0:
            raise SystemExit(f"building the pipeline failed:\n{setup.stderr[-3000:]}")
        infos = {d["name"]: d for d in map(json.loads, setup.stdout.strip().splitlines()) if d}
        compiled(env)
        print(f"Optimum {how} in {args.venv}; ours in {ours_env}", file=sys.stderr, flush=True)
        runs = bench(cli, tmp, args, env, opt_env)
        if isinstance(runs, str):
            print(f"skipped: {runs}\nnothing was measured against it")
            return 0
        result = summary(runs, infos["sd3-tiny"]["weights_bytes"])
        print_table(result, args.repeat)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "repeat": args.repeat, "venv": str(args.venv),
            "ours_env": ours_env,
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count()}, "models": infos,
            "summary": result, "runs": runs}, indent=2) + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
