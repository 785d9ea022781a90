"""The origin of a device-precision divergence: the first node, in graph order, whose emulated result is
wrong while every input it reads is right, and whose wrong result reaches a failing output.

Every node's float outputs are judged against fp32 with the device policy. A wrong value whose wrong inputs
are all *benign* is a candidate. A candidate is benign itself only when it is wrong *by design* and heals:
- by design: its node reads a constant past the fp16 range (a float32-min mask fill), or a benign value
  (the mask added to the scores), or it is, or feeds, a clamp / select (Clip, Min, Max, Where, Relu);
- heals: fed alone, as the device holds it, into the fp32 reference graph, it leaves every failing output
  within one fp16 rounding step of the reference (the softmax gives the same zeros; the clamp the same bound).
A value the data drives out of range (an RMSNorm whose x.pow(2) is inf) is never benign, even where the
residual around it hides most of the damage: the origin is the first norm, not the last."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..graph import module_paths
from .device_verdict import DevicePolicy, judge
from .precision import DATA_MOVEMENT, Emulator, Session, value_types

BUDGET = 1 << 24  # float elements of intermediates exposed per localisation run (bounds memory: 64 MiB of fp32)
TRIALS = 12  # candidates fed into the reference, at most, before the first one left is named
PASS_THROUGH = DATA_MOVEMENT | {"Cast", "CastLike"}  # a wrong value moved, not made
BOUNDING = frozenset({"Clip", "Min", "Max", "Where", "Relu"})  # ops that clamp or select a value back
FP16_MAX = 65504.0


def chunks(emulator: Emulator, tensors: list[str], sizes: dict[str, int] | None = None) -> list[list[str]]:
    """``tensors`` in runs whose exposed elements stay within BUDGET (``sizes``: the element counts of a run
    that held them; else the graph's static shapes, an unknown one counted as the largest)."""
    sizes = sizes or emulator.sizes
    known = list(sizes.values())
    default = max(known) if known else 1
    out, current, size = [], [], 0
    for t in tensors:
        n = sizes.get(t, default)
        if current and size + n > BUDGET:
            out.append(current)
            current, size = [], 0
        current.append(t)
        size += n
    return out + ([current] if current else [])


def float_values(emulator: Emulator) -> list[str]:
    """The float values the graph's nodes make, in graph order (constants aside, and what the emulator computed
    from weights alone and feeds as one: the same fp32 array on the device and in the reference)."""
    return [out for k, node in enumerate(emulator.model.graph.node) if node.op_type != "Constant"
            and k not in emulator.folded for out in node.output if out in emulator.floats]


def value_pairs(emulator: Emulator, keep: set[str], feed: dict[str, np.ndarray], order: list[str],
                held: dict[str, np.ndarray] | None = None) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """``(value, device array, fp32 array)`` of every value of ``order``, run in chunks within BUDGET;
    ``held``: the device values a run already fetched (sized from them, not re-run). A dynamic graph's values are
    sized at the feed's shapes: counted at the graph's static sizes alone, a long-window encoder's attention scores
    (unknown there) went into one run together, 620 MiB of them."""
    sizes = {t: int(np.asarray(v).size) for t, v in held.items()} if held is not None else None
    if sizes is None or not all(t in sizes for t in order):
        sizes = feed_sizes(emulator, feed)
    runs = chunks(emulator, order, sizes)
    reads = earlier_reads(emulator.model, runs)
    ref = fetched(feed, runs, reads, lambda chunk, cut: emulator.session(
        expose=chunk, reference=True, only=True, cut=cut))
    emu = fetched(feed, runs, reads, lambda chunk, cut: _Held(held) if held is not None and all(
        t in held for t in chunk) else emulator.session(keep, expose=chunk, only=True, cut=cut))
    for (chunk, refs), (_, emus) in zip(ref, emu, strict=True):
        for t, e, r in zip(chunk, emus, refs, strict=True):
            yield t, np.asarray(e), np.asarray(r)


def feed_sizes(emulator: Emulator, feed: dict[str, np.ndarray]) -> dict[str, int]:
    """The element counts of the graph's values at the feed's shapes (the static ones where inference has none)."""
    return {**value_types(emulator.model, {k: np.shape(v) for k, v in feed.items()})[1], **emulator.sizes}


def fetched(feed: dict[str, np.ndarray], runs: list[list[str]], reads: list[set[str]],
            opened: Callable[[list[str], frozenset[str]], Any]) -> Iterator[tuple[list[str], list[np.ndarray]]]:
    """``(run, its arrays)`` for each run of ``runs``, the session ``opened(run, cut)`` fed the arrays of the
    earlier runs' values it reads (``reads``: earlier_reads), each kept only until the last run that reads it."""
    last = {t: k for k, read in enumerate(reads) for t in read}
    kept: dict[str, np.ndarray] = {}
    for k, chunk in enumerate(runs):
        arrays = opened(chunk, frozenset(kept)).run({**feed, **kept}, chunk)
        for t in [t for t in kept if last[t] <= k]:
            del kept[t]
        kept.update((t, a) for t, a in zip(chunk, arrays, strict=True) if last.get(t, -1) > k)
        yield chunk, arrays


def earlier_reads(model: Any, runs: list[list[str]]) -> list[set[str]]:
    """For each run of ``runs`` (values of ``model`` fetched together, in graph order), the values of earlier runs
    its values are made from: fed to it, they spare recomputing the graph up to them (a long-window encoder's
    per-layer curve ran its first layers once per run: 39 -> 5.6 CPU-s)."""
    producer = {o: n for n in model.graph.node for o in n.output if o}
    before: set[str] = set()
    out = []
    for chunk in runs:
        seen, fed, stack = set(), set(), list(chunk)
        while stack:
            value = stack.pop()
            if value in seen:
                continue
            seen.add(value)
            if value in before:
                fed.add(value)
            elif value in producer:
                stack.extend(i for i in producer[value].input if i)
        out.append(fed)
        before.update(chunk)
    return out


class _Held:
    """A run's values the verdict's own run already fetched, served as a session would."""

    def __init__(self, held: dict[str, np.ndarray]):
        self.held = held

    def run(self, feed: dict[str, np.ndarray], names: list[str]) -> list[np.ndarray]:
        return [self.held[t] for t in names]


def _judge_all(emulator: Emulator, keep: set[str], feed: dict[str, np.ndarray], policy: DevicePolicy,
               order: list[str], held: dict[str, np.ndarray] | None = None,
               ) -> tuple[dict[str, dict[str, Any]], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Verdict of every value, and (device, reference) arrays of the wrong ones; ``held``: the device values
    the verdict's run already exposed."""
    verdicts, wrong = {}, {}
    eps = emulator.emulation.epsilon
    for t, e, r in value_pairs(emulator, keep, feed, order, held):
        verdicts[t] = judge(e, r, policy, eps, emulator.saturation)
        if not verdicts[t]["passed"]:
            wrong[t] = (e, r)
    return verdicts, wrong


class Injection:
    """The fp32 reference graph with one value cut out and fed: does that value, as the device holds it,
    reach the failing outputs?"""

    def __init__(self, emulator: Emulator, feed: dict[str, np.ndarray], failing: list[str]):
        self.emulator, self.feed = emulator, feed
        self.outputs = [o.name for o in emulator.model.graph.output]
        self.failing = [k for k, name in enumerate(self.outputs) if name in failing] or list(range(len(self.outputs)))
        self.expected = emulator.session(reference=True).run(feed)

    def reaches(self, tensor: str, device_value: np.ndarray) -> bool:
        from onnx import helper

        model, weights = self.emulator.build(reference=True)
        for node in model.graph.node:
            for k, name in enumerate(node.output):
                if name == tensor:
                    node.output[k] = f"{tensor}__cut"
        model.graph.input.append(helper.make_tensor_value_info(tensor, 1, list(device_value.shape)))
        got = Session(model, weights).run({**self.feed, tensor: device_value.astype(np.float32)})
        return any(self._visible(np.asarray(got[k]), np.asarray(self.expected[k])) for k in self.failing)

    def _visible(self, got: np.ndarray, want: np.ndarray) -> bool:
        """More than one fp16 rounding step at the output's peak away from the reference, anywhere."""
        if got.shape != want.shape or not np.issubdtype(want.dtype, np.floating):
            return bool(got.shape != want.shape or np.any(got != want))
        a, b = got.astype(np.float64), want.astype(np.float64)
        finite = np.isfinite(b)
        if np.any(~np.isfinite(a) & finite):
            return True
        peak = float(np.abs(b[finite]).max()) if finite.any() else 0.0
        floor = max(1e-6, self.emulator.emulation.epsilon * peak)
        return bool(finite.any() and np.abs(a[finite] - b[finite]).max() > floor)


def localise(emulator: Emulator, keep: set[str], feed: dict[str, np.ndarray], policy: DevicePolicy,
             paths: dict[str, str], failing: list[str],
             held: dict[str, np.ndarray] | None = None) -> dict[str, Any] | None:
    """Where the divergence that reaches a failing output starts (None when no value diverges)."""
    graph = emulator.model.graph
    producer = {out: node for node in graph.node for out in node.output if out}
    order = float_values(emulator)
    verdicts, wrong = _judge_all(emulator, keep, feed, policy, order, held)
    if not wrong:
        return None
    designed = _by_design(graph, producer, emulator.fed)
    benign: set[str] = set()
    injection, trials, first_candidate, origin = None, 0, None, None
    for t in (t for t in order if t in wrong):
        bad_inputs = [i for i in producer[t].input if i in wrong]
        if any(i not in benign for i in bad_inputs):
            continue  # wrong because what it reads is wrong
        if bad_inputs and producer[t].op_type in PASS_THROUGH:
            benign.add(t)  # a benign value, moved
            continue
        first_candidate = first_candidate or t
        if not (bad_inputs or designed(t)):
            origin = t  # the data drove it wrong: not a value wrong by design
            break
        if trials == TRIALS:  # out of trials: the first candidate not shown benign
            origin = t
            break
        injection = injection or Injection(emulator, feed, failing)
        trials += 1
        if injection.reaches(t, wrong[t][0]):
            origin = t
            break
        benign.add(t)
    origin = origin or first_candidate or next(t for t in order if t in wrong)
    return describe(producer[origin], origin, verdicts[origin], keep, paths, sorted(benign, key=order.index))


def _by_design(graph: Any, producer: dict[str, Any], fed: dict[str, np.ndarray]):
    """``designed(tensor)``: whether the node making ``tensor`` reads a constant past the fp16 range, or is a
    clamp / select, or the value reaches one through data movement only (``fed``: the weights the graph holds by
    name only)."""
    from onnx import numpy_helper

    huge = set()
    constants = [(i.name, i) for i in graph.initializer]
    constants += [(n.output[0], a.t) for n in graph.node if n.op_type == "Constant" for a in n.attribute
                  if a.name == "value"]
    for name, tensor in constants:
        if tensor.data_type == 1 and int(np.prod(tensor.dims)) <= 1 << 16:
            value = fed[name] if name in fed else numpy_helper.to_array(tensor)
            if value.size and float(np.abs(value).max()) > FP16_MAX:
                huge.add(name)
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def feeds_bound(tensor: str, depth: int = 0) -> bool:
        nodes = consumers.get(tensor, [])
        return depth < 8 and bool(nodes) and all(
            n.op_type in BOUNDING or n.op_type in PASS_THROUGH and any(feeds_bound(o, depth + 1) for o in n.output)
            for n in nodes)

    def designed(tensor: str) -> bool:
        node = producer[tensor]
        return node.op_type in BOUNDING or any(i in huge for i in node.input) or feeds_bound(tensor)

    return designed


def describe(node: Any, tensor: str, verdict: dict[str, Any], keep: set[str], paths: dict[str, str],
             healed: list[str]) -> dict[str, Any]:
    where = module_paths.describe(node, paths)
    source = next((p.value for p in node.metadata_props if p.key == module_paths.SOURCE), None)
    return {"node": node.name, "op_type": node.op_type, "tensor": tensor, "module": paths.get(node.name),
            "source": source, "cosine": verdict["cosine"], "max_abs": verdict["max_abs"],
            "overflow": verdict["non_finite"] or verdict["saturated"], "kept": node.name in keep,
            "reason": verdict.get("reason"),
            "skipped_healed": healed[:8],
            "message": f"first divergence: {where} cosine {verdict['cosine']:.2f}"
                       + (" (fp16 overflow)" if verdict["non_finite"] or verdict["saturated"] else "")}
