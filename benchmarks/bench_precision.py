#!/usr/bin/env python
"""Time of device-precision parity relative to one plain onnxruntime run of the same graph.

For each model: export to ONNX once, then time (median of --repeat):
  plain     an onnxruntime session + one run on the example inputs (the baseline, ratio 1.0)
  device    fp16 emulation (force_fp16) + run + compare on the same inputs, no localisation needed
  localise  the same on a graph that overflows in fp16, including localisation of the first divergence

Usage: python benchmarks/bench_precision.py [--repeat 5]
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
sys.path.insert(0, str(HERE.parent / "tests"))


def models():
    from helpers.calibration_models import reduction_overflow
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    bert = BertModel(BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
                                intermediate_size=1024)).eval()
    g = torch.Generator().manual_seed(0)
    bert_in = {"input_ids": torch.randint(0, 30522, (1, 128), generator=g),
               "attention_mask": torch.ones(1, 128, dtype=torch.int64)}
    return {"bert-4L-256 (passes)": (bert, bert_in), "sum-of-squares 1300 (overflows)": (reduction_overflow()[0],
                                                                                      reduction_overflow()[1])}


def median_time(fn, repeat):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    import onnx
    import onnxruntime as ort

    import cann_export
    from cann_export.options import Tolerance
    from cann_export.validators.device_parity import device_report

    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    rows = []
    for name, (model, feeds) in models().items():
        with tempfile.TemporaryDirectory() as tmp:
            result = cann_export.export(model, Path(tmp) / "m.onnx", "onnx", example_inputs=feeds)
            graph = onnx.load(result.onnx["path"])
            np_feeds = [{k: v.numpy() for k, v in feeds.items()}]
            with torch.no_grad():
                out = model(**feeds)
            ref = [[(out[0] if isinstance(out, tuple) else out.last_hidden_state if hasattr(out, "last_hidden_state")
                     else out).numpy()]]
            path = result.onnx["path"]

            def plain():
                s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
                s.run(None, {i.name: np_feeds[0][i.name] for i in s.get_inputs()})

            def device():
                return device_report(graph, "force_fp16", [], np_feeds, ref, ["out"], Tolerance().device_policy(), {})

            report = device()
            t_plain = median_time(plain, args.repeat)
            t_device = median_time(device, args.repeat)
            rows.append({"model": name, "plain_s": t_plain, "device_s": t_device, "ratio": t_device / t_plain,
                         "localised": "first_divergence" in report,
                         "first_divergence": (report.get("first_divergence") or {}).get("message")})
    print(f"{'model':34} {'plain ORT s':>11} {'device parity s':>15} {'ratio':>6}  localisation")
    for r in rows:
        print(f"{r['model']:34} {r['plain_s']:11.3f} {r['device_s']:15.3f} {r['ratio']:6.2f}  "
              f"{r['first_divergence'] or 'not needed'}")
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "precision.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
