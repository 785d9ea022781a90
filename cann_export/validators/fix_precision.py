"""--fix-precision: a small keep set, in names of the graph as written, under which device parity passes.

Like Polygraphy's ``debug precision``: it grows a keep set from the origin of the divergence (the origin's
node; when the divergence comes back in the same module, the module, then the enclosing one), falls back
to every node in fp32 when growing does not land, then shrinks the set by bisection (dropping halves,
quarters, ... that parity passes without). Every name it keeps is a node of the graph it ran on (the
written model.onnx), never one the capture stage recorded before simplification. It reports how many
ops it kept and their share of the graph's estimated FLOPs, or why it cannot fix."""
from __future__ import annotations

from typing import Any

import numpy as np

from . import flops
from .device_parity_run import device_report, expand_keep, in_graph
from .emulators import emulator_for
from .precision import INF_NAN

__all__ = ["device_report", "expand_keep", "fix_precision"]

FIX_ROUNDS = 16  # origin-driven growth rounds
SHRINK_TRIALS = 32  # parity runs the bisection may spend


class Trial:
    """Device parity of one keep set (the user's entries plus ``kept``), counted."""

    def __init__(self, model: Any, mode: str, keep: list[str], args: tuple, overflow: str = INF_NAN,
                 deq_scale: str = "s19", float_expected: list | None = None, lists: Any = None):
        self.model, self.mode, self.keep, self.args = model, mode, keep, args
        self.float_expected = float_expected
        self.emulator = emulator_for(model, mode, overflow, deq_scale, lists)
        self.runs = 0

    def report(self, kept: list[str], localise: bool = True, layers: bool = False) -> dict[str, Any]:
        self.runs += 1
        return device_report(self.model, self.mode, self.keep + kept, *self.args, emulator=self.emulator,
                             localise_failure=localise, float_expected=self.float_expected, layers=layers)

    def passes(self, kept: list[str], allowed: set[str] | None = None) -> bool:
        """Parity passes; with ``allowed``, no value but those is inf/nan (no branch left dead that the
        loose output rule lets through)."""
        if not self.report(kept, localise=False)["passed"]:
            return False
        return allowed is None or self.non_finite(kept) <= allowed

    def non_finite(self, kept: list[str]) -> set[str]:
        """The float values that hold inf/nan (on a saturating SoC: a saturated +-max) on the device, on the first
        input set."""
        from .origin import chunks, earlier_reads, feed_sizes, fetched, float_values

        e = self.emulator
        order = float_values(e)
        keep = expand_keep(self.keep + kept, self.args[4])
        feed = self.args[0][0]
        runs = chunks(e, order, feed_sizes(e, feed))
        bad = set()
        for chunk, values in fetched(feed, runs, earlier_reads(e.model, runs),
                                     lambda chunk, cut: e.session(keep, expose=chunk, only=True, cut=cut)):
            sat = e.saturation
            bad.update(t for t, v in zip(chunk, values, strict=False)
                       if not np.all(np.isfinite(v)) or (sat is not None and np.any(np.abs(v) == sat)))
        return bad


def _module_nodes(path: str, paths: dict[str, str]) -> set[str]:
    return {n for n, p in paths.items() if p == path or p.startswith(path + ".")}


def _enclosing(path: str | None) -> list[str]:
    """``a.b.c`` -> ``["a.b.c", "a.b", "a"]`` (never the root module)."""
    parts = path.split(".") if path else []
    return [".".join(parts[:k]) for k in range(len(parts), 0, -1)]


def _next_keep(first: dict[str, Any], keep_now: set[str], tried: set[str], paths: dict[str, str],
               order: Any) -> tuple[list[str], str | None]:
    """What one growth round adds: the origin's node, or (when its module was tried) the module, then the
    enclosing one; ``[]`` when all of those are kept already."""
    node, module = first["node"], first["module"]
    if node not in keep_now and (not module or module not in tried):
        if module:
            tried.add(module)
        return [node], None
    for path in _enclosing(module):
        nodes = _module_nodes(path, paths) - keep_now
        if nodes:
            return sorted(nodes, key=order), path
    return [], None


def grow(trial: Trial, paths: dict[str, str], order: Any) -> tuple[list[str], list[dict[str, Any]], str | None]:
    """Origin-driven growth: ``(kept, rounds, why it stopped short)``; the reason is None once it passes."""
    kept: list[str] = []
    steps: list[dict[str, Any]] = []
    tried: set[str] = set()  # modules in which the fix kept a single node
    report = trial.report(kept)
    for _ in range(FIX_ROUNDS):
        if report["passed"]:
            return kept, steps, None
        first = report.get("first_divergence")
        if not first or not first["node"]:
            return kept, steps, "the divergence could not be traced to a named node of the graph"
        add, scope = _next_keep(first, expand_keep(trial.keep + kept, paths), tried, paths, order)
        if not add:
            where = f"{first['module']} ({first['op_type']})" if first["module"] else first["node"]
            return kept, steps, f"{where} still diverges with it and every module around it kept"
        kept += add
        steps.append({"kept": add, "module": scope, "because": first["message"]})
        report = trial.report(kept)
    if report["passed"]:
        return kept, steps, None
    first = report.get("first_divergence") or {}
    return kept, steps, (f"device parity still failed after {FIX_ROUNDS} rounds ({len(kept)} nodes kept); "
                         f"{first.get('message', 'no node could be named')}")


def shrink(trial: Trial, kept: list[str], budget: int = SHRINK_TRIALS) -> list[str]:
    """ddmin over ``kept``: drop a chunk whenever parity passes without it and no new value overflows,
    halving chunks when none can go."""
    allowed = trial.non_finite(kept)
    parts = 2
    spent = 0
    while len(kept) >= 2 and spent < budget:
        size = -(-len(kept) // parts)
        pieces = [kept[k:k + size] for k in range(0, len(kept), size)]
        for piece in pieces:
            if spent >= budget:
                break
            rest = [n for n in kept if n not in set(piece)]
            spent += 1
            if trial.passes(rest, allowed):
                kept, parts = rest, max(parts - 1, 2)
                break
        else:
            if parts >= len(kept):
                break
            parts = min(len(kept), parts * 2)
    return kept


def _whole_modules(kept: list[str], paths: dict[str, str]) -> list[str]:
    """The outermost modules every node of which is kept."""
    held = set(kept)
    whole = sorted({p for n, p in paths.items() if n in held and p}, key=len)
    out: list[str] = []
    for path in whole:
        for candidate in _enclosing(path)[::-1]:
            if any(candidate == o or candidate.startswith(o + ".") for o in out):
                break
            if _module_nodes(candidate, paths) <= held:
                out.append(candidate)
                break
    return sorted(set(out))


def fix_precision(model: Any, mode: str, keep: list[str], feeds: list[dict[str, np.ndarray]],
                  expected: list[list[np.ndarray]], names: list[str], policy: dict[str, float],
                  paths: dict[str, str], overflow: str = INF_NAN,
                  deq_scale: str = "s19", float_expected: list | None = None,
                  layers: bool = False, lists: Any = None) -> tuple[dict[str, Any], list[str]]:
    """Keep nodes in fp32 until device parity passes under the emulation's rule (the SoC's ``overflow`` mode and
    AscendDequant scale); a small set, or why not. ``layers``: the final report carries the per-layer curve."""
    paths = in_graph(paths, model)
    trial = Trial(model, mode, list(keep), (feeds, expected, names, policy, paths), overflow, deq_scale,
                  float_expected, lists)
    index = {n.name: k for k, n in enumerate(model.graph.node)}
    order = lambda name: index.get(name, len(index))  # noqa: E731
    kept, steps, short = grow(trial, paths, order)
    reason = None
    if short is not None:
        everything = [n.name for n in model.graph.node if n.name and trial.emulator.reduced(n, set())]
        if trial.passes(everything):
            steps.append({"kept": "every node", "module": None, "because": short})
            kept = everything
        else:
            reason = ("device parity fails even with every node kept in fp32, so what diverges is not the "
                      "device's precision: the graph differs from the reference in fp32 (see the fp32 parity "
                      f"report); keep_dtype cannot fix that ({short})")
            kept = []
    if reason is None and kept:
        kept = sorted(shrink(trial, kept), key=order)
    report = trial.report(kept, layers=layers)
    shapes = {name: tuple(np.shape(value)) for name, value in feeds[0].items()} if feeds else None
    report["precision"]["fix"] = _fix_summary(model, report, kept, steps, paths, trial.runs, reason, shapes)
    return report, kept


def _fix_summary(model: Any, report: dict[str, Any], kept: list[str], steps: list[dict[str, Any]],
                 paths: dict[str, str], runs: int, reason: str | None,
                 shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, Any]:
    per_node = flops.node_flops(model, shapes)  # a dynamic graph weighed at the first parity set's shapes
    ops = sum(1 for n in model.graph.node if n.op_type != "Constant")
    summary = {"fixed": bool(report["passed"]) and reason is None, "kept": kept,
               "kept_modules": _whole_modules(kept, paths), "kept_ops": len(kept), "graph_ops": ops,
               "kept_flops_share": round(flops.share(kept, per_node), 6), "rounds": steps, "parity_runs": runs}
    if reason is None and not report["passed"]:
        first = report.get("first_divergence") or {}
        reason = f"device parity still fails with the keep set found; {first.get('message', 'no node named')}"
    if reason:
        summary["reason"] = reason
    if kept:  # how keep_dtype.cfg writes the set: op types where names could vanish in fusion, else names
        from ..atc.precision_cfg import fix_entries

        summary["written_as"] = fix_entries(kept, model)[1]
    return summary
