"""What ``cann.torch.config``'s training keys cost and save on npu-sim, in the unchanged AdamW loop.

For each model, one npu-sim process trains the tracked model (``.to("cann")``) and switches the keys with
``cann.torch.config`` between steps, taking turns step by step so every setting sees the same machine noise:

- ``mixed_precision="fp16"`` (autocast + dynamic loss scaling) against fp32: median step-time ratio;
- ``gradient_checkpointing=True`` against off: the bytes autograd saves for backward in one forward
  (``cann_export.backend.activation_meter``, unique storages, parameters excluded), and the step-time ratio.

npu-sim computes on the CPU, so fp16 there times the CPU's half-precision kernels, not an NPU's.
Results go to ``benchmarks/results/train_config.json``.

    python benchmarks/bench_train_config.py [--steps 10]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, statistics, sys, time, warnings
import torch
from torch import nn
import cann.torch
from cann_export.backend.activation_meter import saved_activations

warnings.simplefilter("ignore")
cann.torch.enable()
arch, steps = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)


class Block(nn.Module):  # a residual conv block, as in a ResNet stage
    def __init__(self, c):
        super().__init__()
        self.c1, self.b1, self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), \\
            nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(x + self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))


if arch == "mlp":
    model, x = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10)), torch.randn(64, 784)
    y, loss_fn = torch.randint(0, 10, (64,)), nn.functional.cross_entropy
elif arch == "resnet":
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.Sequential(*[Block(16) for _ in range(4)]),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    x, y, loss_fn = torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,)), nn.functional.cross_entropy
else:  # a 4-layer transformer encoder, d=64, sequence 32
    layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, 4, enable_nested_tensor=False), nn.Flatten(),
                          nn.Linear(64 * 32, 10))
    x, y, loss_fn = torch.randn(8, 32, 64), torch.randint(0, 10, (8,)), nn.functional.cross_entropy
model = model.to("cann")
x, y = x.to("cann"), y.to("cann")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)


def step():
    with saved_activations() as meter:
        loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    loss.item()
    return meter.bytes


def timed_step():  # without the meter's hooks
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    loss.item()


settings = {"fp32": {"mixed_precision": False, "gradient_checkpointing": False},
            "fp16": {"mixed_precision": "fp16", "gradient_checkpointing": False},
            "ckpt": {"mixed_precision": False, "gradient_checkpointing": True}}
times, saved = {k: [] for k in settings}, {}
for name, s in settings.items():  # warm-up; one measured step
    cann.torch.config(**s)
    for _ in range(2):
        timed_step()
    saved[name] = step()
for i in range(steps):
    order = list(settings) if i % 2 == 0 else list(reversed(settings))
    for name in order:
        cann.torch.config(**settings[name])
        t = time.perf_counter()
        timed_step()
        times[name].append(time.perf_counter() - t)
print(json.dumps({"ms": {k: statistics.median(v) * 1e3 for k, v in times.items()}, "saved": saved}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="timed steps per setting, after 2 warm-up steps")
    args = ap.parse_args()
    rows = []
    for arch in ("mlp", "resnet", "transformer"):
        proc = subprocess.run([sys.executable, "-c", SCRIPT, arch, str(args.steps)], capture_output=True, text=True,
                              env={"PYTHONPATH": str(ROOT), "PATH": ""}, check=True)
        r = json.loads(proc.stdout.splitlines()[-1])
        ms, saved = r["ms"], r["saved"]
        rows.append({"model": arch, **{f"{k}_ms": v for k, v in ms.items()},
                     "fp16_time_ratio": ms["fp16"] / ms["fp32"], "ckpt_time_ratio": ms["ckpt"] / ms["fp32"],
                     "saved_bytes": saved["fp32"], "ckpt_saved_bytes": saved["ckpt"],
                     "ckpt_memory_ratio": saved["ckpt"] / saved["fp32"]})
    print(f"{'model':<12} {'fp32 ms':>8} {'fp16 ms':>8} {'fp16/fp32':>9} {'saved MiB':>9} {'ckpt MiB':>9} "
          f"{'ckpt/plain mem':>14} {'ckpt/plain time':>15}")
    for r in rows:
        print(f"{r['model']:<12} {r['fp32_ms']:>8.2f} {r['fp16_ms']:>8.2f} {r['fp16_time_ratio']:>9.2f} "
              f"{r['saved_bytes'] / 2**20:>9.2f} {r['ckpt_saved_bytes'] / 2**20:>9.2f} "
              f"{r['ckpt_memory_ratio']:>14.2f} {r['ckpt_time_ratio']:>15.2f}")
    out = ROOT / "benchmarks" / "results" / "train_config.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"steps": args.steps, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
