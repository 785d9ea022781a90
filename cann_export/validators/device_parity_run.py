"""Device-precision parity of one graph and keep set: the emulated outputs against the fp32 reference,
and on failure the origin of the divergence (validators/origin.py)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..heap_release import give_back
from ..progress import counted
from . import msprobe_metrics
from .device_verdict import DevicePolicy, compare_output, within_int8_noise
from .origin import BUDGET, float_values, localise
from .emulators import emulator_for
from .layers import agreement, curve, one_sample, sampled_curve
from .precision import INF_NAN, Emulator


SMALL = 1 << 22  # float elements of every value together, below which the verdict's run exposes them all


def in_graph(paths: dict[str, str], model: Any) -> dict[str, str]:
    """The module paths of the nodes the graph holds: the capture stage records them before onnxsim,
    which removes and merges nodes, so a name it no longer has must never reach a keep set."""
    names = {n.name for n in model.graph.node if n.name}
    return {n: p for n, p in paths.items() if n in names}


def device_report(model: Any, mode: str, keep: list[str], feeds: list[dict[str, np.ndarray]],
                  expected: list[list[np.ndarray]], names: list[str], policy: dict[str, float],
                  paths: dict[str, str], emulator: Emulator | None = None,
                  localise_failure: bool = True, overflow: str = INF_NAN, deq_scale: str = "s19",
                  float_expected: list[list[np.ndarray]] | None = None, layers: bool = False, lists: Any = None
                  ) -> dict[str, Any]:
    """Emulate ``mode`` under the SoC's ``overflow`` mode (a Q/DQ graph's quantized ops on the int8 path, the SoC's
    AscendDequant scale held as ``deq_scale``); judge every output against the reference; localise the divergence
    on failure. A Q/DQ graph's output that fails the fp16 rule against the fake-quant model is judged against
    ``float_expected`` (the float model's outputs) too (device_verdict.within_int8_noise). ``layers``: the per-layer
    curve (validators/layers.py). ``lists``: the SoC's mixed lists (atc/mixlists.py)."""
    emulator = emulator or emulator_for(model, mode, overflow, deq_scale, lists)
    paths = in_graph(paths, model)
    pol = DevicePolicy(**policy)
    keep_set = expand_keep(keep, paths)
    # a small graph exposes every value in the verdict's own run, so a localisation needs no second emulated run
    values = float_values(emulator)
    sizes = emulator.sizes
    if layers and any(t not in sizes for t in values):  # a dynamic graph: its sizes at the first set's shapes
        from .precision import value_types

        sizes = {**value_types(model, {k: np.shape(v) for k, v in feeds[0].items()})[1], **sizes}
    total = sum(sizes.get(t, BUDGET) for t in values)
    expose = values if total <= SMALL else []
    # the per-layer curve of a larger graph: on the first set, its values fetched in the verdict's own run; past what
    # one run exposes, on the worst set's worst sample where it is a batch (layers.sampled_curve)
    first_only = values if layers and not expose and total <= BUDGET else []
    sample = layers and not expose and not first_only and one_sample(emulator, feeds[0])
    sess = emulator.reused_session(keep_set, expose=expose or first_only)
    outs = [o.name for o in model.graph.output]
    extra = [t for t in expose or first_only if t not in outs]
    runs = _emulated_runs(sess, feeds, outs, extra, bool(expose))
    actual = [r[:len(outs)] for r in runs]
    outputs = [compare_output(name, [a[k] for a in actual], [e[k] for e in expected], pol, emulator.emulation.epsilon,
                              emulator.saturation) for k, name in enumerate(names)]
    if emulator.int8 is not None and float_expected and len(float_expected) == len(expected):
        outputs = [within_int8_noise(o, [a[k] for a in actual], [e[k] for e in expected],
                                     [f[k] for f in float_expected], pol) if all(k < len(f) for f in float_expected)
                   else o for k, o in enumerate(outputs)]
    report: dict[str, Any] = {
        "precision": {"mode": mode, "emulated": emulator.emulation.description, "overflow": emulator.overflow,
                      "keep_dtype": list(keep), "policy": pol.to_dict()},
        "tolerance": pol.to_dict(), "outputs": msprobe_metrics.attach(outputs, actual, expected),  # + msprobe's
        "passed": all(o["passed"] for o in outputs)}
    if emulator.int8 is not None:  # the quantized ops ran as AscendQuant -> int8/int32 -> AscendDequant
        report["precision"]["int8"] = emulator.int8.summary()
    localising = not report["passed"] and localise_failure
    if (localising or layers) and emulator.emulation.reduces != "none":
        worst = worst_set(actual, expected)
        held = dict(zip(outs + extra, runs[worst], strict=True)) if expose else None
        if layers:
            at = 0 if first_only else worst
            on = dict(zip(outs + extra, runs[0], strict=True)) if first_only else held
            report["layers"] = sampled_curve(emulator, keep_set, feeds[at], pol, paths, at, (
                actual[at], expected[at])) if sample else curve(emulator, keep_set, feeds[at], pol, paths, on, at)
        if localising:
            failing = [o["name"] for o in outputs if not o["passed"]]
            report["first_divergence"] = localise(emulator, keep_set, feeds[worst], pol, paths, failing, held)
    return report


def _emulated_runs(sess: Any, feeds: list[dict[str, np.ndarray]], outs: list[str], extra: list[str],
                   every: bool) -> list[list[np.ndarray]]:
    """Each set's emulated outputs, ``extra`` values fetched too on every set (``every``) or on the first only;
    one set at a time, the heap given back between (a set's run does not stack on the last one's intermediates)."""
    runs = []
    for s, feed in enumerate(counted(feeds, "emulated device sets")):
        runs.append(sess.run(feed, outs + (extra if every or s == 0 else [])))
        give_back()
    return runs


def expand_keep(keep: list[str], paths: dict[str, str]) -> set[str]:
    """keep_dtype entries as node names (a PyTorch module path stands for every node it produced)."""
    out = set()
    for entry in keep:
        out.add(entry)
        out.update(n for n, p in paths.items() if p == entry or p.startswith(entry + "."))
    return out


def worst_set(actual: list[list[np.ndarray]], expected: list[list[np.ndarray]]) -> int:
    return int(np.argmin([min(agreement(a, e) for a, e in zip(act, exp, strict=False))
                          for act, exp in zip(actual, expected, strict=False)]))
