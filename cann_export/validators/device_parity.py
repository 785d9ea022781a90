"""Device-precision parity: the emulated graph against the fp32 reference, localisation of the node
where precision breaks, and the --fix-precision loop that keeps such nodes (or whole modules) in fp32."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..capture import module_paths
from .device_policy import DevicePolicy, compare_output, cosine, judge
from .precision import INF_NAN, Emulator

BUDGET = 1 << 27  # float elements of intermediates exposed per localisation run (bounds memory)
FIX_ROUNDS = 16


def device_report(model: Any, mode: str, keep: list[str], feeds: list[dict[str, np.ndarray]],
                  expected: list[list[np.ndarray]], names: list[str], policy: dict[str, float],
                  paths: dict[str, str], emulator: Emulator | None = None,
                  overflow: str = INF_NAN) -> dict[str, Any]:
    """Emulate ``mode`` under the SoC's ``overflow`` mode; judge every output against the reference; localise the
    divergence on failure."""
    emulator = emulator or Emulator(model, mode, overflow)
    pol = DevicePolicy(**policy)
    keep_set = expand_keep(keep, paths)
    sess = emulator.session(keep_set)
    actual = [sess.run(feed) for feed in feeds]
    outputs = [compare_output(name, [a[k] for a in actual], [e[k] for e in expected], pol, emulator.emulation.epsilon,
                              emulator.saturation) for k, name in enumerate(names)]
    report: dict[str, Any] = {
        "precision": {"mode": mode, "emulated": emulator.emulation.description, "overflow": emulator.overflow,
                      "keep_dtype": list(keep),
                      "policy": pol.to_dict()},
        "tolerance": pol.to_dict(), "outputs": outputs, "passed": all(o["passed"] for o in outputs)}
    if not report["passed"] and emulator.emulation.reduces != "none":
        worst = _worst_set(actual, expected)
        failing = [o["name"] for o in outputs if not o["passed"]]
        report["first_divergence"] = localise(emulator, keep_set, feeds[worst], pol, paths, failing)
    return report


def expand_keep(keep: list[str], paths: dict[str, str]) -> set[str]:
    """keep_dtype entries as node names (a PyTorch module path stands for every node it produced)."""
    out = set()
    for entry in keep:
        out.add(entry)
        out.update(n for n, p in paths.items() if p == entry or p.startswith(entry + "."))
    return out


def _worst_set(actual: list[list[np.ndarray]], expected: list[list[np.ndarray]]) -> int:
    def score(a: np.ndarray, e: np.ndarray) -> float:
        a, e = np.asarray(a, dtype=np.float64).ravel(), np.asarray(e, dtype=np.float64).ravel()
        return cosine(a, e) if a.shape == e.shape else 0.0

    return int(np.argmin([min(score(a, e) for a, e in zip(act, exp, strict=False))
                          for act, exp in zip(actual, expected, strict=False)]))


def _chunks(emulator: Emulator, tensors: list[str]) -> list[list[str]]:
    known = [s for s in emulator.sizes.values()]
    default = max(known) if known else 1
    chunks, current, size = [], [], 0
    for t in tensors:
        n = emulator.sizes.get(t, default)
        if current and size + n > BUDGET:
            chunks.append(current)
            current, size = [], 0
        current.append(t)
        size += n
    return chunks + ([current] if current else [])


def localise(emulator: Emulator, keep: set[str], feed: dict[str, np.ndarray], policy: DevicePolicy,
             paths: dict[str, str], failing: list[str]) -> dict[str, Any] | None:
    """Where the divergence that reaches a failing output starts.

    Every node's float outputs are judged against fp32 with the output policy. Of the diverging tensors,
    those linked to a failing output by a path of diverging tensors are kept (a value that diverges and
    is healed downstream, such as a -3.4e38 attention mask that becomes -inf, is not the cause); the
    first of them in graph order whose producer reads no such tensor is the origin."""
    graph = emulator.model.graph
    producer = {out: node for node in graph.node for out in node.output if out}
    order = [out for node in graph.node if node.op_type != "Constant" for out in node.output
             if out in emulator.floats]
    verdicts: dict[str, dict[str, Any]] = {}
    eps = emulator.emulation.epsilon
    for chunk in _chunks(emulator, order):
        ref = emulator.session(expose=chunk, reference=True).run(feed, chunk)
        emu = emulator.session(keep, expose=chunk).run(feed, chunk)
        for t, r, e in zip(chunk, ref, emu, strict=False):
            verdicts[t] = judge(np.asarray(e), np.asarray(r), policy, eps, emulator.saturation)
    diverged = {t for t, v in verdicts.items() if not v["passed"]}
    linked = {t for t in failing if t in diverged}
    stack = list(linked)
    while stack:
        node = producer.get(stack.pop())
        for name in node.input if node is not None else ():
            if name in diverged and name not in linked:
                linked.add(name)
                stack.append(name)
    candidates = linked or diverged
    origin = next((t for t in order if t in candidates
                   and not any(i in candidates for i in producer[t].input)), None)
    origin = origin or next((t for t in order if t in candidates), None)
    if origin is None:
        return None
    node, v = producer[origin], verdicts[origin]
    where = module_paths.describe(node, paths)
    return {"node": node.name, "op_type": node.op_type, "tensor": origin, "module": paths.get(node.name),
            "cosine": v["cosine"], "max_abs": v["max_abs"], "overflow": v["non_finite"] or v["saturated"],
            "kept": node.name in keep, "reason": v.get("reason"),
            "message": f"first divergence: {where} cosine {v['cosine']:.2f}"
                       + (" (fp16 overflow)" if v["non_finite"] or v["saturated"] else "")}


def _module_nodes(path: str, paths: dict[str, str]) -> set[str]:
    return {n for n, p in paths.items() if p == path or p.startswith(path + ".")}


def _enclosing(path: str | None) -> list[str]:
    """``a.b.c`` -> ``["a.b.c", "a.b", "a"]`` (never the root module)."""
    parts = path.split(".") if path else []
    return [".".join(parts[:k]) for k in range(len(parts), 0, -1)]


def fix_precision(model: Any, mode: str, keep: list[str], feeds: list[dict[str, np.ndarray]],
                  expected: list[list[np.ndarray]], names: list[str], policy: dict[str, float],
                  paths: dict[str, str], overflow: str = INF_NAN) -> tuple[dict[str, Any], list[str]]:
    """Keep what diverges in fp32 until device parity passes under the emulation's rule.

    Each round keeps the node where the divergence starts; when the fix has already kept a node of the
    same PyTorch module and the divergence is there again (one node is not enough), it keeps the whole
    module, then the enclosing one. It stops when parity passes, or says why it cannot fix."""
    emulator = Emulator(model, mode, overflow)
    args = (feeds, expected, names, policy, paths)
    kept: list[str] = []
    modules: list[str] = []
    steps: list[dict[str, Any]] = []
    tried: set[str] = set()  # modules in which the fix kept a single node
    reason = None
    report = device_report(model, mode, keep, *args, emulator=emulator)
    for _ in range(FIX_ROUNDS):
        if report["passed"]:
            break
        first = report.get("first_divergence")
        if not first or not first["node"]:
            reason = "the divergence could not be traced to a named node of the graph"
            break
        node, module = first["node"], first["module"]
        keep_now = expand_keep(keep + kept, paths)
        add: list[str] = []
        scope = None
        if node not in keep_now and (not module or module not in tried):
            add, scope = [node], None
            if module:
                tried.add(module)
        else:
            for path in _enclosing(module):
                nodes = _module_nodes(path, paths) - keep_now
                if nodes:
                    add, scope = sorted(nodes, key=_graph_order(model)), path
                    break
        if not add:
            where = f"{first['module']} ({first['op_type']})" if first["module"] else node
            reason = (f"{where} diverges in fp32 too: it and every module around it are already kept, so its "
                      "inputs already lost the precision it needs; keep_dtype cannot fix it (use "
                      "--precision-mode must_keep_origin_dtype, or change the model)")
            break
        kept += add
        if scope:
            modules.append(scope)
        steps.append({"kept": add, "module": scope, "because": first["message"]})
        report = device_report(model, mode, keep + kept, *args, emulator=emulator)
    if not report["passed"] and reason is None:
        first = report.get("first_divergence") or {}
        reason = (f"device parity still fails after {FIX_ROUNDS} rounds ({len(kept)} nodes kept in fp32); "
                  f"{first.get('message', 'no node could be named')}")
    report["precision"]["fix"] = {"fixed": bool(report["passed"]), "kept": kept, "kept_modules": modules,
                                  "rounds": steps, **({"reason": reason} if reason else {})}
    return report, kept


def _graph_order(model: Any):
    index = {n.name: k for k, n in enumerate(model.graph.node)}
    return lambda name: index.get(name, len(index))
