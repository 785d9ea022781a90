#!/usr/bin/env python
"""Time of device-precision parity relative to one plain onnxruntime run of the same graph.

For each model: export to ONNX once, then time, alternating the two so both see the same machine noise
(median of --repeat):
  plain   an onnxruntime session (default options) + one run on the example inputs (ratio 1.0)
  device  device-precision parity under force_fp16 on the same inputs: analysis, the emulated graph, its
          session, the run, the verdict, and on failure the localisation of the first divergence; under each
          SoC overflow mode (saturation: 310P3, the default; inf_nan: 910B*)

Usage: python benchmarks/bench_precision.py [--repeat 3] [--overflow saturation|inf_nan|both]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # precision_models, when run from elsewhere


def models():
    from precision_models import reduction_overflow
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    bert = BertModel(BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
                                intermediate_size=1024)).eval()
    g = torch.Generator().manual_seed(0)
    bert_in = {"input_ids": torch.randint(0, 30522, (1, 128), generator=g),
               "attention_mask": torch.ones(1, 128, dtype=torch.int64)}
    overflow, overflow_in, _ = reduction_overflow()
    return {"bert-4L-256 (passes)": (bert, bert_in), "sum-of-squares 1300 (overflows)": (overflow, overflow_in)}


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure(path: str, feeds: dict, repeat: int, overflow: str = "saturation") -> dict:
    import onnx
    import onnxruntime as ort

    from cann_export.options import Tolerance
    from cann_export.validators.device_parity import device_report

    graph = onnx.load(path)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    names = [o.name for o in graph.graph.output]

    def plain():
        s = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        return s.run(None, {i.name: feeds[i.name] for i in s.get_inputs()})

    expected = [plain()]  # the fp32 graph's outputs stand in for the PyTorch reference

    def device():
        return device_report(graph, "force_fp16", [], [feeds], expected, names, Tolerance().device_policy(), {},
                             overflow=overflow)

    report = device()  # warm-up, and the verdict shown
    pairs = [(timed(plain), timed(device)) for _ in range(repeat)]
    t_plain = statistics.median(p for p, _ in pairs)
    t_device = statistics.median(d for _, d in pairs)
    first = report.get("first_divergence") or {}
    return {"plain_s": t_plain, "device_s": t_device, "ratio": t_device / t_plain, "passed": report["passed"],
            "localised": bool(first), "first_divergence": first.get("message")}


def main() -> None:
    import cann_export

    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--overflow", choices=("saturation", "inf_nan", "both"), default="both")
    args = ap.parse_args()
    modes = ("saturation", "inf_nan") if args.overflow == "both" else (args.overflow,)
    rows = []
    for name, (model, inputs) in models().items():
        with tempfile.TemporaryDirectory() as tmp:
            result = cann_export.export(model, Path(tmp) / "m.onnx", "onnx", example_inputs=inputs)
            feeds = {k: v.numpy() for k, v in inputs.items()}
            rows += [{"model": name, "overflow": mode, **measure(result.onnx["path"], feeds, args.repeat, mode)}
                     for mode in modes]
    print(f"{'model':34} {'overflow':10} {'plain ORT s':>11} {'device parity s':>15} {'ratio':>6}  localisation")
    for r in rows:
        print(f"{r['model']:34} {r['overflow']:10} {r['plain_s']:11.3f} {r['device_s']:15.3f} {r['ratio']:6.2f}  "
              f"{r['first_divergence'] or 'not needed'}")
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "precision.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
