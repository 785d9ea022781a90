"""Measure the fp32 parity margins of the corpus (tests/helpers/fp32_corpus.py): every architecture exported with
the plain command, then each kind of input set (the example, draws from its distribution, heavy-tailed / wide /
scaled / sign-flipped probes) run through onnxruntime and the model, with the scale-free metrics the policy
reads. ``python -m tests.helpers.fp32_calibration [names...]`` prints one line per model, set and output."""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def set_metrics(actual: np.ndarray, expected: np.ndarray, kind: str, noise: float) -> dict[str, float]:
    from cann_export.options import Tolerance
    from cann_export.parity_metrics import compare, compare_probe

    verdict = kind in VERDICT_KINDS
    new = (compare(actual, expected, Tolerance(), noise) if verdict else compare_probe(actual, expected, Tolerance()))
    peak_rule = compare(actual, expected, Tolerance())["passed"] if verdict else None
    a, b = actual.astype(np.float64).ravel(), expected.astype(np.float64).ravel()
    err = np.abs(a - b)
    peak = float(np.abs(b).max()) if b.size else 0.0
    rms = float(np.sqrt(np.mean(b ** 2))) if b.size else 0.0
    cos = float(np.dot(a, b) / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-300))
    elementwise = bool(np.all(err <= 1e-4 + 1e-3 * np.abs(b)))
    return {"max_abs": float(err.max()), "peak": peak, "max_abs/peak": float(err.max()) / peak if peak else 0.0,
            "rel_rms": float(np.sqrt(np.mean(err ** 2))) / rms if rms else 0.0, "1-cos": 1.0 - cos,
            "err/noise": float(err.max()) / noise if noise > 0 else 0.0,
            "old_rule": elementwise, "peak_rule": peak_rule, "new_rule": new["passed"]}


def probe_sets(example: dict, model) -> list[tuple[str, dict]]:
    from cann_export.inputs.path_probes import path_variants
    from cann_export.inputs import tensors
    from cann_export.inputs.signature import feed_embedding_rows

    vocab = feed_embedding_rows(model, example)
    kinds = ("normal", "normal", "uniform", "laplace", "wide_normal")
    draws = tensors.random_variants(example, len(kinds), 1, vocab, kinds)
    named = [("example", example)] + [(f"{k}#{i}", d) for i, (k, d) in enumerate(zip(kinds, draws, strict=True))]
    return named + [(f"scale{s:g}", v) for s, v in zip((-1, 4, -4, 0.25), path_variants(example), strict=False)]


def measure(name: str, build) -> list[dict]:
    import onnx
    import onnxruntime as ort
    import torch

    from cann_export.inputs.float_noise import fp64_noise

    from .wrong_graphs import TAMPERS

    import cann_export
    from cann_export.inputs.tensors import flatten_outputs

    model, example = build()
    out = Path(tempfile.mkdtemp()) / f"{name}.onnx"
    t0 = time.time()
    result = cann_export.export(model, out, export_format="onnx", example_inputs=example)
    took = time.time() - t0
    onnx_path = Path(result.output)
    sets = probe_sets(example, model)
    with torch.no_grad():
        refs = [flatten_outputs(model(**feed))[1] for _, feed in sets]
    noise = fp64_noise(model, "module", [f for _, f in sets], [[r.numpy() for r in ref] for ref in refs],
                       list(range(len(sets))))
    graphs = {"healthy": onnx.load(str(onnx_path))}
    graphs.update({f"WRONG {t}": g for t, fn in TAMPERS.items() if (g := fn(graphs["healthy"])) is not None})
    rows = []
    for graph_name, graph in graphs.items():
        sess = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
        wanted = [i.name for i in sess.get_inputs()]
        for s, ((kind, feed), ref) in enumerate(zip(sets, refs, strict=True)):
            if graph_name != "healthy" and kind not in VERDICT_KINDS:
                continue
            got = sess.run(None, {n: feed[n].numpy() for n in wanted})
            for k, (a, e) in enumerate(zip(got, ref, strict=False)):
                if e.dtype.is_floating_point:
                    rows.append({"model": name, "graph": graph_name, "set": kind, "output": k,
                                 **set_metrics(np.asarray(a), e.numpy(), kind, (noise[s] or [0.0] * len(ref))[k])})
    print(f"# {name}: export {took:.0f}s, verdict {result.parity.get('passed')}", flush=True)
    return rows


VERDICT_KINDS = ("example", "normal#0", "normal#1", "uniform#2")


def summarize(rows: list[dict]) -> list[str]:
    """The margins: healthy maxima (verdict sets, probes) and, per wrong graph, whether each rule refused it."""
    healthy = [r for r in rows if r["graph"] == "healthy"]
    lines = []
    for title, group in (("verdict", [r for r in healthy if r["set"] in VERDICT_KINDS]),
                         ("probe", [r for r in healthy if r["set"] not in VERDICT_KINDS])):
        worst = max(group, key=lambda r: r["max_abs/peak"])
        lines.append(f"healthy {title} outputs {len(group)}: max abs/peak <= {worst['max_abs/peak']:.3g} "
                     f"({worst['model']} {worst['set']}), err/noise <= {max(r['err/noise'] for r in group):.3g}, "
                     f"1-cos <= {max(r['1-cos'] for r in group):.3g}; refused: old rule "
                     f"{sum(not r['old_rule'] for r in group)}, new rule {sum(not r['new_rule'] for r in group)}")
    wrong: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["graph"] != "healthy":
            wrong.setdefault((r["model"], r["graph"]), []).append(r)
    for (model, graph), group in sorted(wrong.items()):
        refused = {rule: any(not r[rule] for r in group) for rule in ("old_rule", "peak_rule", "new_rule")}
        lines.append(f"{model} {graph}: max abs/peak {max(r['max_abs/peak'] for r in group):.3g}, err/noise "
                     f"{max(r['err/noise'] for r in group):.3g}; refused {refused}")
    return lines


def main(names: list[str]) -> None:
    from .fp32_corpus import CORPUS

    rows = []
    for name in names or list(CORPUS):
        for r in measure(name, CORPUS[name]):
            rows.append(r)
            print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()), flush=True)
    print("\n".join(summarize(rows)))


if __name__ == "__main__":
    main(sys.argv[1:])
