"""Per-step training time on npu-sim / CPU (MLP 784-512-10 and a small CNN, batch 64, AdamW).

The CPU and the npu-sim script run in two processes (npu-sim renames PrivateUse1 process-wide) that take
turns, one training step each, so both see the same noise on a shared machine; the first of each pair
alternates. Each round is a fresh pair of processes; the table shows the medians over rounds of the
median step times, and the median of the rounds' ratios. The npu-sim process also reports how long
``cann.torch.enable()`` took. Results go to ``benchmarks/results/npu_sim.json``.

    python benchmarks/bench_npu_sim.py [--rounds 5] [--steps 100]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# One training step per line read from stdin; prints the step's seconds. The first line printed is the
# time cann.torch.enable() took (0 on CPU), once the model is built and warmed up.
STEPPER = """
import sys, time, torch
from torch import nn
dev, arch = sys.argv[1], sys.argv[2]
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
print(enable_s, flush=True)
for _ in sys.stdin:
    t = time.perf_counter(); step().item(); print(time.perf_counter() - t, flush=True)
"""


def start(dev: str, arch: str) -> tuple[subprocess.Popen, float]:
    proc = subprocess.Popen([sys.executable, "-c", STEPPER, dev, arch], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    return proc, float(proc.stdout.readline())


def one_step(proc: subprocess.Popen) -> float:
    proc.stdin.write("\n")
    proc.stdin.flush()
    return float(proc.stdout.readline())


def round_medians(arch: str, steps: int) -> tuple[float, float, float]:
    """(cpu seconds, npu-sim seconds, enable() seconds) for one pair of processes taking turns."""
    (cpu, _), (sim, enable_s) = start("cpu", arch), start("npu", arch)
    times: dict[str, list[float]] = {"cpu": [], "npu": []}
    try:
        for i in range(steps):
            for dev in (("cpu", "npu") if i % 2 else ("npu", "cpu")):
                times[dev].append(one_step(cpu if dev == "cpu" else sim))
    finally:
        for proc in (cpu, sim):
            proc.stdin.close()
            proc.wait()
    return statistics.median(times["cpu"]), statistics.median(times["npu"]), enable_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="fresh process pairs per model")
    ap.add_argument("--steps", type=int, default=100, help="timed steps per process, after 5 warm-up steps")
    args = ap.parse_args()
    rows = []
    for arch in ("mlp", "cnn"):
        rounds = [round_medians(arch, args.steps) for _ in range(args.rounds)]
        rows.append({"model": arch,
                     "cpu_ms": statistics.median(r[0] for r in rounds) * 1e3,
                     "npu_sim_ms": statistics.median(r[1] for r in rounds) * 1e3,
                     "ratio": statistics.median(r[1] / r[0] for r in rounds),
                     "ratios": [round(r[1] / r[0], 3) for r in rounds],
                     "enable_s": statistics.median(r[2] for r in rounds)})
    print(f"{'model':<6} {'cpu ms/step':>12} {'npu-sim ms/step':>16} {'npu-sim/cpu':>12} {'enable() s':>11}  ratios")
    for r in rows:
        print(f"{r['model']:<6} {r['cpu_ms']:>12.3f} {r['npu_sim_ms']:>16.3f} {r['ratio']:>12.2f} "
              f"{r['enable_s']:>11.3f}  {r['ratios']}")
    out = ROOT / "benchmarks" / "results" / "npu_sim.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rounds": args.rounds, "steps": args.steps, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
