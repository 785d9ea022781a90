"""The reference's own float noise: the model run in float64 on the verdict sets, so parity can tell the
graph's rounding (a few times the fp32 reference's own distance from float64) from a different computation
(hundreds of times it, down to a 0.1% change of one weight; see parity_metrics.py)."""
from __future__ import annotations

from typing import Any

MAX_WEIGHT_BYTES = 1 << 30  # a float64 copy of weights up to 1 GiB; larger models get no estimate
# module passes that leave an eval-mode module's numbers as they were (fold-conv-bn too, on a module without
# BatchNorm): after them the float64 run of the stripped module measures what it measured before strip
NEUTRAL_PASSES = {"unwrap-checkpoint", "dropout", "fold-conv-bn", "identity", "lower-fake-quant",
                  "lower-torch-ao-fake-quant"}


def measure(ctx: Any) -> None:
    """``ctx.reference_noise`` on the verdict sets of ``ctx.input_sets`` (now, whether or not it was deferred). A
    multi-graph component's sets at its other shapes (``shape_sets``) get none: they are judged at the rule's
    ``peak_share`` floor, at least the least floor, so the float64 twin runs on the example's small sets only (on
    GPT-2 small it ran every range point, a second reference in float64)."""
    labels = ctx.input_set_labels
    example = labels[0].get("shape") if labels and ctx.loaded.extras.get("shape_sets") else None
    verdict = [s for s, label in enumerate(labels) if label["role"] == "verdict"
               and (example is None or label.get("shape") == example)]
    unfolded = ctx.unfolded_modules.restored() if ctx.unfolded_modules is not None else {}
    ctx.reference_noise = fp64_noise(ctx.model, ctx.loaded.kind, ctx.input_sets, ctx.reference_outputs, verdict,
                                     unfolded)
    ctx.reference_noise_deferred, ctx.unfolded_modules = False, None


def measured(ctx: Any) -> list[list[float] | None]:
    """The reference noise, measured first if it was deferred (a bundle that stores it asks here)."""
    if ctx.reference_noise_deferred:
        measure(ctx)
    return ctx.reference_noise


def defer(ctx: Any) -> bool:
    """Leave the float64 runs for later (``ctx.reference_noise_deferred``) when nothing before validate changes
    the module's numbers beyond what can be put back: a float eval module, no quantization, only the neutral
    module passes; the Conv+BatchNorm pairs strip folds keep their originals on disk (inputs/unfolded.py, so
    only with an output path to stage them beside). The noise only ever raises the verdict rule's floor above
    rtol x NOISE_MIN_SHARE x max |ref| (parity_metrics.py), so a graph that passes at that least floor passes
    whatever it measures (``least_floor``), and parity measures it only when a verdict set fails there
    (validators/parity.py)."""
    import torch

    from ..hooks.contracts import Pass, optional
    from ..hooks.manager import registry
    from ..parity_metrics import NOISE_MIN_SHARE

    model, tol = ctx.model, ctx.options.tolerance
    if ctx.options.quantize or ctx.loaded.kind != "module" or not isinstance(model, torch.nn.Module) \
            or not getattr(tol, "peak_share", 0.0) >= NOISE_MIN_SHARE:
        return False
    passes = {p.name for p in registry().passes() if optional(p, Pass, "apply_module") is not None}
    if not passes <= NEUTRAL_PASSES:
        return False
    from torch.ao.quantization import FakeQuantizeBase
    from torch.nn.modules.batchnorm import _BatchNorm

    from ..qat.fake_quant import QuantLayer
    from ..qat.wrapping import prepared_state

    if prepared_state(model) or any(isinstance(m, (FakeQuantizeBase, QuantLayer)) for m in model.modules()):
        return False
    if ctx.output_path is None and any(isinstance(m, _BatchNorm) for m in model.modules()):
        return False
    ctx.reference_noise, ctx.reference_noise_deferred = [], True
    return True


def stored(ctx: Any) -> list[list[float] | None]:
    """The noise a bundle stores for its parity data: the one parity's fp32 verdict used, so ``validate`` judges
    the stored sets by the export's rule. Left deferred through the verdict (every verdict set passed at the least
    floor): that floor (``ctx.verdict_noise``), not a float64 run only to store it (GPT-2 small's prefill: 2.3 s at
    commit); else measured (now, when still deferred: stored before validate ran)."""
    if ctx.reference_noise_deferred and ctx.verdict_noise is not None \
            and len(ctx.verdict_noise) == len(ctx.input_sets):
        return ctx.verdict_noise
    return measured(ctx)


def least_floor(ctx: Any) -> list[list[float] | None]:
    """A stand-in for the deferred noise: 0.0 on every verdict set (the verdict rule's least floor)."""
    outputs = len(ctx.output_names)
    return [[0.0] * outputs if label["role"] == "verdict" else None for label in ctx.input_set_labels]


def fp64_noise(model: Any, kind: str, input_sets: list[dict[str, Any]], reference: list[list[Any]],
               indices: list[int], unfolded: dict[str, Any] | None = None) -> list[list[float] | None]:
    """Per input set, per output: max |fp32 reference - float64 run| over elements finite in both (0.0 for
    non-float outputs); None for the sets not in ``indices``, and for every set when the model cannot run
    in float64 (not an fp32 nn.Module on the CPU, too large, an op without float64 kernels). ``unfolded``: modules
    (by path) the float64 twin takes in place of the model's (the originals of strip's Conv+BN fold)."""
    import copy

    import numpy as np
    import torch

    from ..heap_release import give_back

    none: list[list[float] | None] = [None] * len(input_sets)
    params = list(model.parameters()) if kind == "module" and isinstance(model, torch.nn.Module) else []
    if not params or any(p.dtype != torch.float32 or p.device.type != "cpu" for p in params) \
            or 2 * sum(p.numel() * 4 for p in params) > MAX_WEIGHT_BYTES:
        return none
    from .tensors import flatten_outputs

    from .unfolded import in_place_of, put_back

    swapped, left, missing = in_place_of(model, unfolded or {})
    out = list(none)
    try:
        # the parameters go straight to float64 (deepcopy's memo): no float32 copy of the weights first (GPT-2
        # small: 1.47 -> 0.83 s CPU per graph); a tied weight stays one tensor
        memo: dict[int, Any] = {id(p): torch.nn.Parameter(p.detach().double(), requires_grad=p.requires_grad)
                                for p in params if id(p) not in left}
        wide = copy.deepcopy(model, {**memo, **swapped})
        put_back(wide, missing)
        wide = wide.double().eval()
        with torch.no_grad():
            for s in indices:
                feed = {n: t.double() if t.dtype.is_floating_point else t for n, t in input_sets[s].items()}
                _, tensors = flatten_outputs(wide(**feed))
                if len(tensors) != len(reference[s]):
                    return none
                out[s] = [_distance(t, r, np) for t, r in zip(tensors, reference[s], strict=True)]
                del feed, tensors
                give_back()  # one float64 forward's freed activations before the next
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
