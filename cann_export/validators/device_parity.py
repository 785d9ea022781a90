"""Device-precision parity: the emulated graph against the fp32 reference, localisation of the first
node where precision breaks, and the --fix-precision loop that keeps such nodes in fp32."""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import module_paths
from .metrics import compare_device, cosine, merge
from .precision import emulate, emulation_for, run, session

CHUNK = 256  # intermediate tensors exposed per localisation run (bounds memory on big models)
FIX_ROUNDS = 16


def device_report(model: Any, mode: str, keep: list[str], feeds: list[dict[str, np.ndarray]],
                  expected: list[list[np.ndarray]], names: list[str], policy: dict[str, float],
                  paths: dict[str, str]) -> dict[str, Any]:
    """Emulate ``mode``; compare every output with the reference; localise the divergence on failure."""
    emulation = emulation_for(mode)
    emulated = emulate(model, emulation, set(keep))
    actual = run(emulated, feeds)
    outputs = []
    for k, name in enumerate(names):
        per_set = [compare_device(np.asarray(actual[s][k]), expected[s][k], **policy) for s in range(len(feeds))]
        outputs.append({"name": name, "shape": list(expected[0][k].shape), **merge(per_set)})
    report: dict[str, Any] = {
        "precision": {"mode": mode, "emulated": emulation.description, "keep_dtype": list(keep)},
        "tolerance": dict(policy), "outputs": outputs, "passed": all(o["passed"] for o in outputs)}
    if not report["passed"] and emulation.rounds != "none":
        worst = _worst_set(actual, expected, names)
        report["first_divergence"] = localise(model, emulated, feeds[worst], policy["min_cosine"], paths)
    return report


def _worst_set(actual: list[list[np.ndarray]], expected: list[list[np.ndarray]], names: list[str]) -> int:
    scores = [min(cosine(np.asarray(a).astype(np.float64).ravel(), np.asarray(e).astype(np.float64).ravel())
                  for a, e in zip(actual[s], expected[s])) for s in range(len(actual))]
    return int(np.argmin(scores))


def localise(model: Any, emulated: Any, feed: dict[str, np.ndarray], min_cosine: float,
             paths: dict[str, str]) -> dict[str, Any] | None:
    """The first node, in graph order, whose rounded output diverges from fp32 (cosine below
    ``min_cosine`` or inf/nan where fp32 is finite). Intermediates are exposed as outputs in chunks."""
    from onnx import helper

    from .precision import _float_tensors

    floats = _float_tensors(model)
    graph_outputs = {o.name for o in model.graph.output}
    order = [(node, out) for node in model.graph.node for out in node.output
             if out in floats and out not in graph_outputs]
    order += [(node, out) for node in model.graph.node for out in node.output if out in graph_outputs]
    for start in range(0, len(order), CHUNK):
        chunk = order[start:start + CHUNK]
        values = []
        for m in (model, emulated):
            n_out = len(m.graph.output)
            m.graph.output.extend(helper.make_tensor_value_info(t, 1, None) for _, t in chunk
                                  if t not in graph_outputs)
            try:
                sess = session(m)
                wanted = [t for _, t in chunk]
                values.append(dict(zip(wanted, sess.run(wanted, {i.name: feed[i.name] for i in sess.get_inputs()}))))
            finally:
                del m.graph.output[n_out:]
        ref, emu = values
        for node, tensor in chunk:
            a = np.asarray(emu[tensor], dtype=np.float64).ravel()
            b = np.asarray(ref[tensor], dtype=np.float64).ravel()
            overflow = bool(np.any(~np.isfinite(a) & np.isfinite(b)))
            cos = 0.0 if overflow else cosine(a[np.isfinite(b)], b[np.isfinite(b)])
            if overflow or cos < min_cosine:
                where = module_paths.describe(node, paths)
                return {"node": node.name, "op_type": node.op_type, "tensor": tensor,
                        "module": paths.get(node.name), "cosine": cos, "overflow": overflow,
                        "message": f"first divergence: {where} cosine {cos:.2f}" + (" (fp16 overflow)" if overflow else "")}
    return None


def fix_precision(model: Any, mode: str, keep: list[str], *args: Any) -> tuple[dict[str, Any], list[str]]:
    """Add the first diverging node to keep_dtype and re-validate until parity passes or FIX_ROUNDS."""
    kept: list[str] = []
    report = device_report(model, mode, keep, *args)
    for _ in range(FIX_ROUNDS):
        first = report.get("first_divergence")
        if report["passed"] or not first or first["node"] in kept or not first["node"]:
            break
        kept.append(first["node"])
        report = device_report(model, mode, keep + kept, *args)
    return report, kept
