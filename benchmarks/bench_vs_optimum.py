#!/usr/bin/env python
"""Benchmark ``cann-export MODEL --format onnx`` against ``optimum-cli export onnx`` on the same models.

Models (benchmarks/optimum_models.py, random weights from configs, written with ``save_pretrained``; nothing is
downloaded): DistilBERT 4 layers dim 256 seq 128 (text-classification), ViT-small/16 (image-classification),
GPT-2 small (text-generation-with-past). Both sides validate: Optimum by default (onnxruntime against the
PyTorch model at its per-task atol), cann-export by its parity stage (the example's shape, probes and each dynamic
dimension's range ends and middle, fp32 tolerance; the float64 noise floor; the line under the table counts the sets).

Our side is ``cann-export DIR --format onnx --task T`` when this checkout reads a Hugging Face directory
(``cann_export.hf``), else ``cann-export NAME.pt2 --format onnx`` on a positional torch.export capture of the
same model at the same shapes (the path the issue measured); the table says which. GPT-2 with past is
``cann-export DIR --format onnx --task text-generation-with-past -o OUT``: a directory of prefill + decode onnx
components, as Optimum writes decoder_model.onnx + decoder_with_past_model.onnx. A task this checkout cannot
export is a row marked unavailable, with the reason.

Optimum runs from a side virtualenv this script makes (``benchmarks/.optimum-venv``: optimum-onnx pinned with the
transformers it supports and the same CPU torch, so nothing large downloads, plus torchao at this environment's
version when it is installed here: transformers imports it with every model, so both sides pay that); when it
cannot be installed the benchmark says so and exits 0 without a table.

By default each side runs the command a user types, with nothing but the task: ``cann-export DIR --format onnx
--task T`` (its dynamic axes are the task's: batch and sequence, parity at their ranges' ends and middle) against
``optimum-cli export onnx --model DIR --task T OUT`` (its dummy shapes, one validation set). ``--shapes fixed``
runs both at the model's benchmark shapes instead (ours ``--input-shape``: a static graph with no shape points;
Optimum's dummy-input flags, its graph still dynamic), which is not the same graph on both sides. The sides run
interleaved (the order rotates), ``--repeat`` rounds; medians of wall time (spawn to exit) and peak RSS
(``os.wait4``'s ``ru_maxrss``: the process and its reaped children, the larger) are reported, with ratios
ours / Optimum; user+sys CPU seconds (the same ``os.wait4``) too, steadier than wall time on a shared machine.
What Optimum skips that we keep is its own line: a third side, ``cann-export ... --no-validate``, runs in every
round (device precision and the ATC lint do not run for ``--format onnx``), and the seconds our ``prepare`` and
``validate`` stages took (the parity sets' eager reference and their onnxruntime runs) are printed with what the
rest of our run is against Optimum's whole run (derived from the stage times). Results go to
``benchmarks/results/vs_optimum.json``.

Usage::

    python benchmarks/bench_vs_optimum.py [--repeat 3] [--models distilbert,vit,gpt2] [--ours auto|dir|pt2]
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

HERE = Path(__file__).resolve().parent
VENV = HERE / ".optimum-venv"
PINS = ["torch==2.13.0", "optimum-onnx[onnxruntime]==0.1.0", "transformers>=4.36,<4.58"]
MODELS = ("distilbert", "vit", "gpt2")
TARGET_WALL, TARGET_RSS = 1.0, 1.2
CHECK_STAGES = ("prepare", "validate")  # the stages that build the parity sets with their reference, and run them
STAGE_LINE = re.compile(r"^\[(\d+)/\d+\] (\S+) \.\.\. (.*) \(([\d.]+)s\)\s*$")

SITE_CUSTOMIZE = '''\
import sys

sys.modules.setdefault("torchvision", None)  # its wheel here does not load against the CPU torch; unused
'''


def same_as_ours() -> list[str]:
    """Pins for packages transformers imports at model import when they are installed (torchao: seconds and
    ~85 MiB), at this environment's versions, so both sides pay the same import costs."""
    from importlib import metadata

    pins = []
    for name in ("torchao",):
        try:
            pins.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    return pins


def optimum_cli(venv: Path, install: bool) -> tuple[Path | None, str]:
    """The side venv's optimum-cli, made when missing (and ``install``); or None and why not."""
    cli = venv / "bin" / "optimum-cli"
    pins = [*PINS, *same_as_ours()]
    if cli.exists():
        probe = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--dry-run", *pins], capture_output=True,
                               text=True, check=False)
        if "Would install" not in probe.stdout:
            return cli, "present"
    if not install:
        return None, f"{cli} is missing (or lacks {' '.join(pins)}) and --no-install was given"
    try:
        if not cli.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, text=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *pins], check=True, capture_output=True,
                       text=True, timeout=1800)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        err = getattr(e, "stderr", "") or str(e)
        shutil.rmtree(venv, ignore_errors=True)
        return None, f"pip install {' '.join(PINS)} failed: {err.strip().splitlines()[-1] if err.strip() else e}"
    return (cli, "installed") if cli.exists() else (None, "optimum-cli not found after the install")


def run_measured(cmd: list[str], env: dict, log: Path, timeout: float) -> dict:
    """Spawn ``cmd`` (stdout+stderr to ``log``), reap it with os.wait4: wall seconds, peak RSS MiB, rc."""
    with open(log, "wb") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - start > timeout:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.005)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    kib = usage.ru_maxrss / 1024 if sys.platform == "darwin" else usage.ru_maxrss
    return {"wall_s": round(wall, 3), "peak_mib": round(kib / 1024, 1), "rc": proc.returncode,
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 2)}


def tail(path: Path, n: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


def our_cli() -> list[str]:
    exe = Path(sys.executable).with_name("cann-export")
    return [str(exe)] if exe.exists() else [shutil.which("cann-export") or "cann-export"]


def reads_directories(env: dict) -> bool:
    """Whether this checkout's cann-export takes a Hugging Face directory (the ``hf`` work has landed)."""
    code = "import importlib.util as u; print(bool(u.find_spec('cann_export.hf')))"
    probe = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    return probe.stdout.strip() == "True"


def our_command(name: str, info: dict, tmp: Path, path_kind: str, out: Path, validate: bool = True,
                fixed: bool = False) -> list[str] | str:
    """Our side's command (the task only; ``fixed``: at the benchmark's input shapes, a static graph), or why this
    checkout cannot export the model."""
    extra = [] if validate else ["--no-validate"]
    if path_kind == "dir" and info["task"].endswith("-with-past"):  # prefill + decode: a multi-graph bundle of
        # onnx components (like Optimum's directory of decoder_model.onnx + decoder_with_past_model.onnx), each
        # with its own parity; the graphs' example shapes are the bundle's own (prompt 7, batch 2)
        return [*our_cli(), str(tmp / name), "--format", "onnx", "--task", info["task"], "-o",
                str(out.with_suffix("")), "--overwrite", *extra]
    if path_kind == "dir" and not fixed:
        return [*our_cli(), str(tmp / name), "--format", "onnx", "--task", info["task"], "-o", str(out),
                "--overwrite", *extra]
    if path_kind == "dir":
        shapes = [a for n, dims in info["inputs"].items()
                  for a in ("--input-shape", f"{n}:{','.join(map(str, dims))}:{_dtype(n)}")]
        return [*our_cli(), str(tmp / name), "--format", "onnx", "--task", info["task"], *shapes, "-o", str(out),
                "--overwrite", *extra]
    if info["task"].endswith("-with-past"):
        return ("unavailable: a decoder with past exports as prefill + decode graphs (the multi-graph bundle), "
                "which needs a Hugging Face directory and the multi-graph work; neither is in this checkout")
    return [*our_cli(), str(tmp / f"{name}.pt2"), "--format", "onnx", "-o", str(out), "--overwrite", *extra]


def _dtype(name: str) -> str:
    return "float32" if name == "pixel_values" else "int64"


def optimum_command(cli: Path, name: str, info: dict, tmp: Path, out: Path, fixed: bool = False) -> list[str]:
    """optimum-cli with the task only (``fixed``: at the benchmark's input shapes, its dummy-input flags)."""
    cmd = [str(cli), "export", "onnx", "--model", str(tmp / name), "--task", info["task"]]
    if not fixed:
        return [*cmd, str(out)]
    if "input_ids" in info["inputs"]:
        batch, seq = info["inputs"]["input_ids"]
        cmd += ["--batch_size", str(batch), "--sequence_length", str(seq)]
    if "pixel_values" in info["inputs"]:
        batch, channels, height, width = info["inputs"]["pixel_values"]
        cmd += ["--batch_size", str(batch), "--num_channels", str(channels), "--height", str(height),
                "--width", str(width)]
    return [*cmd, str(out)]


def stages(log: Path) -> dict[str, float]:
    """Seconds per stage, summed over a multi-graph export's components (and a stage run twice)."""
    found: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = STAGE_LINE.match(line.strip())
        if m:
            found[m.group(2)] = found.get(m.group(2), 0.0) + float(m.group(4))
    return found


def parity_sets(log: Path) -> int:
    """The input sets our parity judged, over every graph (the prepare stage's lines: "N input sets ...")."""
    total = 0
    for line in log.read_text(errors="replace").splitlines():
        m = STAGE_LINE.match(line.strip())
        if m and m.group(2) == "prepare" and (n := re.match(r"(\d+) input sets", m.group(3))):
            total += int(n.group(1))
    return total


def bench(name: str, info: dict, tmp: Path, cli: Path, path_kind: str, args: argparse.Namespace,
          env: dict, opt_env: dict) -> dict:
    fixed = args.shapes == "fixed" or path_kind == "pt2"  # a .pt2 is captured at the benchmark's shapes
    ours_probe = our_command(name, info, tmp, path_kind, tmp / "probe", fixed=fixed)
    sides = ("ours", "optimum", "ours-novalidate")
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for rep in range(args.repeat):
        for side in sides[rep % 3:] + sides[:rep % 3]:  # the order rotates
            if side.startswith("ours") and isinstance(ours_probe, str):
                continue
            out = tmp / f"{name}-{side}-{rep}"
            cmd = (optimum_command(cli, name, info, tmp, out, fixed) if side == "optimum" else
                   our_command(name, info, tmp, path_kind, out / "model.onnx", validate=side == "ours", fixed=fixed))
            log = tmp / f"{name}-{side}-{rep}.log"
            m = run_measured(cmd, env if side.startswith("ours") else opt_env, log, args.timeout)
            if m["rc"] != 0 and side.startswith("ours") and not runs["ours"]:  # this checkout cannot export it
                ours_probe = f"unavailable: cann-export exit {m['rc']}: {tail(log, 4)}"
                continue
            if m["rc"] != 0:
                raise SystemExit(f"{side} run for {name} failed (rc {m['rc']}): {' '.join(cmd)}\n{tail(log)}")
            if side.startswith("ours"):
                m["stages"] = stages(log)
                m["input_sets"] = parity_sets(log)
            runs[side].append(m)
            shutil.rmtree(out, ignore_errors=True)
            print(f"  {name} {rep + 1}/{args.repeat} {side:15s} {m['wall_s']:7.2f} s {m['peak_mib']:8.1f} MiB "
                  f"cpu {m['cpu_s']:.1f} s", file=sys.stderr, flush=True)

    def med(side: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[side])

    row = {"task": info["task"], "about": info["about"], "path": path_kind, "runs": runs,
           "optimum_wall_s": med("optimum", "wall_s"), "optimum_peak_mib": med("optimum", "peak_mib"),
           "optimum_cpu_s": med("optimum", "cpu_s")}
    if isinstance(ours_probe, str):
        return {**row, "unavailable": ours_probe}
    names = list(runs["ours"][0]["stages"])
    return {**row, "ours_wall_s": med("ours", "wall_s"), "ours_peak_mib": med("ours", "peak_mib"),
            "ours_cpu_s": med("ours", "cpu_s"), "wall_ratio": med("ours", "wall_s") / row["optimum_wall_s"],
            "rss_ratio": med("ours", "peak_mib") / row["optimum_peak_mib"],
            "cpu_ratio": med("ours", "cpu_s") / row["optimum_cpu_s"],
            "novalidate_wall_s": med("ours-novalidate", "wall_s"), "novalidate_cpu_s": med("ours-novalidate", "cpu_s"),
            "novalidate_peak_mib": med("ours-novalidate", "peak_mib"),
            "stage_median_s": {s: statistics.median(r["stages"].get(s, 0.0) for r in runs["ours"]) for s in names},
            "input_sets": runs["ours"][0]["input_sets"]}


def print_table(rows: dict[str, dict], args: argparse.Namespace) -> None:
    print(f"\ncann-export --format onnx vs optimum-cli export onnx (median of {args.repeat} interleaved pairs; "
          f"shapes: {args.shapes})")
    print("| model | ours via | ours wall s | Optimum wall s | wall ratio | ours MiB | Optimum MiB | RSS ratio "
          "| CPU s ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        if "unavailable" in r:
            print(f"| {name} ({r['task']}) | - | - | {r['optimum_wall_s']:.2f} | unavailable | - | "
                  f"{r['optimum_peak_mib']:.0f} | unavailable | - |")
            continue
        flag_w = "" if r["wall_ratio"] <= TARGET_WALL else " !"
        flag_r = "" if r["rss_ratio"] <= TARGET_RSS else " !"
        print(f"| {name} ({r['task']}) | {r['path']} | {r['ours_wall_s']:.2f} | {r['optimum_wall_s']:.2f} | "
              f"{r['wall_ratio']:.2f}{flag_w} | {r['ours_peak_mib']:.0f} | {r['optimum_peak_mib']:.0f} | "
              f"{r['rss_ratio']:.2f}{flag_r} | {r['cpu_ratio']:.2f} |")
    print(f"targets: wall <= {TARGET_WALL}x, peak RSS <= {TARGET_RSS}x Optimum ('!' = missed)")
    for name, r in rows.items():
        if "unavailable" in r:
            print(f"  {name}: {r['unavailable']}")
            continue
        st = r["stage_median_s"]
        print(f"  {name} our stages (s): " + ", ".join(f"{s} {v:.2f}" for s, v in st.items() if v >= 0.01))
        print(f"  {name} what Optimum skips that we keep: our validation (the fp32 reference on {r['input_sets']} "
              "input sets over the graphs: the example's shape, probes, each dynamic dimension's range ends and "
              "middle; the float64 noise floor; onnxruntime parity on the written files; Optimum checks 1 set per "
              "graph): "
              f"without it (--no-validate) ours takes {r['novalidate_wall_s']:.2f} s wall "
              f"({r['novalidate_wall_s'] / r['optimum_wall_s']:.2f}x), {r['novalidate_cpu_s']:.1f} s CPU "
              f"({r['novalidate_cpu_s'] / r['optimum_cpu_s']:.2f}x), {r['novalidate_peak_mib']:.0f} MiB "
              f"({r['novalidate_peak_mib'] / r['optimum_peak_mib']:.2f}x); device precision and the ATC lint run "
              "only for atc_ready/om, not --format onnx")
        checks = sum(st.get(s, 0.0) for s in CHECK_STAGES)
        print(f"  {name} the checks' stages (prepare: the inputs and the eager reference on every set; validate: "
              f"onnxruntime parity) took {checks:.2f} s of our {r['ours_wall_s']:.2f}; the rest, "
              f"{r['ours_wall_s'] - checks:.2f} s, is {(r['ours_wall_s'] - checks) / r['optimum_wall_s']:.2f}x "
              "Optimum's whole run (derived from the stage times, not a run of its own)")


def compiled(env: dict) -> None:
    """Our package's bytecode, written once before any run: pip compiles an installed package (Optimum's side
    venv has its .pyc files), but an editable checkout under PYTHONDONTWRITEBYTECODE would recompile our
    modules in every measured run (0.5-0.9 s CPU)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(HERE.parent / "cann_export")],
                   env=env, capture_output=True, check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--ours", choices=("auto", "dir", "pt2"), default="auto",
                    help="our input: the model directory (needs cann_export.hf) or a .pt2 capture")
    ap.add_argument("--shapes", choices=("default", "fixed"), default="default",
                    help="default: each tool's own command with the task only; fixed: both at the benchmark's "
                         "input shapes (ours static)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--no-install", action="store_true", help="do not create the Optimum virtualenv")
    ap.add_argument("--venv", type=Path, default=VENV)
    ap.add_argument("--output", type=Path, default=HERE / "results" / "vs_optimum.json")
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    if not models or set(models) - set(MODELS) or args.repeat < 1:
        ap.error(f"--models takes a subset of {','.join(MODELS)}; --repeat must be >= 1")
    cli, how = optimum_cli(args.venv, not args.no_install)
    if cli is None:
        print(f"skipped: Optimum is not available ({how}); nothing was measured")
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="bench-optimum-"))
    try:
        (tmp / "sitecustomize.py").write_text(SITE_CUSTOMIZE)
        env = dict(os.environ, PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        env["PYTHONPATH"] = os.pathsep.join([str(tmp), str(HERE.parent), *filter(None, [env.get("PYTHONPATH")])])
        opt_env = dict(env, PYTHONPATH=str(tmp))
        setup = subprocess.run([sys.executable, str(HERE / "optimum_models.py"), str(tmp), ",".join(models)],
                               env=env, capture_output=True, text=True, check=False)
        if setup.returncode != 0:
            raise SystemExit(f"building the models failed:\n{setup.stderr[-3000:]}")
        infos = {d["name"]: d for d in map(json.loads, setup.stdout.strip().splitlines()) if d}
        path_kind = args.ours if args.ours != "auto" else ("dir" if reads_directories(env) else "pt2")
        compiled(env)
        print(f"ours via {path_kind}; Optimum {how} in {args.venv}", file=sys.stderr, flush=True)
        rows = {n: bench(n, infos[n], tmp, cli, path_kind, args, env, opt_env) for n in models}
        print_table(rows, args)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "repeat": args.repeat, "shapes": args.shapes,
            "ours_via": path_kind,
            "optimum_pins": PINS, "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
            "models": {n: {**infos[n], **rows[n]} for n in models}}, indent=2) + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
