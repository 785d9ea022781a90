#!/usr/bin/env python
"""Benchmark the large-model path: peak memory and wall time of exporting a Linear stack past the sizes where
the graph must carry external data. 18 x Linear(4096, 4096) is 1.21 GB of fp32 weights, 36 x is 2.42 GB.

Each case runs in a fresh child process that builds the model (random weights), calls ``cann_export.export``
with validation on (parity from onnxruntime on the written file), and reports its own peak RSS
(``getrusage(RUSAGE_SELF).ru_maxrss``, which counts the model the caller holds). The figure of merit is
peak RSS / weight bytes (target <= 2.0). Results go to ``benchmarks/results/large.json``.

``--load`` instead measures the load stage of a saved .pt2 of that model (depth 18: 1.21 GB) and the canonical
re-pack's share of it (load/repack.py: torch reads a fresh archive of the allow-listed members, never the
user's file; the target is <= 10% added). A child saves the .pt2 once, then for ``--runs`` rounds (median
reported) times: the load stage (``load.stage.load_path``: re-pack, checks, torch.export.load of the copy,
``ep.module()``, the file's sha256), the re-pack alone, and torch.export.load of the copy against
torch.export.load of the user's file. Added = re-pack + (copy load - file load). Results go to
``benchmarks/results/large_load.json``.

``--safetensors`` measures the command users run on saved weights: a setup child saves the stack's weights as one
.safetensors file (depth 36: 2.42 GB) and its input, then ``cann-export W.safetensors --format onnx --model-class
benchlarge:stack --model-kwargs {"depth": N} --example-inputs X.safetensors`` runs as its own process; its peak RSS
(``os.wait4``'s ``ru_maxrss``: the CLI and its sandbox child, the larger of the two) over the weight bytes is the
figure of merit (target <= 1.5). Results go to ``benchmarks/results/large_safetensors.json``.

``--hf`` does the same for a Hugging Face directory: a Llama (hidden 2048, 9 layers, vocabulary 32000: 2.38 GB of
fp32 weights) written by ``save_pretrained``, then ``cann-export DIR --format onnx --task text-generation``.
Results go to ``benchmarks/results/large_hf.json``.

``--pipeline`` does the same for a diffusers pipeline directory (benchmarks/pipeline_models.py ``sd3-wide``: diffusers'
SD3 fast-test pipeline with a 768-wide, 3-block transformer, 264 MB of fp32 weights, almost all the transformer's):
``cann-export DIR -o OUT`` with no flags (every component validated, the end-to-end check), and
``cann-export trivial.pt2`` (a Linear 4 -> 4) measured the same way: the runtime's floor. Peak RSS over the weight
bytes, and what is above the floor over the weight bytes. Results go to ``benchmarks/results/large_pipeline.json``.
``--pipeline-model sd3-512`` measures a 512-wide transformer instead (124 MB of weights: the same ratios, sooner);
``--pipeline-model sd3-2g`` a 1536-wide, 7-block one (2.3 GB: the issue's pipeline past 2 GB, its transformer written
with external data).

Usage::

    python benchmarks/bench_large.py [--depth 18 --depth 36] [--format onnx] [--exporter auto]
    python benchmarks/bench_large.py --load [--depth 18] [--runs 3]
    python benchmarks/bench_large.py --safetensors [--depth 36] [--format onnx]
    python benchmarks/bench_large.py --hf [--format onnx]
    python benchmarks/bench_large.py --pipeline [--format atc_ready]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
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


LOAD_CHILD = r"""
import json, statistics, sys, time
from pathlib import Path
import torch
from cann_export.hooks import manager
from cann_export.load.allowlist import PT2
from cann_export.load.repack import canonical_copy
from cann_export.load.stage import load_path
from cann_export.options import ExportOptions

depth, width, runs, path = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
torch.manual_seed(0)
with torch.no_grad():
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)])
torch.export.save(torch.export.export(model, (torch.randn(1, width),)), str(path))
del model
loaders = manager.registry().loaders()


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def repack_only():
    with canonical_copy(path, PT2):
        pass


def copy_load():
    with canonical_copy(path, PT2) as canon:
        t0 = time.perf_counter()
        torch.export.load(canon.view())
        return time.perf_counter() - t0


rows = {"stage_s": [], "repack_s": [], "file_load_s": [], "copy_load_s": []}
timed(lambda: torch.export.load(str(path)))  # warm the page cache
for _ in range(runs):
    rows["stage_s"].append(timed(lambda: load_path(path, ExportOptions(), loaders))[0])
    rows["repack_s"].append(timed(repack_only)[0])
    rows["file_load_s"].append(timed(lambda: torch.export.load(str(path)))[0])
    rows["copy_load_s"].append(copy_load())
med = {k: statistics.median(v) for k, v in rows.items()}
added = med["repack_s"] + max(0.0, med["copy_load_s"] - med["file_load_s"])
print(json.dumps({"depth": depth, "width": width, "pt2_bytes": path.stat().st_size, "runs": runs, **med,
                  "added_s": added, "added_share": added / med["stage_s"], "samples": rows}))
"""


STACK_MODULE = '''\
"""The benchmark's architecture, importable as ``benchlarge`` (the temp dir is on PYTHONPATH)."""


def stack(depth=36, width=4096):
    import torch

    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)])
'''

SAVE_CHILD = r"""
import json, sys
import torch
from safetensors.torch import save_file
import benchlarge

depth, width, tmp = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
with torch.no_grad():
    model = benchlarge.stack(depth, width)
    for m in model:
        m.weight.mul_(1.0 / width ** 0.5)
state = model.state_dict()
save_file(state, f"{tmp}/weights.safetensors")
save_file({"input": torch.randn(1, width)}, f"{tmp}/inputs.safetensors")
print(json.dumps({"weights_bytes": sum(v.numel() * v.element_size() for v in state.values())}))
"""


HF_SAVE_CHILD = r"""
import json, sys
sys.modules.setdefault("torchvision", None)  # its wheel here does not load against the CPU torch; unused
import torch
from transformers import LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=9, num_attention_heads=16,
                  num_key_value_heads=16, vocab_size=32000, max_position_embeddings=256, tie_word_embeddings=False)
model = LlamaForCausalLM(cfg).eval()
model.save_pretrained(sys.argv[1])
print(json.dumps({"weights_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}))
"""


def run_hf_case(fmt: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-large-hf-") as tmp:
        Path(tmp, "sitecustomize.py").write_text('import sys\nsys.modules.setdefault("torchvision", None)\n')
        env = _child_env()
        env["PYTHONPATH"] = os.pathsep.join([tmp, env["PYTHONPATH"]])
        setup = subprocess.run([sys.executable, "-c", HF_SAVE_CHILD, str(Path(tmp) / "llama")], env=env,
                               capture_output=True, text=True, check=False)
        if setup.returncode != 0:
            return {"depth": 9, "error": setup.stderr.strip().splitlines()[-3:]}
        weights = json.loads(setup.stdout.strip().splitlines()[-1])["weights_bytes"]
        out = Path(tmp) / ("model.onnx" if fmt == "onnx" else "bundle")
        m = _measured([*_cli(), str(Path(tmp) / "llama"), "--format", fmt, "--task", "text-generation", "-o", str(out),
                       "--json"], env)
    if m["rc"] not in (0, 1):  # 1: written, parity failed; its memory is still the measurement
        return {"depth": 9, "error": m["stderr"].strip().splitlines()[-3:]}
    result = json.loads(m["stdout"].strip().splitlines()[-1])
    lines = [line for line in m["stderr"].splitlines() if "max_abs" in line or "FAIL" in line][:12]
    return {"depth": 9, "model": "llama", "rc": m["rc"], "parity_lines": lines, "format": fmt, "weights_bytes": weights,
            "peak_rss_bytes": m["peak_rss_bytes"], "peak_over_weights": m["peak_rss_bytes"] / weights,
            "wall_s": m["wall_s"], "ok": result.get("ok"), "parity_passed": (result.get("parity") or {}).get("passed"),
            "exporter": (result.get("onnx") or {}).get("exporter")}


def run_pipeline_case(fmt: str, timeout: float, model: str = "sd3-wide") -> dict:
    """``cann-export DIR`` on the ``model`` pipeline directory (pipeline_models.py), and the floor (``cann-export
    trivial.pt2``). A run past ``timeout`` is killed; its peak RSS so far is still recorded (``timed_out``)."""
    with tempfile.TemporaryDirectory(prefix="bench-large-pipe-") as tmp:
        env = _child_env()
        setup = subprocess.run([sys.executable, str(HERE / "pipeline_models.py"), tmp, f"{model},trivial"], env=env,
                               capture_output=True, text=True, check=False)
        if setup.returncode != 0:
            return {"depth": 3, "error": setup.stderr.strip().splitlines()[-3:]}
        weights = json.loads(setup.stdout.strip().splitlines()[0])["weights_bytes"]
        floor = _measured([*_cli(), str(Path(tmp) / "trivial.pt2"), "--format", fmt, "-o", str(Path(tmp) / "floor")],
                          env)
        m = _measured([*_cli(), str(Path(tmp) / model), "--format", fmt, "-o", str(Path(tmp) / "bundle"),
                       "--json"], env, timeout)
    if m["rc"] != 0 or floor["rc"] != 0:
        return {"depth": 3, "error": (m if m["rc"] else floor)["stderr"].strip().splitlines()[-3:],
                "timed_out": m["wall_s"] > timeout, "wall_s": m["wall_s"], "weights_bytes": weights,
                "peak_rss_bytes": m["peak_rss_bytes"], "floor_rss_bytes": floor["peak_rss_bytes"]}
    result = json.loads(m["stdout"].strip().splitlines()[-1])
    above = m["peak_rss_bytes"] - floor["peak_rss_bytes"]
    return {"depth": 3, "model": model, "format": fmt, "weights_bytes": weights,
            "peak_rss_bytes": m["peak_rss_bytes"], "peak_over_weights": m["peak_rss_bytes"] / weights,
            "floor_rss_bytes": floor["peak_rss_bytes"], "above_floor_over_weights": above / weights,
            "wall_s": m["wall_s"], "ok": result.get("ok"), "parity_passed": (result.get("parity") or {}).get("passed"),
            "exporter": "per component"}


def _cli() -> list[str]:
    exe = Path(sys.executable).with_name("cann-export")
    return [str(exe)] if exe.exists() else [shutil.which("cann-export") or "cann-export"]


def _measured(cmd: list[str], env: dict, timeout: float = 1800) -> dict:
    """Run ``cmd``; wall seconds, rc, stdout/stderr and peak RSS of it and its reaped children (os.wait4)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - start > timeout:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.01)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"wall_s": wall, "rc": proc.returncode, "peak_rss_bytes": usage.ru_maxrss * 1024,
                "stdout": out.read().decode(errors="replace"), "stderr": err.read().decode(errors="replace")}


def run_safetensors_case(depth: int, width: int, fmt: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-large-st-") as tmp:
        Path(tmp, "benchlarge.py").write_text(STACK_MODULE)
        env = _child_env()
        env["PYTHONPATH"] = os.pathsep.join([tmp, env["PYTHONPATH"]])
        setup = subprocess.run([sys.executable, "-c", SAVE_CHILD, str(depth), str(width), tmp], env=env,
                               capture_output=True, text=True, check=False)
        if setup.returncode != 0:
            return {"depth": depth, "width": width, "error": setup.stderr.strip().splitlines()[-3:]}
        weights = json.loads(setup.stdout.strip().splitlines()[-1])["weights_bytes"]
        out = Path(tmp) / ("model.onnx" if fmt == "onnx" else "bundle")
        cmd = [*_cli(), str(Path(tmp) / "weights.safetensors"), "--format", fmt, "-o", str(out),
               "--model-class", "benchlarge:stack", "--model-kwargs", json.dumps({"depth": depth, "width": width}),
               "--example-inputs", str(Path(tmp) / "inputs.safetensors"), "--json"]
        m = _measured(cmd, env)
    if m["rc"] != 0:
        return {"depth": depth, "width": width, "error": m["stderr"].strip().splitlines()[-3:]}
    result = json.loads(m["stdout"].strip().splitlines()[-1])
    return {"depth": depth, "width": width, "format": fmt, "weights_bytes": weights,
            "peak_rss_bytes": m["peak_rss_bytes"], "peak_over_weights": m["peak_rss_bytes"] / weights,
            "wall_s": m["wall_s"], "ok": result.get("ok"), "parity_passed": (result.get("parity") or {}).get("passed"),
            "exporter": (result.get("onnx") or {}).get("exporter")}


def main_safetensors(args: argparse.Namespace) -> None:
    if args.pipeline:
        rows = [run_pipeline_case(args.format, args.timeout, args.pipeline_model)]
    else:
        rows = ([run_hf_case(args.format)] if args.hf else
                [run_safetensors_case(d, args.width, args.format) for d in (args.depth or [36])])
    print(f"{'weights GB':>10} {'peak RSS GB':>11} {'peak/weights':>12} {'wall s':>7}  exporter   parity")
    for r in rows:
        if "error" in r:
            print(f"depth {r['depth']}: FAILED {' | '.join(r['error'])}")
            if "peak_rss_bytes" in r:
                print(f"  killed at the --timeout: {r['timed_out']}; after {r['wall_s']:.0f} s, peak RSS so far "
                      f"{r['peak_rss_bytes'] / 1e9:.2f} GB ({r['peak_rss_bytes'] / r['weights_bytes']:.2f} x the "
                      f"weights, {r['weights_bytes'] / 1e9:.3f} GB); the floor {r['floor_rss_bytes'] / 1e9:.2f} GB")
            continue
        print(f"{r['weights_bytes'] / 1e9:>10.2f} {r['peak_rss_bytes'] / 1e9:>11.2f} {r['peak_over_weights']:>12.2f} "
              f"{r['wall_s']:>7.1f}  {r['exporter'] or '?':<10} {r['parity_passed']}")
        if "floor_rss_bytes" in r:
            print(f"the runtime's floor (cann-export trivial.pt2): {r['floor_rss_bytes'] / 1e9:.2f} GB; above it: "
                  f"{(r['peak_rss_bytes'] - r['floor_rss_bytes']) / 1e9:.2f} GB = {r['above_floor_over_weights']:.2f}"
                  " x the weights")
    name = "large_hf.json" if args.hf else "large_pipeline.json" if args.pipeline else "large_safetensors.json"
    out = args.results.with_name(name) if args.results.name == "large.json" else args.results
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2) + "\n")


def _child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")])
    return env


def run_load_case(depth: int, width: int, runs: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-large-load-") as tmp:
        proc = subprocess.run([sys.executable, "-c", LOAD_CHILD, str(depth), str(width), str(runs),
                               str(Path(tmp) / "model.pt2")], env=_child_env(), capture_output=True, text=True,
                              check=False)
    if proc.returncode != 0:
        return {"depth": depth, "width": width, "error": proc.stderr.strip().splitlines()[-3:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main_load(args: argparse.Namespace) -> None:
    rows = [run_load_case(d, args.width, args.runs) for d in (args.depth or [18])]
    print(f"{'pt2 GB':>7} {'stage s':>8} {'re-pack s':>9} {'file load s':>11} {'copy load s':>11} {'added':>7}")
    for r in rows:
        if "error" in r:
            print(f"depth {r['depth']}: FAILED {' | '.join(r['error'])}")
            continue
        print(f"{r['pt2_bytes'] / 1e9:>7.2f} {r['stage_s']:>8.2f} {r['repack_s']:>9.3f} {r['file_load_s']:>11.2f} "
              f"{r['copy_load_s']:>11.2f} {r['added_share']:>6.1%}")
    out = args.results.with_name("large_load.json") if args.results.name == "large.json" else args.results
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2) + "\n")


def run_case(depth: int, width: int, fmt: str, exporter: str) -> dict:
    env = _child_env()
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
    ap.add_argument("--load", action="store_true", help="time the load stage of a saved .pt2 and the re-pack's share")
    ap.add_argument("--runs", type=int, default=3, help="rounds per --load case (the median is reported)")
    ap.add_argument("--safetensors", action="store_true",
                    help="measure `cann-export W.safetensors --model-class ...` as its own process (default depth 36)")
    ap.add_argument("--hf", action="store_true", help="the same for a 2.38 GB Hugging Face (Llama) directory")
    ap.add_argument("--pipeline", action="store_true",
                    help="the same for a 264 MB diffusers SD3 pipeline directory, with the runtime's floor")
    ap.add_argument("--pipeline-model", default="sd3-wide", choices=("sd3-wide", "sd3-512", "sd3-2g"),
                    help="--pipeline's directory: sd3-wide (264 MB), sd3-512 (124 MB, the same ratios sooner) or "
                         "sd3-2g (2.3 GB: a component past protobuf's 2 GB)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds before --pipeline's export is killed")
    args = ap.parse_args()
    if args.safetensors or args.hf or args.pipeline:
        main_safetensors(args)
        return
    if args.load:
        main_load(args)
        return
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
