#!/usr/bin/env python
"""Time of device-precision parity relative to one plain onnxruntime run of the same graph.

For each model: export to ONNX once, then time, alternating the two so both see the same machine noise
(median of --repeat):
  plain   an onnxruntime session (default options) + one run on the example inputs (ratio 1.0)
  device  device-precision parity under force_fp16 on the same inputs: analysis, the emulated graph, its
          session, the run, the verdict, and on failure the localisation of the first divergence
  emulated  (shown apart) the emulated graph, its session and the run alone: device minus verdict and
          localisation

Both run with numpy's BLAS on one thread, as in an export (``measured``).

The target (issue 17): device parity <= 3x one onnxruntime run (TARGET); each row records its median ratio
and whether it is within the target. Results go to ``benchmarks/results/precision.json``.

  +curve    (issue 21) an export's device check (5 verdict sets) with report.html's per-layer curve, over
            the same check without it (CURVE_TARGET: at most 1.5x)

  --mode    (issue 45) the precision mode emulated; a mixed mode (mixed_float16, mixed_bfloat16,
            allow_mix_precision) runs with the SoC's white/black/gray lists on (--soc picks the family), and its
            target is MIXED_TARGET (<= 2x one onnxruntime run); results go to ``results/precision_<mode>.json``

Usage: python benchmarks/bench_precision.py [--repeat 5] [--mode force_fp16] [--soc Ascend310P3]
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
# torchvision's PyPI wheel does not load against the CPU torch, and transformers imports it where installed;
# the models here are text models built from configs, which never need it
sys.modules.setdefault("torchvision", None)
TARGET = 3.0  # device parity time / one onnxruntime run
MIXED_TARGET = 2.0  # device parity time / one onnxruntime run, a mixed mode with the list emulation on (issue 45)
CURVE_TARGET = 1.5  # (device parity + report.html's per-layer curve) / device parity (issue 21)
EXPORT_SETS = 5  # the verdict sets of a default export (the example and 4 random sets)


def _like(value, seed: int):
    """Another input set like ``value``: floats redrawn, integer inputs (ids, masks) kept."""
    import numpy as np

    if not np.issubdtype(value.dtype, np.floating):
        return value
    return np.random.default_rng(seed).standard_normal(value.shape).astype(value.dtype)


def models():
    from precision_models import reduction_overflow
    from transformers import BertConfig, BertModel, Qwen2Config, Qwen2ForCausalLM, ResNetConfig, ResNetModel

    torch.manual_seed(0)
    bert = BertModel(BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
                                intermediate_size=1024)).eval()
    g = torch.Generator().manual_seed(0)
    bert_in = {"input_ids": torch.randint(0, 30522, (1, 128), generator=g),
               "attention_mask": torch.ones(1, 128, dtype=torch.int64)}
    qwen2 = Qwen2ForCausalLM(Qwen2Config(vocab_size=2000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=768, use_cache=False)).eval()
    qwen2_in = {"input_ids": torch.randint(0, 2000, (1, 128), generator=g)}
    overflow, overflow_in, _ = reduction_overflow()
    resnet = ResNetModel(ResNetConfig()).eval()  # the default config is ResNet-50
    resnet_in = {"pixel_values": torch.randn(1, 3, 224, 224, generator=g)}
    return {"bert-4L-256 (passes)": (bert, bert_in), "resnet-50 (passes)": (resnet, resnet_in),
            "qwen2-4L-256 (passes)": (qwen2, qwen2_in),
            "sum-of-squares 1300 (overflows)": (overflow, overflow_in)}


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure(path: str, feeds: dict, repeat: int, overflow: str = "saturation", mode: str = "force_fp16",
            soc: str = "Ascend310P3") -> dict:
    import onnx
    import onnxruntime as ort

    from cann_export.options import Tolerance
    from cann_export.validators.fix_precision import device_report
    from cann_export.validators.parity import mixed_lists
    from cann_export.validators.precision import Emulator

    graph = onnx.load(path)
    lists = mixed_lists(mode, soc, None)  # None unless the mode reduces by the lists
    target = TARGET if lists is None else MIXED_TARGET
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    names = [o.name for o in graph.graph.output]

    def plain():
        s = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        return s.run(None, {i.name: feeds[i.name] for i in s.get_inputs()})

    expected = [plain()]  # the fp32 graph's outputs stand in for the PyTorch reference

    def device():
        return device_report(graph, mode, [], [feeds], expected, names, Tolerance().device_policy(), {},
                             overflow=overflow, lists=lists)

    def verdict():  # what every export pays: the emulated graph, its session and run, no localisation
        return Emulator(graph, mode, overflow, lists=lists).session(set()).run(feeds)

    # what an atc_ready export runs: the device check on its verdict sets (the example and random ones, at the
    # example's shape), without and with report.html's per-layer curve (computed once, on one set)
    def plain_on(feed):
        s = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        return s.run(None, {i.name: feed[i.name] for i in s.get_inputs()})

    sets = [feeds] + [{k: _like(v, s) for k, v in feeds.items()} for s in range(1, EXPORT_SETS)]
    sets_expected = [plain_on(s) for s in sets]

    def export_check(layers: bool):
        return device_report(graph, mode, [], sets, sets_expected, names, Tolerance().device_policy(), {},
                             overflow=overflow, layers=layers, lists=lists)

    report = device()  # warm-up, and the verdict shown
    export_check(True)
    rounds = [(timed(plain), timed(device), timed(verdict), timed(lambda: export_check(False)),
               timed(lambda: export_check(True))) for _ in range(repeat)]
    t_plain, t_device, t_verdict, t_check, t_curve = (statistics.median(r[i] for r in rounds) for i in range(5))
    ratio = t_device / t_plain  # of the medians: one slow outlier on either side does not decide it
    first = report.get("first_divergence") or {}
    return {"mode": mode, "soc_lists": lists.family if lists is not None else None,
            "plain_s": t_plain, "device_s": t_device, "ratio": ratio, "target": target,
            "within_target": ratio <= target, "emulated_run_s": t_verdict, "emulated_run_ratio": t_verdict / t_plain,
            "repeat": repeat, "passed": report["passed"], "export_check_s": t_check, "with_curve_s": t_curve,
            "curve_ratio": t_curve / t_check, "curve_target": CURVE_TARGET,
            "curve_within_target": t_curve / t_check <= CURVE_TARGET,
            "localised": bool(first), "first_divergence": first.get("message")}


def measured(*args) -> dict:
    """``measure`` with numpy's BLAS on one thread, as every export and validate runs the check
    (pipeline/blas_threads.py): OpenBLAS's spinning threads otherwise slow the verdict's dot products 100x on a
    loaded machine, a cost no export pays."""
    from cann_export.pipeline.blas_threads import one_blas_thread

    return one_blas_thread(measure)(*args)


def main() -> None:
    import cann_export

    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--overflow", choices=("saturation", "inf_nan"), default="saturation",
                    help="the SoC overflow mode emulated (saturation: the default Ascend310P3; inf_nan: 910B*)")
    ap.add_argument("--mode", default="force_fp16", help="the precision mode emulated (a mixed one: with the lists)")
    ap.add_argument("--soc", default="Ascend310P3", help="the SoC whose mixed-precision lists a mixed mode uses")
    args = ap.parse_args()
    rows = []
    for name, (model, inputs) in models().items():
        with tempfile.TemporaryDirectory() as tmp:
            result = cann_export.export(model, Path(tmp) / "m.onnx", "onnx", example_inputs=inputs)
            feeds = {k: v.numpy() for k, v in inputs.items()}
            rows.append({"model": name, **measured(result.onnx["path"], feeds, args.repeat, args.overflow, args.mode,
                                                   args.soc)})
    target = rows[0]["target"]
    print(f"mode {args.mode}" + (f", {rows[0]['soc_lists']} lists" if rows[0]["soc_lists"] else ""))
    print(f"{'model':34} {'plain ORT s':>11} {'device parity s':>15} {'ratio':>6} {'<= ' + str(target):>6} "
          f"{'emulated':>8} {'+curve':>7} {'<= ' + str(CURVE_TARGET):>6}  localisation")
    for r in rows:
        print(f"{r['model']:34} {r['plain_s']:11.3f} {r['device_s']:15.3f} {r['ratio']:6.2f} "
              f"{'yes' if r['within_target'] else 'NO':>6} {r['emulated_run_ratio']:7.2f}x {r['curve_ratio']:6.2f}x "
              f"{'yes' if r['curve_within_target'] else 'NO':>6}  "
              f"{r['first_divergence'] or 'not needed'}")
    (HERE / "results").mkdir(exist_ok=True)
    name = "precision.json" if args.mode == "force_fp16" else f"precision_{args.mode}.json"
    (HERE / "results" / name).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
