"""The largest intermediate tensor of a forward at a shape, estimated from eager runs: what parity's shape budget
counts besides a set's inputs and outputs (inputs/parity_budget.py). A Whisper encoder's attention scores at its real
window are batch x heads x 1500 x 1500 (1.8 GB at batch 49 with 4 heads) while its inputs and outputs are 1/20 of
that; a budget on inputs and outputs alone lets such a set through.

One no-grad forward at the example and one at another size per dynamic dimension record the elements of every
op's outputs, in order (a ``TorchDispatchMode``). Each op's exponent per dimension is read from its sizes in the
two runs (an attention score grows with the square of the sequence, a projection linearly, a weight not at all);
the estimate at a point is the largest op there, its example size scaled by ``(size / example size) ** exponent``
per dimension. An op only the example's run has (control flow on a size) grows as the runs' largest ops do.
The estimate is a few terms (the largest example size per set of exponents), small enough to record in the
manifest so validate counts the same."""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

MAX_EXPONENT = 3  # a size past the cube of a dimension is not an activation this estimate expects
MAX_TERMS = 16  # the recorded terms: the largest example sizes, one per set of exponents
Point = dict[str, int]
Terms = list[dict[str, Any]]  # [{"elements": example size, "exponents": {dim: k}}]


@contextlib.contextmanager
def op_sizes() -> Iterator[list[tuple[str, int]]]:
    """Each op's name and the elements of its tensor outputs, in order, while the block runs."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    sizes: list[tuple[str, int]] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            flat = out if isinstance(out, (list, tuple)) else (out,)
            sizes.append((str(func), sum(t.numel() for t in flat if isinstance(t, torch.Tensor)) + _scores(func, args)))
            return out

    with Record():
        yield sizes


def _scores(func: Any, args: Any) -> int:
    """A fused attention's scores (query rows x key rows per head): eager's flash kernel never holds them, the
    exported graph's MatMul + Softmax does."""
    import torch

    if "scaled_dot_product" not in str(func) or len(args) < 2:
        return 0
    query, key = args[0], args[1]
    if not isinstance(query, torch.Tensor) or not isinstance(key, torch.Tensor) or query.dim() < 2 or key.dim() < 2:
        return 0
    return math.prod(query.shape[:-1]) * int(key.shape[-2])


def terms_of(example: Point, base: list[tuple[str, int]], probes: dict[str, tuple[int, list[tuple[str, int]]]]
             ) -> Terms:
    """The estimate's terms from the example's ops ``base`` and, per dimension, (its probe size, the ops there).
    An op is matched across runs by its name and how many of that name came before it; one a probe run lacks
    grows by the exponents of the runs' largest ops, rounded up."""
    if not base:
        return []
    keyed = {d: (size, _keyed(ops)) for d, (size, ops) in probes.items()}
    top = max(n for _, n in base)
    coarse = {d: _exponent(example[d], size, top, max(ops.values(), default=0), math.ceil)
              for d, (size, ops) in keyed.items()}
    found: dict[tuple[tuple[str, int], ...], int] = {}
    for op, n in _keyed(base).items():
        key = tuple((d, _exponent(example[d], size, n, ops[op], round) if op in ops else coarse[d])
                    for d, (size, ops) in keyed.items())
        found[key] = max(found.get(key, 0), n)
    kept = sorted(found.items(), key=lambda kv: -kv[1])[:MAX_TERMS]
    return [{"elements": n, "exponents": {d: k for d, k in key if k}} for key, n in kept]


def _keyed(ops: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    seen: dict[str, int] = {}
    out = {}
    for name, n in ops:
        seen[name] = seen.get(name, 0) + 1
        out[(name, seen[name])] = n
    return out


def _exponent(size: int, probe: int, at_size: int, at_probe: int, rounding: Any) -> int:
    if size == probe or at_size <= 0 or at_probe <= 0:
        return 0
    k = math.log(at_probe / at_size) / math.log(probe / size)
    return int(min(MAX_EXPONENT, max(0, rounding(k - 1e-9 if rounding is math.ceil else k))))


def largest(terms: Terms, example: Point, point: Point) -> int:
    """The estimated elements of the largest intermediate at ``point``."""
    best = 0
    for term in terms:
        n = float(term["elements"])
        for d, k in term["exponents"].items():
            n *= (max(1, point.get(d, example.get(d, 1))) / max(1, example.get(d, 1))) ** k
        best = max(best, int(math.ceil(n)))
    return best


def recorded_terms(found: Any) -> Terms | None:
    """The terms of a manifest's record (``parity.shape_budget.activations.terms``) when they read as this module
    writes them, else None (validate names the record as edited)."""
    if not isinstance(found, list) or len(found) > MAX_TERMS:
        return None
    out = []
    for term in found:
        if not isinstance(term, dict) or set(term) != {"elements", "exponents"}:
            return None
        n, exps = term["elements"], term["exponents"]
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n < 1 << 62 or not isinstance(exps, dict):
            return None
        if any(not isinstance(k, int) or isinstance(k, bool) or not 0 < k <= MAX_EXPONENT for k in exps.values()):
            return None
        out.append({"elements": n, "exponents": dict(exps)})
    return out
