#!/usr/bin/env python
"""QAT cost: fake-quant training step time / fp32 training step time (same model, same batch), and
2-process DDP (gloo, CPU) fine-tuning throughput / 1 process.

Usage: python benchmarks/bench_qat.py [--steps 30]
Prints a table of medians and ratios; writes benchmarks/results/qat.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent


def cnn() -> nn.Module:
    def block(i, o):
        return [nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU()]
    return nn.Sequential(*block(3, 32), *block(32, 64), nn.MaxPool2d(2), *block(64, 128), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(128 * 8 * 8, 10))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


MODELS = {"cnn 32x32 b64": (cnn, (64, 3, 32, 32)), "mlp 784-512-512-10 b64": (mlp, (64, 784))}


def step_time(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> float:
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    model.train()
    times = []
    for i in range(steps + 3):
        t = time.perf_counter()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i >= 3:  # warm-up steps are not counted
            times.append(time.perf_counter() - t)
    return statistics.median(times)


WORKER = r'''
import sys, time, json, torch
sys.path.insert(0, {here!r})
from bench_qat import MODELS
from cann_export import qat
build, shape = MODELS[{name!r}]
torch.manual_seed(0)
model = build()
x = torch.randn(256, *shape[1:])
batches = [{{"input": x[i:i + 64]}} for i in range(0, 256, 64)]
student = qat.prepare(model, config={{}})
qat.calibrate(student, batches)
qat.finetune(student, model, batches, 3, 1e-4)  # warm-up (and process-group start)
t = time.perf_counter()
qat.finetune(student, model, batches, {steps}, 1e-4)
elapsed = time.perf_counter() - t
import torch.distributed as dist
rank = dist.get_rank() if dist.is_initialized() else 0
if rank == 0:
    print(json.dumps({{"samples_per_s": {steps} * 64 / elapsed}}))
'''


def ddp_throughput(name: str, steps: int, nproc: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "worker.py"
        script.write_text(WORKER.format(here=str(HERE), name=name, steps=steps))
        env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // nproc)))
        cmd = [sys.executable, str(script)] if nproc == 1 else [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", "29541",
            str(script)]
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])["samples_per_s"]


def main() -> None:
    from cann_export import qat

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    rows = []
    for name, (build, shape) in MODELS.items():
        torch.manual_seed(0)
        model = build()
        x, y = torch.randn(*shape), torch.randint(0, 10, (shape[0],))
        import copy

        from cann_export.qat.wrapping import fold_batchnorm

        student = qat.prepare(model, config={})
        qat.calibrate(student, [{"input": x}])
        folded = copy.deepcopy(model)
        fold_batchnorm(folded)  # the fp32 model with the same BN folding QAT applies: fake quant's own cost
        fp32_runs, folded_runs, q_runs = [], [], []
        for _ in range(2):  # interleaved, so drift on a shared machine hits all three
            fp32_runs.append(step_time(model, x, y, args.steps))
            folded_runs.append(step_time(folded, x, y, args.steps))
            q_runs.append(step_time(student, x, y, args.steps))
        fp32, fp32_folded, q = min(fp32_runs), min(folded_runs), min(q_runs)
        one = ddp_throughput(name, args.steps, 1)
        two = ddp_throughput(name, args.steps, 2)
        rows.append({"model": name, "fp32_step_s": fp32, "fp32_bn_folded_step_s": fp32_folded, "qat_step_s": q,
                     "qat_over_fp32": q / fp32, "qat_over_fp32_bn_folded": q / fp32_folded,
                     "samples_per_s_1proc": one, "samples_per_s_2proc_ddp": two, "ddp2_over_1": two / one})
    print(f"{'model':24} {'fp32 step s':>11} {'fp32 BN-folded s':>16} {'QAT step s':>10} {'QAT/fp32':>8} "
          f"{'QAT/folded':>10} {'1-proc smp/s':>12} {'2-proc DDP smp/s':>16} {'DDP/1':>6}")
    for r in rows:
        print(f"{r['model']:24} {r['fp32_step_s']:11.4f} {r['fp32_bn_folded_step_s']:16.4f} {r['qat_step_s']:10.4f} "
              f"{r['qat_over_fp32']:8.2f} {r['qat_over_fp32_bn_folded']:10.2f} "
              f"{r['samples_per_s_1proc']:12.0f} {r['samples_per_s_2proc_ddp']:16.0f} {r['ddp2_over_1']:6.2f}")
    print("targets: QAT/fp32 <= 1.3 (issue 18)")
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "qat.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
