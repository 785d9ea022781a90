"""The reference's own float noise: the model run in float64 on the verdict sets, so parity can tell the
graph's rounding (a few times the fp32 reference's own distance from float64) from a different computation
(hundreds of times it, down to a 0.1% change of one weight; see validators/metrics.py)."""
from __future__ import annotations

from typing import Any

MAX_WEIGHT_BYTES = 1 << 30  # a float64 copy of weights up to 1 GiB; larger models get no estimate


def fp64_noise(model: Any, kind: str, input_sets: list[dict[str, Any]], reference: list[list[Any]],
               indices: list[int]) -> list[list[float] | None]:
    """Per input set, per output: max |fp32 reference - float64 run| over elements finite in both (0.0 for
    non-float outputs); None for the sets not in ``indices``, and for every set when the model cannot run
    in float64 (not an fp32 nn.Module on the CPU, too large, an op without float64 kernels)."""
    import copy

    import numpy as np
    import torch

    none: list[list[float] | None] = [None] * len(input_sets)
    params = list(model.parameters()) if kind == "module" and isinstance(model, torch.nn.Module) else []
    if not params or any(p.dtype != torch.float32 or p.device.type != "cpu" for p in params) \
            or 2 * sum(p.numel() * 4 for p in params) > MAX_WEIGHT_BYTES:
        return none
    from .tensors import flatten_outputs

    out = list(none)
    try:
        wide = copy.deepcopy(model).double().eval()
        with torch.no_grad():
            for s in indices:
                feed = {n: t.double() if t.dtype.is_floating_point else t for n, t in input_sets[s].items()}
                _, tensors = flatten_outputs(wide(**feed))
                if len(tensors) != len(reference[s]):
                    return none
                out[s] = [_distance(t, r, np) for t, r in zip(tensors, reference[s], strict=True)]
    except Exception:  # float64 is an estimate, never a requirement: any failure means no estimate
        return none
    return out


def _distance(wide: Any, ref: Any, np: Any) -> float:
    r = np.asarray(ref)
    if not np.issubdtype(r.dtype, np.floating):
        return 0.0
    w = wide.detach().cpu().numpy().astype(np.float64)
    if w.shape != r.shape:
        return 0.0
    both = np.isfinite(w) & np.isfinite(r)
    return float(np.abs(w[both] - r[both].astype(np.float64)).max()) if both.any() else 0.0
