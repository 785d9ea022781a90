"""Per-step training time on npu-sim / CPU (MLP 784-512-10 and a small CNN, batch 64, AdamW).

Each measurement runs in its own process (npu-sim renames PrivateUse1 process-wide); CPU and npu-sim
runs alternate and the median per-step time of each is reported, because these machines are noisy.
The npu-sim process also reports how long ``cann.torch.enable()`` took. Results go to
``benchmarks/results/npu_sim.json``.

    python benchmarks/bench_npu_sim.py [--rounds 5] [--steps 50]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STEP = """
import json, sys, time, torch
from torch import nn
dev, arch, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
enable_s = 0.0
if dev == "npu":
    import cann.torch; t = time.perf_counter(); cann.torch.enable(); enable_s = time.perf_counter() - t
torch.manual_seed(0)
if arch == "mlp":
    model, x = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10)), torch.randn(64, 784)
else:
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    x = torch.randn(64, 1, 28, 28)
model = model.to(dev); x = x.to(dev); y = torch.randint(0, 10, (64,)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
def step():
    loss = nn.functional.cross_entropy(model(x), y); opt.zero_grad(); loss.backward(); opt.step(); return loss
for _ in range(5): step()
times = []
for _ in range(steps):
    t = time.perf_counter(); step().item(); times.append(time.perf_counter() - t)
print(json.dumps([sorted(times)[len(times) // 2], enable_s]))
"""


def measure(dev: str, arch: str, steps: int) -> list[float]:
    out = subprocess.run([sys.executable, "-c", STEP, dev, arch, str(steps)], capture_output=True, text=True,
                         check=True, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="processes per device and model (median is reported)")
    ap.add_argument("--steps", type=int, default=50, help="timed steps per process, after 5 warm-up steps")
    args = ap.parse_args()
    rows = []
    for arch in ("mlp", "cnn"):
        cpu, sim, enable = [], [], []
        for _ in range(args.rounds):
            cpu.append(measure("cpu", arch, args.steps)[0])
            step, enable_s = measure("npu", arch, args.steps)
            sim.append(step)
            enable.append(enable_s)
        c, s = statistics.median(cpu), statistics.median(sim)
        rows.append({"model": arch, "cpu_ms": c * 1e3, "npu_sim_ms": s * 1e3, "ratio": s / c,
                     "enable_s": statistics.median(enable)})
    print(f"{'model':<6} {'cpu ms/step':>12} {'npu-sim ms/step':>16} {'npu-sim/cpu':>12} {'enable() s':>11}")
    for r in rows:
        print(f"{r['model']:<6} {r['cpu_ms']:>12.3f} {r['npu_sim_ms']:>16.3f} {r['ratio']:>12.2f} {r['enable_s']:>11.3f}")
    out = ROOT / "benchmarks" / "results" / "npu_sim.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rounds": args.rounds, "steps": args.steps, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
