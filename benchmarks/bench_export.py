#!/usr/bin/env python
"""Benchmark ``cann-export MODEL --format onnx`` against the raw toolchain it wraps.

For each model (a 4-layer BERT and a ResNet-50, both from ``transformers`` configs with random
weights, nothing downloaded) this runs, each as its own subprocess:

* raw:      build the module + load the safetensors weights, ``torch.onnx.export(dynamo=True,
            opset_version=OPSET)``, ``onnxsim.simplify``, ``onnx.save``, one onnxruntime
            (CPU) run and a numpy comparison with the torch eager output;
* pipeline: ``cann-export WEIGHTS.safetensors --format onnx --model-class benchmodels:FN
            --example-inputs INPUTS.safetensors --opset OPSET``.

Wall time is measured from spawn to exit (interpreter start and imports included on both sides).
Peak RSS is the child's own ``ru_maxrss`` as returned by ``os.wait4`` on its pid. The parent
process deliberately imports nothing heavy (no torch): on Linux, a child's ``ru_maxrss`` can
inherit the high-water mark of the process it was forked/vforked from, so a fat parent would
inflate every measurement. The model files are built in a separate setup subprocess for that reason.

Each side runs ``--repeat`` times (the order alternates per repeat) and medians are reported.
``cann-export --help`` wall time is measured too (median of ``--help-runs``).

Results go to ``benchmarks/results/export.json``.

Usage::

    python benchmarks/bench_export.py [--repeat 3] [--opset 17] [--models bert,resnet50]
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
DEFAULT_RESULTS = HERE / "results" / "export.json"
MODELS = ("bert", "resnet50")
TARGET_WALL_RATIO = 1.15
TARGET_RSS_RATIO = 1.2
TARGET_HELP_S = 0.3

# --- files written into the temp dir -----------------------------------------------------------

MODEL_MODULE = '''\
"""Factories for the benchmark models; importable as ``benchmodels`` (the temp dir is on PYTHONPATH)."""


def bert():
    from transformers import BertConfig, BertModel

    cfg = BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
                     intermediate_size=1024, vocab_size=30522)
    return BertModel(cfg)


def resnet50():
    from transformers import ResNetConfig, ResNetForImageClassification

    return ResNetForImageClassification(ResNetConfig())  # defaults: the ResNet-50 layout
'''

# Every subprocess has the temp dir on PYTHONPATH, so this runs at its start-up: torchvision's PyPI wheel does not
# load against the CPU torch and transformers imports it where installed; these models never need it.
SITE_CUSTOMIZE = '''\
import sys

sys.modules.setdefault("torchvision", None)
'''

SETUP_SCRIPT = '''\
"""Build each model with random weights and save weights + example inputs as safetensors."""
import json
import sys

import torch
from safetensors.torch import save_file

import benchmodels

out_dir, models = sys.argv[1], sys.argv[2].split(",")
info = {}
for name in models:
    torch.manual_seed(0)
    model = getattr(benchmodels, name)().eval()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, f"{out_dir}/{name}.safetensors")
    if name == "bert":
        g = torch.Generator().manual_seed(1)
        inputs = {"input_ids": torch.randint(0, 30522, (1, 128), generator=g, dtype=torch.int64),
                  "attention_mask": torch.ones(1, 128, dtype=torch.int64)}
    else:
        g = torch.Generator().manual_seed(1)
        inputs = {"pixel_values": torch.randn(1, 3, 224, 224, generator=g)}
    save_file(inputs, f"{out_dir}/{name}_inputs.safetensors")
    info[name] = {"parameters": sum(p.numel() for p in model.parameters()),
                  "weights_bytes": sum(v.numel() * v.element_size() for v in state.values()),
                  "inputs": {k: [list(v.shape), str(v.dtype)] for k, v in inputs.items()}}

import onnx, onnxruntime, onnxscript, onnxsim, transformers
info["_versions"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                     "onnx": onnx.__version__, "onnxscript": onnxscript.__version__,
                     "onnxsim": getattr(onnxsim, "__version__", "?"), "onnxruntime": onnxruntime.__version__}
print(json.dumps(info))
'''

RAW_SCRIPT = '''\
"""The raw toolchain: export (dynamo) + onnxsim + one onnxruntime run + numpy comparison."""
import json
import sys
import time

t0 = time.perf_counter()
import numpy as np
import onnx
import onnxruntime as ort
import onnxsim
import torch
from safetensors.torch import load_file

import benchmodels

name, weights, inputs_file, opset, out_path, report_path = sys.argv[1:7]
phases = {"imports": time.perf_counter() - t0}

t = time.perf_counter()
model = getattr(benchmodels, name)()
model.load_state_dict(load_file(weights), strict=True)
model.eval()
feed = load_file(inputs_file)
phases["load"] = time.perf_counter() - t

t = time.perf_counter()
with torch.no_grad():
    out = model(**feed)
ref = [v.detach().numpy() for v in (out.to_tuple() if hasattr(out, "to_tuple") else out)]
phases["torch_forward"] = time.perf_counter() - t

t = time.perf_counter()
program = torch.onnx.export(model, (), kwargs=feed, dynamo=True, opset_version=int(opset))
proto = program.model_proto
phases["export"] = time.perf_counter() - t

t = time.perf_counter()
simplified, ok = onnxsim.simplify(proto)
assert ok, "onnxsim check failed"
phases["simplify"] = time.perf_counter() - t

t = time.perf_counter()
onnx.save(simplified, out_path)
phases["save"] = time.perf_counter() - t

t = time.perf_counter()
sess = ort.InferenceSession(out_path, providers=["CPUExecutionProvider"])
got = sess.run(None, {i.name: feed[i.name].numpy() for i in sess.get_inputs()})
phases["ort_run"] = time.perf_counter() - t

t = time.perf_counter()
assert len(got) == len(ref), (len(got), len(ref))
max_abs = [float(np.max(np.abs(np.asarray(a) - b))) for a, b in zip(got, ref)]
close = all(np.allclose(np.asarray(a), b, atol=1e-4, rtol=1e-3) for a, b in zip(got, ref))
phases["compare"] = time.perf_counter() - t

with open(report_path, "w") as f:
    json.dump({"phases": phases, "max_abs": max_abs, "allclose": close,
               "opset": [o.version for o in simplified.opset_import if o.domain in ("", "ai.onnx")]}, f)
'''

STAGE_LINE = re.compile(r"^\[(\d+)/\d+\] (\S+) \.\.\. (.*) \(([\d.]+)s\)\s*$")


# --- measurement ---------------------------------------------------------------------------------

def run_measured(cmd: list[str], env: dict[str, str], stdout_path: Path, stderr_path: Path,
                 timeout: float) -> dict:
    """Spawn ``cmd``, reap it with os.wait4 and return wall seconds, the child's peak RSS and rc."""
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
        deadline = start + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.005)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)  # keep Popen from reaping again
    # Linux reports ru_maxrss in KiB (macOS in bytes).
    kib = usage.ru_maxrss / 1024 if sys.platform == "darwin" else usage.ru_maxrss
    return {"wall_s": round(wall, 3), "peak_mib": round(kib / 1024, 1), "rc": proc.returncode,
            "user_s": round(usage.ru_utime, 2), "sys_s": round(usage.ru_stime, 2)}


def parse_stages(stderr_path: Path) -> dict[str, dict]:
    stages = {}
    for line in stderr_path.read_text(errors="replace").splitlines():
        m = STAGE_LINE.match(line.strip())
        if m:
            stages[m.group(2)] = {"status": m.group(3), "seconds": float(m.group(4))}
    return stages


def tail(path: Path, n: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def cli_command() -> list[str]:
    exe = Path(sys.executable).with_name("cann-export")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("cann-export")
    if found:
        return [found]
    return [sys.executable, "-c",
            "import sys; from cann_export.cli.main import main; sys.argv[0] = 'cann-export'; main()"]


def median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def bench_model(name: str, tmp: Path, env: dict[str, str], args: argparse.Namespace) -> dict:
    weights, inputs = tmp / f"{name}.safetensors", tmp / f"{name}_inputs.safetensors"
    raw_script = tmp / "raw_export.py"
    runs: dict[str, list[dict]] = {"raw": [], "pipeline": []}
    for rep in range(args.repeat):
        order = ("raw", "pipeline") if rep % 2 == 0 else ("pipeline", "raw")
        for side in order:
            tag = f"{name}_{side}_{rep}"
            out_onnx = tmp / f"{tag}.onnx"
            report = tmp / f"{tag}.report.json"
            if side == "raw":
                cmd = [sys.executable, str(raw_script), name, str(weights), str(inputs), str(args.opset),
                       str(out_onnx), str(report)]
            else:
                cmd = [*cli_command(), str(weights), "--format", "onnx", "-o", str(out_onnx),
                       "--model-class", f"benchmodels:{name}", "--example-inputs", str(inputs),
                       "--opset", str(args.opset), "--overwrite", "--json"]
            stdout_path, stderr_path = tmp / f"{tag}.stdout", tmp / f"{tag}.stderr"
            m = run_measured(cmd, env, stdout_path, stderr_path, args.timeout)
            if m["rc"] != 0:
                raise SystemExit(f"{side} run for {name} failed (rc {m['rc']}):\n{tail(stderr_path)}")
            if side == "raw":
                m["detail"] = json.loads(report.read_text())
                if not m["detail"]["allclose"]:
                    print(f"warning: raw {name}: onnxruntime output differs from torch "
                          f"(max_abs {m['detail']['max_abs']})", file=sys.stderr)
            else:
                m["stages"] = parse_stages(stderr_path)
                try:
                    result = json.loads(stdout_path.read_text().strip().splitlines()[-1])
                    m["ok"], m["onnx"] = result.get("ok"), result.get("onnx")
                    m["parity_passed"] = (result.get("parity") or {}).get("passed")
                except (ValueError, IndexError):
                    m["ok"] = None
            m["onnx_bytes"] = out_onnx.stat().st_size if out_onnx.exists() else None
            runs[side].append(m)
            print(f"  {name} rep {rep + 1}/{args.repeat} {side:8s}: {m['wall_s']:7.2f} s  "
                  f"{m['peak_mib']:8.1f} MiB", file=sys.stderr, flush=True)
            for p in (out_onnx, tmp / f"{tag}.onnx.data"):
                if p.exists():
                    p.unlink()

    raw_wall, pipe_wall = median([r["wall_s"] for r in runs["raw"]]), median([r["wall_s"] for r in runs["pipeline"]])
    raw_rss, pipe_rss = median([r["peak_mib"] for r in runs["raw"]]), median([r["peak_mib"] for r in runs["pipeline"]])
    raw_opsets = sorted({o for r in runs["raw"] for o in r["detail"]["opset"]})
    pipe_out = sorted({(r.get("onnx") or {}).get("exporter") or "?" for r in runs["pipeline"]}), \
        sorted({(r.get("onnx") or {}).get("opset") for r in runs["pipeline"]}, key=str)
    notes = []
    if raw_opsets != [args.opset]:
        notes.append(f"raw torch.onnx.export asked opset {args.opset} but wrote opset {raw_opsets} "
                     "(the dynamo exporter's down-conversion did not apply)")
    if pipe_out[0] != ["dynamo"]:
        notes.append(f"pipeline used the {'/'.join(pipe_out[0])} exporter (opset {pipe_out[1]}): "
                     "dynamo's graph was not at the requested opset, so capture ran a second exporter")
    stage_names = list(runs["pipeline"][0]["stages"])
    phase_names = list(runs["raw"][0]["detail"]["phases"])
    return {
        "raw_wall_s": raw_wall, "pipeline_wall_s": pipe_wall, "wall_ratio": round(pipe_wall / raw_wall, 3),
        "raw_peak_mib": raw_rss, "pipeline_peak_mib": pipe_rss, "rss_ratio": round(pipe_rss / raw_rss, 3),
        "wall_ok": pipe_wall / raw_wall <= TARGET_WALL_RATIO, "rss_ok": pipe_rss / raw_rss <= TARGET_RSS_RATIO,
        "pipeline_stage_median_s": {s: median([r["stages"].get(s, {}).get("seconds", 0.0) for r in runs["pipeline"]])
                                    for s in stage_names},
        "raw_phase_median_s": {p: median([r["detail"]["phases"][p] for r in runs["raw"]]) for p in phase_names},
        "raw_opset_written": raw_opsets, "pipeline_exporter": pipe_out[0], "pipeline_opset_written": pipe_out[1],
        "notes": notes,
        "runs": runs,
    }


def bench_help(env: dict[str, str], runs: int, tmp: Path) -> dict:
    walls = []
    for _i in range(runs):
        m = run_measured([*cli_command(), "--help"], env, Path(os.devnull), tmp / "help.stderr", 60)
        if m["rc"] != 0:
            raise SystemExit(f"cann-export --help failed (rc {m['rc']}):\n{tail(tmp / 'help.stderr')}")
        walls.append(m["wall_s"])
    med = median(walls)
    return {"median_s": med, "runs_s": walls, "target_s": TARGET_HELP_S, "ok": med < TARGET_HELP_S}


def print_table(results: dict[str, dict], help_result: dict, args: argparse.Namespace) -> None:
    header = ("model", "raw wall s", "pipeline wall s", "wall ratio", "raw peak MiB", "pipeline peak MiB", "RSS ratio")
    rows = [header]
    for name, r in results.items():
        rows.append((name, f"{r['raw_wall_s']:.2f}", f"{r['pipeline_wall_s']:.2f}",
                     f"{r['wall_ratio']:.3f}{'' if r['wall_ok'] else ' !'}",
                     f"{r['raw_peak_mib']:.0f}", f"{r['pipeline_peak_mib']:.0f}",
                     f"{r['rss_ratio']:.3f}{'' if r['rss_ok'] else ' !'}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]

    def line(row: tuple) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + " |"

    print(f"\ncann-export --format onnx vs raw toolchain (opset {args.opset}, median of {args.repeat})")
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows[1:]:
        print(line(row))
    print(f"targets: wall ratio <= {TARGET_WALL_RATIO}, RSS ratio <= {TARGET_RSS_RATIO}  ('!' = missed)")
    print(f"cann-export --help: median {help_result['median_s']:.3f} s over {len(help_result['runs_s'])} runs "
          f"(target < {TARGET_HELP_S} s: {'ok' if help_result['ok'] else 'MISSED'})")
    for name, r in results.items():
        stages = ", ".join(f"{s} {v:.2f}" for s, v in r["pipeline_stage_median_s"].items() if v >= 0.01)
        phases = ", ".join(f"{p} {v:.2f}" for p, v in r["raw_phase_median_s"].items())
        print(f"  {name} pipeline stages (s): {stages}")
        print(f"  {name} raw phases (s):      {phases}")
        for note in r["notes"]:
            print(f"  {name} note: {note}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per side and model (default 3)")
    ap.add_argument("--opset", type=int, default=17, help="ONNX opset asked of both sides (default 17)")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)}")
    ap.add_argument("--help-runs", type=int, default=10, help="cann-export --help runs (default 10)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds before one child run is killed")
    ap.add_argument("--output", type=Path, default=DEFAULT_RESULTS, help="results JSON path")
    ap.add_argument("--keep-tmp", action="store_true", help="keep the temp dir (logs, reports) for inspection")
    args = ap.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models or args.repeat < 1:
        ap.error(f"--models takes a subset of {','.join(MODELS)}; --repeat must be >= 1")

    tmp = Path(tempfile.mkdtemp(prefix="cann-bench-"))
    try:
        (tmp / "benchmodels.py").write_text(MODEL_MODULE)
        (tmp / "sitecustomize.py").write_text(SITE_CUSTOMIZE)
        (tmp / "raw_export.py").write_text(RAW_SCRIPT)
        (tmp / "setup_models.py").write_text(SETUP_SCRIPT)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(tmp), *filter(None, [env.get("PYTHONPATH")])])
        env.setdefault("PYTHONWARNINGS", "ignore")
        env.pop("CANN_EXPORT_DEBUG", None)

        print(f"setup: building {', '.join(models)} in {tmp}", file=sys.stderr, flush=True)
        setup = subprocess.run([sys.executable, str(tmp / "setup_models.py"), str(tmp), ",".join(models)],
                               env=env, capture_output=True, text=True, cwd=tmp)
        if setup.returncode != 0:
            raise SystemExit(f"setup failed:\n{setup.stderr[-3000:]}")
        setup_info = json.loads(setup.stdout.strip().splitlines()[-1])

        help_result = bench_help(env, args.help_runs, tmp)
        print(f"cann-export --help median {help_result['median_s']:.3f} s", file=sys.stderr, flush=True)

        results = {}
        for name in models:
            print(f"benchmarking {name} ...", file=sys.stderr, flush=True)
            results[name] = bench_model(name, tmp, env, args)

        print_table(results, help_result, args)
        payload = {
            "benchmark": "cann-export --format onnx vs raw torch.onnx.export(dynamo)+onnxsim+onnxruntime",
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "config": {"repeat": args.repeat, "opset": args.opset, "models": models, "help_runs": args.help_runs},
            "targets": {"wall_ratio_max": TARGET_WALL_RATIO, "rss_ratio_max": TARGET_RSS_RATIO,
                        "help_s_max": TARGET_HELP_S},
            "machine": {"python": platform.python_version(), "platform": platform.platform(),
                        "cpus": os.cpu_count(), "versions": setup_info.pop("_versions", {})},
            "models": {n: {**setup_info.get(n, {}), **results[n]} for n in models},
            "help": help_result,
        }
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(payload, indent=2, default=str) + "\n")
        print(f"\nwrote {args.output}")
    finally:
        if args.keep_tmp:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
