#!/usr/bin/env python
"""Benchmark ``cann-export MODEL --format onnx`` against ``optimum-cli export onnx`` on the same models.

Models (benchmarks/optimum_models.py, random weights from small but realistic configs, written with
``save_pretrained``; nothing is downloaded): thirteen architectures in six families, each with the task a user
exports it for: text encoders (DistilBERT text-classification, BERT feature-extraction, RoBERTa
token-classification), decoders with past (GPT-2 small, a GQA Llama: text-generation-with-past), encoder-decoders
(T5, BART: text2text-generation-with-past), vision (ViT-small/16, ResNet-18, ConvNeXt: image-classification), audio
(Whisper-tiny-sized at its real 3000-frame window: automatic-speech-recognition-with-past; Wav2Vec2 CTC) and
multimodal (CLIP: zero-shot-image-classification). Both sides validate: Optimum by default (onnxruntime against
the PyTorch model at its per-task atol), cann-export by its parity stage (the example's shape, probes and each
dynamic dimension's range ends and middle, fp32 tolerance; the float64 noise floor; every graph of a bundle).

Our side is ``cann-export DIR --format onnx --task T`` when this checkout reads a Hugging Face directory
(``cann_export.hf``), else ``cann-export NAME.pt2 --format onnx`` on a positional torch.export capture of the
same model at the same shapes; the table says which. A task with past writes ``-o OUT`` as a directory of onnx
components (prefill + decode; encoder + decoder + decoder with past), as Optimum writes decoder_model.onnx +
decoder_with_past_model.onnx (and encoder_model.onnx). A model a tool cannot export (a non-zero exit, or past
``--timeout``) is a row saying so, with the reason (the exit code and the last lines it printed), never a crash
of the benchmark (on the .pt2 path, a multi-graph task is our side unavailable).

Optimum runs from a side virtualenv this script makes (``benchmarks/.optimum-venv``, or ``--venv``: optimum-onnx
pinned with the transformers it supports and the same CPU torch, so nothing large downloads, plus torchao at this
environment's version when it is installed here: transformers imports it with every model class, and a user of
this environment has it; our CLI hides it from a model directory's export (cann_export/torchao_hidden.py), so
Optimum pays that import alone, 0.4-0.6 s a model: docs/benchmarks.md gives the ratios with it hidden on both
sides too); when it cannot be installed the benchmark says so and exits 0 without a table.

By default each side runs the command a user types, with nothing but the task: ``cann-export DIR --format onnx
--task T`` (its dynamic axes are the task's: batch and sequence, parity at their ranges' ends and middle) against
``optimum-cli export onnx --model DIR --task T OUT`` (its dummy shapes, one validation set). ``--shapes fixed``
runs both at the model's benchmark shapes instead (ours ``--input-shape``: a static graph with no shape points;
Optimum's dummy-input flags where it has them, its graph still dynamic), which is not the same graph on both sides.
The sides run interleaved (the order rotates), ``--repeat`` rounds; medians of wall time (spawn to exit) and peak
RSS (``os.wait4``'s ``ru_maxrss``: the process and its reaped children, the larger) are reported, with ratios
ours / Optimum; user+sys CPU seconds (the same ``os.wait4``) too, steadier than wall time on a shared machine.
What Optimum skips that we keep has its own columns: a third side, ``cann-export ... --no-validate``, runs in every
round (its ratios are the like-for-like figure; device precision and the ATC lint do not run for ``--format
onnx``), and the checks' own seconds (the CLI's ``checks:`` line summed over a bundle's graphs; a checkout that
prints none: our ``prepare`` + ``validate`` stages). Under the rows (vs_optimum_summary.py): the medians of each
family and of the whole set, each against issue 44's targets (median wall and CPU <= 1.0x, no family above 1.3x,
peak RSS <= 1.2x on every model, ``--no-validate`` <= 0.8x), then our stages' seconds per model. Results go to
``benchmarks/results/vs_optimum.json`` (strict JSON, with the load average at the end of the run).

Both tools run on the same package versions by default (``--ours-env same``, same_env.py): our side runs from a
second venv (``benchmarks/.ours-same-venv``, or ``--ours-venv``) holding exactly Optimum's venv's versions of every
package both import (torch, transformers, onnx, onnxruntime, torchao ...) plus this checkout and the packages only
we need (listed in the output and the JSON), so a ratio measures the tools, not two transformers releases.
``--ours-env here`` runs our side in this interpreter's environment instead (the dev venv: a newer transformers,
and scipy, which scikit-learn brings and transformers imports with every model).

Usage::

    python benchmarks/bench_vs_optimum.py [--repeat 3] [--models distilbert,t5,...] [--ours auto|dir|pt2]
        [--venv DIR] [--ours-env same|here] [--ours-venv DIR] [--timeout S] [--keep-logs DIR]
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

from optimum_models import FLOAT_INPUTS, MODELS
from same_env import add_options, our_environment
from vs_optimum_summary import print_rows, print_stages, print_summary, ratios, summary

HERE = Path(__file__).resolve().parent
VENV = HERE / ".optimum-venv"
OURS_VENV = HERE / ".ours-same-venv"  # --ours-env same: Optimum's package versions plus this checkout
PINS = ["torch==2.13.0", "optimum-onnx[onnxruntime]==0.1.0", "transformers>=4.36,<4.58"]
SIDES = ("ours", "optimum", "ours-novalidate")
SIDE_NAMES = {"ours": "ours", "optimum": "optimum", "ours-novalidate": "novalidate"}  # the row's keys
CHECK_STAGES = ("prepare", "validate")  # the stages that build the parity sets with their reference, and run them
# "[3/12] capture ... torchscript (2.1s)"; a bundle's graphs: "[decode 3/12] capture ... (2.1s)"
STAGE_LINE = re.compile(r"^\[(?:(?P<graph>\S+) )?\d+/\d+\] (?P<stage>\S+) \.\.\. (?P<says>.*) \((?P<s>[\d.]+)s\)$")
# the CLI's steps before the stages: "read config.json (task, graphs) ... done (4.7s)", "plan graphs ... done"
STEP_LINE = re.compile(r"^(?P<stage>[a-z][^\[]*?) \.\.\. done \((?P<s>[\d.]+)s\)$")
CHECKS_LINE = re.compile(r"^checks: ([\d.]+) s\b")  # the CLI's line of what the checks cost, one per graph

SITE_CUSTOMIZE = '''\
import sys

sys.modules.setdefault("torchvision", None)  # its wheel here does not load against the CPU torch; unused
'''


def same_as_ours() -> list[str]:
    """Pins for packages transformers imports at model import when they are installed (torchao: seconds and
    ~85 MiB), and for ml_dtypes (onnx imports it; our package leaves out 0.7.0, whose import takes ~1 s), at this
    environment's versions, so both sides run where a user of this environment runs."""
    from importlib import metadata

    pins = []
    for name in ("torchao", "ml_dtypes"):
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
        probe = subprocess.run([str(venv / "bin" / "pip"), "install", "--dry-run", *pins], capture_output=True,
                               text=True, check=False)  # not -q: it silences the "Would install" line read here
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


OUR_BIN: list[Path] = []  # --ours-env same: the bin directory of the venv our side runs in


def our_cli() -> list[str]:
    exe = (OUR_BIN[0] if OUR_BIN else Path(sys.executable).parent) / "cann-export"
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
    return "float32" if name in FLOAT_INPUTS else "int64"


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
    """Seconds per stage (and per step before the stages), summed over a bundle's graphs; each graph's own
    under ``GRAPH:STAGE`` too."""
    found: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = STAGE_LINE.match(line.strip()) or STEP_LINE.match(line.strip())
        if not m:
            continue
        keys = [m["stage"]]
        if m.re is STAGE_LINE and m["graph"]:
            keys.append(f"{m['graph']}:{m['stage']}")
        for key in keys:
            found[key] = round(found.get(key, 0.0) + float(m["s"]), 3)
    return found


def parity_sets(log: Path) -> int:
    """The input sets our parity judged, over every graph (the prepare stage's lines: "N input sets ...")."""
    total = 0
    for line in log.read_text(errors="replace").splitlines():
        m = STAGE_LINE.match(line.strip())
        if m and m["stage"] == "prepare" and (n := re.match(r"(\d+) input sets", m["says"])):
            total += int(n.group(1))
    return total


def failure(m: dict, log: Path, timeout: float) -> str:
    """Why a side's run failed, in one line: the timeout, or its exit code and the last lines it printed."""
    if m["wall_s"] >= timeout:
        return f"timed out after {timeout:.0f} s"
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return f"exit {m['rc']}: " + " / ".join(lines[-3:])[-400:]


def checks_seconds(log: Path, stage_s: dict[str, float]) -> float:
    """The checks' own cost: the CLI's "checks: N s" lines summed over a bundle's graphs, or (a checkout that
    prints none) the prepare + validate stages' seconds."""
    found = [float(m.group(1)) for line in log.read_text(errors="replace").splitlines()
             if (m := CHECKS_LINE.match(line.strip()))]
    return round(sum(found), 2) if found else round(sum(stage_s.get(s, 0.0) for s in CHECK_STAGES), 2)


def bench(name: str, info: dict, tmp: Path, cli: Path, path_kind: str, args: argparse.Namespace,
          env: dict, opt_env: dict) -> dict:
    """One model: the three sides, ``--repeat`` rounds in rotating order; a side that fails is a reason, not a
    crash, and is not run again."""
    fixed = args.shapes == "fixed" or path_kind == "pt2"  # a .pt2 is captured at the benchmark's shapes
    probe = our_command(name, info, tmp, path_kind, tmp / "probe", fixed=fixed)
    unavailable = {side: probe for side in ("ours", "ours-novalidate") if isinstance(probe, str)}
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for rep in range(args.repeat):
        for side in SIDES[rep % 3:] + SIDES[:rep % 3]:  # the order rotates
            if side in unavailable:
                continue
            out = tmp / f"{name}-{side}-{rep}"
            cmd = (optimum_command(cli, name, info, tmp, out, fixed) if side == "optimum" else
                   our_command(name, info, tmp, path_kind, out / "model.onnx", validate=side == "ours", fixed=fixed))
            log = tmp / f"{name}-{side}-{rep}.log"
            m = run_measured(cmd, env if side.startswith("ours") else opt_env, log, args.timeout)
            shutil.rmtree(out, ignore_errors=True)
            if args.keep_logs:
                shutil.copy(log, args.keep_logs / log.name)
            if m["rc"] != 0:
                unavailable[side] = failure(m, log, args.timeout)
                print(f"  {name} {rep + 1}/{args.repeat} {side:15s} failed: {unavailable[side]}", file=sys.stderr,
                      flush=True)
                continue
            if side.startswith("ours"):
                m["stages"] = stages(log)
                m["input_sets"] = parity_sets(log)
                m["checks_s"] = checks_seconds(log, m["stages"])
            runs[side].append(m)
            print(f"  {name} {rep + 1}/{args.repeat} {side:15s} {m['wall_s']:7.2f} s {m['peak_mib']:8.1f} MiB "
                  f"cpu {m['cpu_s']:.1f} s", file=sys.stderr, flush=True)
    return row_of(info, path_kind, runs, unavailable)


def row_of(info: dict, path_kind: str, runs: dict[str, list[dict]], unavailable: dict[str, str]) -> dict:
    """A model's row: each side's medians (a side that failed in any round: its reason instead), the ratios."""
    def med(side: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[side])

    row: dict = {"family": info["family"], "task": info["task"], "about": info["about"], "path": path_kind,
                 "runs": runs, "unavailable": {SIDE_NAMES[s]: why for s, why in unavailable.items()}}
    for side in SIDES:
        if runs[side] and side not in unavailable:
            row[SIDE_NAMES[side]] = {k: med(side, k) for k in ("wall_s", "cpu_s", "peak_mib")}
    if "ours" in row:
        names = list(runs["ours"][0]["stages"])
        row["stage_median_s"] = {s: statistics.median(r["stages"].get(s, 0.0) for r in runs["ours"]) for s in names}
        row["checks_s"] = med("ours", "checks_s")
        row["input_sets"] = runs["ours"][0]["input_sets"]
    row["ratios"] = {k: round(v, 3) for k, v in ratios(row).items()}
    return row


def compiled(env: dict) -> None:
    """Our package's bytecode, written once before any run: pip compiles an installed package (Optimum's side
    venv has its .pyc files), but an editable checkout under PYTHONDONTWRITEBYTECODE would recompile our
    modules in every measured run (0.5-0.9 s CPU)."""
    python = OUR_BIN[0] / "python" if OUR_BIN else Path(sys.executable)
    subprocess.run([str(python), "-m", "compileall", "-q", str(HERE.parent / "cann_export")],
                   env=env, capture_output=True, check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--models", default=",".join(MODELS), help=f"a subset of {','.join(MODELS)}")
    ap.add_argument("--ours", choices=("auto", "dir", "pt2"), default="auto",
                    help="our input: the model directory (needs cann_export.hf) or a .pt2 capture")
    ap.add_argument("--shapes", choices=("default", "fixed"), default="default",
                    help="default: each tool's own command with the task only; fixed: both at the benchmark's "
                         "input shapes (ours static)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds one side's run may take")
    ap.add_argument("--no-install", action="store_true", help="do not create the Optimum virtualenv")
    ap.add_argument("--venv", type=Path, default=VENV)
    add_options(ap, OURS_VENV)
    ap.add_argument("--output", type=Path, default=HERE / "results" / "vs_optimum.json")
    ap.add_argument("--keep-logs", type=Path, help="a directory to copy every run's output to (NAME-SIDE-ROUND.log)")
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    if not models or set(models) - set(MODELS) or args.repeat < 1:
        ap.error(f"--models takes a subset of {','.join(MODELS)}; --repeat must be >= 1")
    if args.keep_logs:
        args.keep_logs.mkdir(parents=True, exist_ok=True)
    cli, how = optimum_cli(args.venv, not args.no_install)
    if cli is None:
        print(f"skipped: Optimum is not available ({how}); nothing was measured")
        return 0
    ours = our_environment(args, HERE.parent)
    if ours is None:
        return 0
    OUR_BIN[:] = [ours[0]] if ours[0] else []
    args.ours_env_text = ours_env = ours[1]
    tmp = Path(tempfile.mkdtemp(prefix="bench-optimum-"))
    try:
        (tmp / "sitecustomize.py").write_text(SITE_CUSTOMIZE)
        env = dict(os.environ, PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        env["PYTHONPATH"] = os.pathsep.join([str(tmp), str(HERE.parent), *filter(None, [env.get("PYTHONPATH")])])
        opt_env = dict(env, PYTHONPATH=str(tmp))
        path_kind = args.ours if args.ours != "auto" else ("dir" if reads_directories(env) else "pt2")
        infos = build_models(tmp, models, path_kind, env)
        compiled(env)
        print(f"ours via {path_kind} in {ours_env}; Optimum {how} in {args.venv}", file=sys.stderr, flush=True)
        rows = {n: bench(n, infos[n], tmp, cli, path_kind, args, env, opt_env) for n in models}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result = summary(rows)
    print_rows(rows, f"cann-export --format onnx vs optimum-cli export onnx (median of {args.repeat} interleaved "
                     f"rounds; shapes: {args.shapes}; ours via {path_kind}; ours in {args.ours_env})")
    print_summary(result)
    print_stages(rows)
    write_json(args, path_kind, {n: {**infos[n], **rows[n]} for n in models}, result)
    return 0


def build_models(tmp: Path, models: list[str], path_kind: str, env: dict) -> dict[str, dict]:
    """The models' directories under ``tmp`` (and their .pt2 captures for the .pt2 path), with their facts."""
    cmd = [sys.executable, str(HERE / "optimum_models.py"), str(tmp), ",".join(models)]
    setup = subprocess.run([*cmd, *(["--pt2"] if path_kind == "pt2" else [])], env=env, capture_output=True,
                           text=True, check=False)
    if setup.returncode != 0:
        raise SystemExit(f"building the models failed:\n{setup.stderr[-3000:]}")
    return {d["name"]: d for d in map(json.loads, setup.stdout.strip().splitlines()) if d}


def write_json(args: argparse.Namespace, path_kind: str, models: dict[str, dict], result: dict) -> None:
    """The results, strict JSON (no NaN or Infinity), written whole or not at all."""
    text = json.dumps({
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "repeat": args.repeat, "shapes": args.shapes,
        "ours_via": path_kind, "ours_env": args.ours_env_text, "load_average": os.getloadavg(),
        "optimum_pins": PINS, "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        **result, "models": models}, indent=2, allow_nan=False) + "\n"
    args.output.parent.mkdir(parents=True, exist_ok=True)
    partial = args.output.with_name(args.output.name + ".partial")
    partial.write_text(text)
    partial.replace(args.output)
    print(f"\nwrote {args.output}")


if __name__ == "__main__":
    raise SystemExit(main())
