#!/usr/bin/env python
"""Peak memory of ``cann-export DIR`` (default options, validation on) against the raw toolchain on the same model.

Models (random weights from small configs, written with ``save_pretrained``; nothing is downloaded):

- ``whisper``: a Whisper-tiny-sized directory (d_model 64, 2 + 2 layers, 4 heads, ~1.5 MB of weights) with the
  real window: 80 mel bins x 3000 frames, 1500 encoder positions (attention scores 4 x 1500 x 1500 per row);
- ``bert``: BERT-tiny (2 layers, hidden 128, 2 heads), text-classification;
- ``resnet``: a small ResNetForImageClassification (4 stages 16..128 channels) at 224 x 224.

Raw is what a user's own script costs on the model: load it with transformers, ``torch.onnx.export`` it at the
example shape (the TorchScript exporter: the lighter of torch's two) and run the graph once in onnxruntime, in a
fresh process. Both sides run as child processes reaped with ``os.wait4`` (peak RSS: ``ru_maxrss``, the larger
of the process and its reaped children); wall and user+sys CPU seconds come with it. Ours also prints the checks'
own cost (the CLI's ``checks:`` line; of a multi-graph export, the graph whose checks raised the peak most). The
target is ours <= 2x raw (issue 46 item 3); the bundle's size is a column too (a tiny model's stays within a few
MB).

Usage::

    python benchmarks/bench_memory.py [--models whisper,bert,resnet] [--repeat 1] [--keep DIR]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

TARGET = 2.0
MODELS = ("whisper", "bert", "resnet")

# name -> the raw side's example inputs: name -> (shape, kind); ours picks its own (the default task's dummies)
INPUTS = {
    "whisper": {"input_features": ((1, 80, 3000), "float"), "decoder_input_ids": ((1, 4), "ids")},
    "bert": {"input_ids": ((1, 16), "ids"), "attention_mask": ((1, 16), "ones")},
    "resnet": {"pixel_values": ((1, 3, 224, 224), "float")},
}


def build(name: str, out: Path) -> None:
    """``save_pretrained`` the model ``name`` into ``out``."""
    sys.modules.setdefault("torchvision", None)  # none of these needs it (transformers imports it where installed)
    import torch
    import transformers as t

    torch.manual_seed(0)
    if name == "whisper":
        cfg = t.WhisperConfig(vocab_size=1000, d_model=64, encoder_layers=2, decoder_layers=2,
                              encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                              decoder_ffn_dim=128, num_mel_bins=80, max_source_positions=1500,
                              max_target_positions=448, pad_token_id=1, bos_token_id=1, eos_token_id=2,
                              decoder_start_token_id=3, suppress_tokens=None, begin_suppress_tokens=None)
        model = t.WhisperForConditionalGeneration(cfg)
    elif name == "bert":
        cfg = t.BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=512, num_labels=2)
        model = t.BertForSequenceClassification(cfg)
    elif name == "resnet":
        cfg = t.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                             layer_type="basic", num_labels=10)
        model = t.ResNetForImageClassification(cfg)
    else:
        raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    model.eval().save_pretrained(out)


RAW = """
import sys
sys.modules.setdefault("torchvision", None)
import numpy as np, onnxruntime as ort, torch, transformers
src, dst, spec = sys.argv[1], sys.argv[2], eval(sys.argv[3])
cfg = transformers.AutoConfig.from_pretrained(src)
arch = getattr(transformers, cfg.architectures[0])
model = arch.from_pretrained(src).eval()
g = torch.Generator().manual_seed(0)
feed = {}
for n, (shape, kind) in spec.items():
    feed[n] = (torch.randn(shape, generator=g) if kind == "float" else torch.ones(shape, dtype=torch.int64)
               if kind == "ones" else torch.randint(0, 100, shape, generator=g))
names = list(feed)

class Wrap(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.m = model
    def forward(self, *args):
        out = self.m(**dict(zip(names, args)), return_dict=True)
        return tuple(v for v in out.values() if isinstance(v, torch.Tensor))

with torch.no_grad():
    torch.onnx.export(Wrap(), tuple(feed.values()), dst, input_names=names, dynamo=False, opset_version=17)
sess = ort.InferenceSession(dst, providers=["CPUExecutionProvider"])
outs = sess.run(None, {n: v.numpy() for n, v in feed.items()})
print("raw ok", [o.shape for o in outs])
"""


def measured(cmd: list[str], env: dict, log: Path, timeout: float = 1800) -> dict:
    """Spawn ``cmd`` (stdout+stderr to ``log``), reaped with os.wait4: wall seconds, peak RSS MiB, CPU s, rc
    (bench_vs_optimum's measurement, so both tables count the same way)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_vs_optimum import run_measured

    return run_measured(cmd, env, log, timeout)


def our_cli() -> list[str]:
    exe = Path(sys.executable).with_name("cann-export")
    return [str(exe)] if exe.exists() else [shutil.which("cann-export") or "cann-export"]


def checks_line(log: Path) -> str:
    """The CLI's ``checks:`` line that raised the peak most (a multi-graph export prints one per graph)."""
    found = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip().startswith("checks")]

    def raised(line: str) -> float:
        m = re.search(r"by ([0-9.]+) MiB", line)
        return float(m.group(1)) if m else -1.0

    return max(found, key=raised) if found else "-"


def bundle_mib(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / (1 << 20)


def bench(name: str, tmp: Path, repeat: int, env: dict) -> dict:
    src = tmp / name
    build(name, src)
    spec = INPUTS[name]
    rows: dict[str, list[dict]] = {"raw": [], "ours": []}
    for rep in range(repeat):
        raw = measured([sys.executable, "-c", RAW, str(src), str(tmp / f"{name}.raw.onnx"), repr(spec)], env,
                       tmp / f"{name}.raw.log")
        out = tmp / f"{name}_bundle"
        ours = measured([*our_cli(), str(src), "-o", str(out), "--overwrite"], env,
                        tmp / f"{name}.ours.log")
        for side, m, log in (("raw", raw, "raw"), ("ours", ours, "ours")):
            if m["rc"] != 0:
                tail = "\n".join((tmp / f"{name}.{log}.log").read_text(errors="replace").splitlines()[-12:])
                raise SystemExit(f"{name} {side} failed (rc {m['rc']}):\n{tail}")
            rows[side].append(m)
            print(f"  {name} {rep + 1}/{repeat} {side:4s} {m['wall_s']:7.1f} s {m['cpu_s']:7.1f} CPU s "
                  f"{m['peak_mib']:8.1f} MiB", flush=True)
    med = {side: {k: statistics.median(m[k] for m in ms) for k in ("wall_s", "cpu_s", "peak_mib")}
           for side, ms in rows.items()}
    return {"raw": med["raw"], "ours": med["ours"], "ratio": med["ours"]["peak_mib"] / med["raw"]["peak_mib"],
            "bundle_mib": bundle_mib(tmp / f"{name}_bundle"), "checks": checks_line(tmp / f"{name}.ours.log")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="keep the models, bundles and logs in this directory")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    tmp = args.keep or Path(tempfile.mkdtemp(prefix="bench_memory_"))
    tmp.mkdir(parents=True, exist_ok=True)
    rows = {}
    try:
        for name in args.models.split(","):
            rows[name] = bench(name, tmp, args.repeat, env)
    finally:
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
    print("\n| model | raw MiB | ours MiB | ratio | raw wall s | ours wall s | bundle MiB | checks |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        flag = "" if r["ratio"] <= TARGET else " !"
        print(f"| {name} | {r['raw']['peak_mib']:.0f} | {r['ours']['peak_mib']:.0f} | {r['ratio']:.2f}{flag} | "
              f"{r['raw']['wall_s']:.1f} | {r['ours']['wall_s']:.1f} | {r['bundle_mib']:.1f} | {r['checks']} |")
    print(f"target: ours <= {TARGET}x raw peak RSS ('!' = missed)")
    return 0 if all(r["ratio"] <= TARGET for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
