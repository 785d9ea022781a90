#!/usr/bin/env python
"""Numbers for calibrating the int8 parity policy (issue 18), on the QAT architecture corpus
(tests/helpers/qat_corpus.py): each architecture through the articles' QAT flow, then per output, in units of
the output's 8-bit step (its range / 255): max error, RMS error, share of elements within 1 step, and cosine,

- the written graph (onnxruntime, basic optimisations) against the fake-quant torch model, and against the
  fp32 float model (the trained weights without fake quantization), on the example and fresh inputs;
- the fake-quant torch model against the float model (the accuracy cost of int8, no graph involved), and
  against itself (its noise floor: in float64, and on inputs perturbed by 1e-6; qat_checks.noise_floor);
- broken lowerings (tests/helpers/qat_broken.py) against the fake-quant model: torch variants (need no
  graph) and graph variants (need a written graph);
- the tool's own parity verdict and per-output numbers, the Q/DQ placement and the op counts against the
  float model's export.

Usage: PYTHONPATH=$PWD:$PWD/tests python tests/helpers/qat_corpus_stats.py OUT.json [names...]
Prints one line per architecture; writes OUT.json (strict JSON, inf as "inf").
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers import qat_broken, qat_checks as qc, qat_flow  # noqa: E402
from helpers.qat_corpus import CORPUS  # noqa: E402

SEEDS = (777, 778, 779)


def _sets(flow: qat_flow.Flow) -> dict[str, dict[str, Any]]:
    return {"example": flow.case.example_inputs, **{f"fresh{s}": flow.case.inputs(s) for s in SEEDS}}


def _metrics(got: dict[str, list], ref: dict[str, list]) -> dict[str, Any]:
    """Per input set: the worst output and every output; plus the worst over the sets."""
    per_set = {k: qc.compare(got[k], ref[k]) for k in ref}
    worst = qc.worst([o for outs in per_set.values() for o in outs])
    return {"worst": worst, "sets": {k: {"worst": qc.worst(v), "outputs": v} for k, v in per_set.items()}}


def measure(name: str, root: Path) -> dict[str, Any]:
    import onnx

    from cann_export.qat.fake_quant import quant_layers

    cpu, wall = time.process_time(), time.perf_counter()
    flow = qat_flow.run(name, root)
    entry: dict[str, Any] = {"seconds": {**flow.seconds, "cpu_total": 0.0},
                             "quantized_layers": len(quant_layers(flow.model))}
    sets = _sets(flow)
    fq = {k: qc.torch_outputs(flow.model, v) for k, v in sets.items()}
    fl = {k: qc.torch_outputs(flow.float_model, v) for k, v in sets.items()}
    entry["fake_quant_vs_float_torch"] = _metrics(fq, fl)
    entry["fake_quant_noise_floor"] = {k: qc.noise_floor(flow.model, v) for k, v in sets.items()}
    entry["export_changed_user_model_max_abs"] = flow.changed_by_export
    if flow.error:
        entry["export"] = {"raised": flow.error}
    else:
        parity = flow.result.parity or {}
        entry["export"] = {"ok": bool(flow.result.ok), "reason": parity.get("reason"),
                           "tool_outputs": [{k: o.get(k) for k in ("name", "max_abs", "max_rel", "cosine",
                                                                   "quant_step", "failed_sets")}
                                            for o in parity.get("graph_fp32", parity).get("outputs", [])]}
    if flow.graph_path is not None:
        graph = onnx.load(str(flow.graph_path))
        got = {k: qc.run_graph(flow.graph_path, v) for k, v in sets.items()}
        entry["graph_vs_fake_quant"] = _metrics(got, fq)
        entry["graph_vs_float"] = _metrics(got, fl)
        placement = qc.qdq_placement(graph)
        entry["placement"] = {**placement, "float_compute": len(placement["float_compute"]),
                              "problems": placement["problems"][:20], "problem_count": len(placement["problems"])}
        mine, theirs = qc.op_counts(graph), qc.op_counts(flow.float_graph)
        entry["op_counts_vs_float_export"] = {k: [mine[k], theirs[k]] for k in sorted(set(mine) | set(theirs))
                                              if mine[k] != theirs[k]}
        entry["broken_graph"] = {}
        for label, breaker in qat_broken.GRAPH_BROKEN.items():
            made = breaker(graph)
            if made is None:
                continue
            path = root / f"{name}_{label.replace('@', '_')}.onnx"
            onnx.save(made[0], str(path))
            bad = {k: qc.run_graph(path, v) for k, v in sets.items()}
            entry["broken_graph"][label] = {"where": made[1], **_metrics(bad, fq)}
    entry["broken_torch"] = {}
    for label, breaker in qat_broken.TORCH_BROKEN.items():
        made = breaker(flow.model)
        if made is None:
            continue
        bad = {k: qc.torch_outputs(made[0].eval(), v) for k, v in sets.items()}
        entry["broken_torch"][label] = {"where": made[1], **_metrics(bad, fq)}
    entry["seconds"]["cpu_total"] = time.process_time() - cpu
    entry["seconds"]["wall_total"] = time.perf_counter() - wall
    return qc.rounded(entry)


def _line(name: str, e: dict[str, Any]) -> str:
    ex = e["export"]
    verdict = "raised " + ex["raised"][:90] if "raised" in ex else ("ok" if ex["ok"] else "parity FAILS")
    g = e.get("graph_vs_fake_quant", {}).get("worst")
    graph = f"graph/fq max {g['max_steps']} st, cos {g['cosine']}" if g else "no graph"
    broken = min((b["worst"]["cosine"] for b in e["broken_torch"].values()), default=None)
    return f"{name:20s} {e['seconds']['cpu_total']:6.1f}s cpu  {verdict:14s} {graph}  (broken min cos {broken})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("names", nargs="*", default=list(CORPUS))
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    stats: dict[str, Any] = {"seeds": list(SEEDS), "unit": "steps = |graph - reference| / (reference range / 255)",
                             "architectures": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.names:
            entry = measure(name, Path(tmp))
            stats["architectures"][name] = entry
            print(_line(name, entry), flush=True)
    tmp_out = args.out.with_suffix(".tmp")
    tmp_out.write_text(json.dumps(stats, indent=1, allow_nan=False))
    tmp_out.replace(args.out)


if __name__ == "__main__":
    main()
