"""Per-output comparison metrics and the pass/fail rules of the fp32 parity policy.

Two rules. A verdict set (the example, draws from its distribution, --parity-data) passes an output when
every element has |a-b| <= atol (1e-4) + rtol (1e-3) x (|ref| + F) and cosine >= min_cosine (0.999). F, the
floor, follows the model's own float noise: noise_share (5e4) x the fp32 reference's distance from the
model run in float64 on that set (inputs/float_noise.py; so rtol x F = 50x it, and at least 2e-6 of
max |ref|); where float64 cannot run (not an fp32 module, > 1 GiB, an op without float64 kernels, an old
bundle) F = peak_share (1) x max |ref|. --rtol 0 leaves atol alone. A specialisation probe (wide /
heavy-tailed draws, the scaled and sign-flipped copies of a traced graph) passes when max abs error <= atol
+ probe_rtol (1e-2) x max |ref| and cosine >= probe_min_cosine (0.999).

Calibrated with ``python -m tests.helpers.fp32_calibration`` on 18 healthy architectures from small configs
with seeded random weights, exported with the plain command: torchvision deeplabv3_mobilenet_v3_large,
lraspp_mobilenet_v3_large (224 and 128 px), efficientnet_b0, resnet18, mobilenet_v3_small, regnet_y_400mf,
shufflenet_v2_x0_5; timm convnext_atto, vit_tiny, mobilevit_xxs, efficientnet_b0 (224 / 256 px, random
BatchNorm statistics and gamma in [0.5, 4.5) so activations grow with depth); transformers ViT (224 px),
Mistral, Qwen2, Llama, BERT, DeBERTa-v2, GPT-2 on padded token batches. Each on the example, 2 normal draws
and a uniform one (verdict sets: 80 outputs) and laplace, wide_normal, x-1 / x4 / x-4 / x0.25 (probes: 92):
- healthy, verdict sets: 0 refused (the elementwise rule alone refused 12: deeplabv3 and lraspp on every
  set, outputs of ~1e4 whose near-zero elements carry the output's float noise, max abs 0.03-0.45 at
  cosine 0.9999999998). Graph error / the reference's own fp32-vs-float64 distance <= 13.3 (lraspp 128 px,
  whose hard-sigmoid gates amplify rounding): 3.8x under 50. Max abs error / max |ref| reaches 9.4e-4
  there, so a floor of 1e-3 of the peak alone would hold by 1.06x only; 1 - cosine <= 1.2e-7;
- healthy, probes: 0 refused; max abs error / max |ref| <= 4.6e-4 (22x under probe_rtol), 1 - cos <= 2.4e-8;
- wrong graphs (tests/helpers/wrong_graphs.py, applied to each export: one middle Conv/MatMul weight x1.01
  or x1.001, the first activation dropped): of the 47 that change the output beyond float noise (the old
  elementwise rule refuses them) the rule refuses 45, every 1% weight change (error >= 2.5e3 x the
  reference noise, >= 1.8e-3 of max |ref|) and every dropped op; the 2 it passes are 0.1% weight changes
  (timm efficientnet_b0, regnet) whose errors stay within rtol x |ref| of every element. The peak floor
  alone refuses 37 of the 47. Scaling a weight that a LayerNorm / BatchNorm renormalises (ConvNeXt, MobileViT,
  BERT, DeBERTa) changes nothing beyond noise (error <= 11x the reference noise): not a wrong graph;
- a traced data-dependent branch (tests/verdict/test_parity_verdict.py Branchy) differs on the sign-flipped probes
  by a share of the output (> 1.0 max abs), far past probe_rtol.
Cost: float64 forwards on the verdict sets (3 by default): 0.5 s for the tiny decoders, 2 s for deeplabv3
at 224 px, 11 s for efficientnet_b0 at 224 px (float64 convolutions have no oneDNN kernels) on this
2-core machine.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np


NOISE_MIN_SHARE = 2e-3  # least floor with a measured noise: rtol (1e-3) x 2e-3 x max |ref| = 16 fp32 steps


def compare(actual: np.ndarray, expected: np.ndarray, tol: Any, noise: float | None = None) -> dict[str, Any]:
    """The verdict rule of a realistic input set: max abs error, max relative error (|a-b| / max(|ref|,
    atol)), cosine similarity, verdict. An element passes when |a-b| <= atol + rtol*(|ref| + peak_share*peak),
    peak = max |ref| of the output: float32 rounding noise grows with the magnitudes summed into an element,
    not with the element, so near-zero elements of a large output (bilinear-resized logits) carry noise
    of the output's scale. When the reference's own float noise was measured (``noise``: max |fp32 - float64|
    of the model on this set) the floor is rtol x noise_share x noise (at least rtol x NOISE_MIN_SHARE x max |ref|)
    instead: it follows the model's own sensitivity, loose for a net that amplifies rounding, tight for one that
    does not. ``--rtol 0`` leaves atol alone.

    Integer and boolean outputs must match exactly. Matching NaN/inf positions count as equal.
    """
    base = _base(actual, expected)
    if base is not None:
        return base
    st = _PairStats(actual, expected, max(tol.atol, 1e-12))
    if noise is not None and math.isfinite(noise):
        floor = max(getattr(tol, "noise_share", 0.0) * noise, NOISE_MIN_SHARE * st.peak)
    else:
        floor = getattr(tol, "peak_share", 0.0) * st.peak
    within = not st.bad_special and st.all_within(tol.atol, tol.rtol, floor)
    cos = st.cosine()
    passed = within and cos >= tol.min_cosine
    return {"max_abs": st.max_abs, "max_rel": st.max_rel, "cosine": cos, "passed": passed}


def compare_probe(actual: np.ndarray, expected: np.ndarray, tol: Any) -> dict[str, Any]:
    """The rule of a specialisation probe (scaled, sign-flipped, heavy-tailed inputs), relative to the
    probe's own output: cosine >= probe_min_cosine and max abs error <= atol + probe_rtol * peak (peak =
    max |ref|). A random-weight net driven off its inputs' distribution amplifies float noise with its
    output, so elementwise tolerances would refuse healthy graphs; a graph that took another path (a
    traced branch, a specialised constant) is off by a share of the output, which this still sees.
    ``max_rel`` here is max abs error / peak."""
    base = _base(actual, expected)
    if base is not None:
        return base
    st = _PairStats(actual, expected, max(tol.atol, 1e-12))
    peak, max_abs, cos = st.peak, st.max_abs, st.cosine()
    passed = (not st.bad_special and max_abs <= tol.atol + tol.probe_rtol * peak and cos >= tol.probe_min_cosine)
    return {"max_abs": max_abs, "max_rel": max_abs / peak if peak > 0 else 0.0, "cosine": cos, "passed": passed}


def _base(actual: np.ndarray, expected: np.ndarray) -> dict[str, Any] | None:
    """The verdict when shapes differ or the output is not float (integers and booleans match exactly)."""
    if actual.shape != expected.shape:
        return {"max_abs": float("inf"), "max_rel": float("inf"), "cosine": 0.0, "passed": False,
                "reason": f"shape {list(actual.shape)} != reference {list(expected.shape)}"}
    if not np.issubdtype(expected.dtype, np.floating):
        equal = bool(np.array_equal(actual, expected))
        diff = float(np.max(np.abs(actual.astype(np.float64) - expected.astype(np.float64)))) if actual.size else 0.0
        return {"max_abs": diff, "max_rel": diff, "cosine": 1.0 if equal else 0.0, "passed": equal}
    return None


CHUNK = 1 << 20  # elements per float64 chunk (8 MiB a side): a large output (logits) is never copied whole
BLOCK = 1 << 15  # elements per cache-sized block of a chunk's elementwise pass (the dot sums stay per CHUNK)


def _chunk_pair(flat_a: np.ndarray, flat_b: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
    """Float64 copies of one chunk's pairs to compare: matching NaN / inf excluded."""
    a = flat_a[start:start + CHUNK].astype(np.float64)
    b = flat_b[start:start + CHUNK].astype(np.float64)
    same_special = (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b))
    if same_special.any():
        a, b = a[~same_special], b[~same_special]
    return a, b


def _chunk_maxima(a: np.ndarray, b: np.ndarray, rel_floor: float) -> tuple[Any, Any, Any]:
    """max |b|, max |a-b|, max |a-b| / max(|b|, rel_floor) of float64 pairs (a NaN propagates)."""
    err, ref = np.abs(a - b), np.abs(b)
    return ref.max(), err.max(), (err / np.maximum(ref, rel_floor)).max()


def _finite_chunk(src_a: np.ndarray, src_b: np.ndarray, bufs: np.ndarray, scratch: np.ndarray,
                  rel_floor: float) -> Any:
    """``_chunk_maxima`` of a chunk cast to float64 into bufs[0] / bufs[1], block by block while the block is in
    cache; None when a value is NaN / inf (or |a-b| overflows): the caller then takes the general path. Finite
    pairs exclude nothing and a max is exact, so the numbers are ``_chunk_maxima``'s."""
    n = src_a.size
    maxima = np.empty((-(-n // BLOCK), 3))
    for k, i in enumerate(range(0, n, BLOCK)):
        j = min(i + BLOCK, n)
        a, b, err, ref = bufs[0, i:j], bufs[1, i:j], scratch[0, :j - i], scratch[1, :j - i]
        a[...], b[...] = src_a[i:j], src_b[i:j]  # the casts astype(np.float64) makes
        with np.errstate(invalid="ignore", over="ignore"):  # what it would warn of, the general path warns of again
            np.subtract(a, b, out=err)
        maxima[k, 1] = np.abs(err, out=err).max()
        if not math.isfinite(maxima[k, 1]):  # a NaN or inf on either side makes |a-b| NaN or inf
            return None
        maxima[k, 0] = np.abs(b, out=ref).max()
        maxima[k, 2] = np.divide(err, np.maximum(ref, rel_floor, out=ref), out=ref).max()
    return tuple(maxima.max(axis=0))


class _PairStats:
    """One output's comparison, accumulated chunk by chunk in float64 (the same numbers as whole-array float64
    copies, at a fraction of the memory): max |a-b|, max |a-b| / max(|ref|, ``rel_floor``), peak = max |ref|,
    the cosine's sums, and whether any compared pair is non-finite on one side only (``bad_special``). A chunk
    with no NaN / inf (the usual case) takes one cache-blocked pass (``_finite_chunk``); ``all_within`` decides
    from each chunk's max |a-b| and rereads only a chunk that it cannot clear so."""

    def __init__(self, actual: np.ndarray, expected: np.ndarray, rel_floor: float) -> None:
        self.actual, self.expected = actual, expected
        self.size, self.bad_special = 0, False
        self.peak = self.max_abs = self.max_rel = 0.0
        self.dot = self.norm_a = self.norm_b = 0.0
        self.chunk_err: list[tuple[int, Any]] = []  # (start, max |a-b|) of each chunk with pairs compared
        flat_a, flat_b = actual.reshape(-1), expected.reshape(-1)
        bufs, scratch = np.empty((2, min(flat_a.size, CHUNK))), np.empty((2, min(flat_a.size, BLOCK)))
        for start in range(0, flat_a.size, CHUNK):
            src_a, src_b = flat_a[start:start + CHUNK], flat_b[start:start + CHUNK]
            a, b, bad = bufs[0, :src_a.size], bufs[1, :src_a.size], False
            maxima = _finite_chunk(src_a, src_b, bufs, scratch, rel_floor)
            if maxima is None:
                a, b = _chunk_pair(flat_a, flat_b, start)
                if not a.size:
                    continue
                bad = bool((~np.isfinite(a) | ~np.isfinite(b)).any())
                maxima = _chunk_maxima(a, b, rel_floor)
            self._add(start, a, b, maxima, bad)

    def _add(self, start: int, a: np.ndarray, b: np.ndarray, maxima: tuple[Any, Any, Any], bad: bool) -> None:
        self.size += a.size
        self.bad_special = self.bad_special or bad
        # np.maximum: a NaN propagates as np.max over the whole array would
        self.peak = float(np.maximum(self.peak, maxima[0]))
        self.max_abs = float(np.maximum(self.max_abs, maxima[1]))
        self.max_rel = float(np.maximum(self.max_rel, maxima[2]))
        self.chunk_err.append((start, maxima[1]))
        if not self.bad_special:
            self.dot += float(np.dot(a, b))
            self.norm_a += float(np.dot(a, a))
            self.norm_b += float(np.dot(b, b))

    def all_within(self, atol: float, rtol: float, floor: float) -> bool:
        """Every compared pair has |a-b| <= atol + rtol * (|ref| + floor). The bound only grows with |ref| (each
        rounded step is monotone when rtol >= 0 and nothing overflows), so a chunk whose max |a-b| is within the
        bound at |ref| = 0 passes whole; any other chunk is read again and checked pair by pair."""
        x, r, f = float(atol), float(rtol), float(floor)
        monotone = r >= 0 and all(math.isfinite(v) for v in (x, r, f, self.peak + f))
        least = x + r * (0.0 + f)  # the bound of a pair with |ref| = 0, as numpy rounds it
        todo = [start for start, err in self.chunk_err if not (monotone and err <= least)]
        if not todo:
            return True
        flat_a, flat_b = self.actual.reshape(-1), self.expected.reshape(-1)
        for start in todo:
            a, b = _chunk_pair(flat_a, flat_b, start)
            if not np.all(np.abs(a - b) <= atol + rtol * (np.abs(b) + floor)):
                return False
        return True

    def cosine(self) -> float:
        """As ``cosine`` on the compared pairs: 0 when any is non-finite."""
        if self.size == 0:
            return 1.0
        if self.bad_special:
            return 0.0
        na, nb = math.sqrt(self.norm_a), math.sqrt(self.norm_b)
        if na == 0.0 and nb == 0.0:
            return 1.0
        if na == 0.0 or nb == 0.0:
            return 0.0
        return float(np.clip(self.dot / (na * nb), -1.0, 1.0))


def all_pass(actual: list[np.ndarray], expected: list[np.ndarray], tol: Any) -> bool:
    """Whether every output passes ``compare`` against its expected one (and the counts agree)."""
    return len(actual) == len(expected) and all(compare(a, e, tol)["passed"]
                                                for a, e in zip(actual, expected, strict=False))


def reference_problem(per_set: Any) -> dict[str, str] | None:
    """Why a float reference output (one array per input set, any iterable: read one at a time) cannot vouch for
    anything: non-finite in every element, or one constant value everywhere; None when it is usable."""
    # counted array by array (a concatenated float64 copy of every set's logits is GBs at a large vocabulary);
    # float32/16 -> float64 is exact, so min/max in the array's own dtype decide the same
    size = finite_count = 0
    low, high = np.inf, -np.inf
    floating = True
    for one in per_set:
        x = np.asarray(one)
        if not np.issubdtype(x.dtype, np.floating):
            floating = False
            break
        size += x.size
        count = int(np.count_nonzero(np.isfinite(x))) if x.size else 0
        finite_count += count
        if count and count == x.size:
            low, high = min(low, float(x.min())), max(high, float(x.max()))
        del x, one
    if not floating:
        return None
    if size == 0:
        return None
    if finite_count == 0:
        return {"reference": "non_finite",
                "reason": "the PyTorch reference is NaN/inf in every element of every input set, so agreement "
                          "means nothing; check the weights (e.g. all(torch.isfinite(p).all() for p in "
                          "model.state_dict().values())) and the inputs"}
    if size > 1 and finite_count == size and high == low:
        return {"reference": "constant",
                "reason": f"the PyTorch reference is the constant {low:.6g} in every element of every "
                          "input set, so it cannot show a wrong graph; the model ignores its inputs (zeroed or "
                          "saturated weights?): check the weights, or give real data with --parity-data"}
    return None


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    if a.size == 0:
        return 1.0
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return 0.0
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.clip(np.dot(a, b) / (na * nb), -1.0, 1.0))


def merge(per_set: list[dict[str, Any]]) -> dict[str, Any]:
    """Worst case over the input sets."""
    merged = {
        "max_abs": max(r["max_abs"] for r in per_set),
        "max_rel": max(r["max_rel"] for r in per_set),
        "cosine": min(r["cosine"] for r in per_set),
        "passed": all(r["passed"] for r in per_set),
        "failed_sets": sum(1 for r in per_set if not r["passed"]),
    }
    for key in ("max_steps", "rms_steps"):  # an int8 comparison's worst case in 8-bit steps
        if all(key in r for r in per_set):
            merged[key] = max(r[key] for r in per_set)
    reasons = [r["reason"] for r in per_set if r.get("reason")]
    if reasons:
        merged["reason"] = reasons[0]
    return merged


NOISE_FACTOR = 2.0  # a Q/DQ graph within twice the fake-quant model's own rounding noise computes what it does


def compare_quantized(actual: np.ndarray, expected: np.ndarray, tolerance: Any = None, bits: int = 8,
                      noise: dict[str, float] | None = None) -> dict[str, Any]:
    """A Q/DQ graph against the fake-quant model, in units of the output's 8-bit step (its range / 255; after
    qat.placement no graph output is itself quantized). Both compute the same rounding, so they differ only where
    float order flips a value at a rounding point by one step, which the layers after it carry on: a few steps at
    a few elements, a small RMS. An output passes when its RMS error is within ``int8_rms_steps`` steps, its
    largest error within ``int8_max_steps`` and the cosine at least ``int8_min_cosine`` (calibrated on the QAT
    corpus, tests/helpers/qat_corpus.py), or, with ``noise`` (the reference's distance from itself on inputs
    perturbed by 1e-6, inputs/quant_noise.py), when its RMS error and 1 - cosine are within ``NOISE_FACTOR``
    times the reference's own: a poorly conditioned int8 network moves that far from a one-step flip."""
    from .options import Tolerance

    tol = tolerance if tolerance is not None else Tolerance()
    if actual.shape != expected.shape:
        return {"max_abs": float("inf"), "max_rel": float("inf"), "cosine": 0.0, "passed": False,
                "reason": f"shape {list(actual.shape)} != reference {list(expected.shape)}"}
    a, b = actual.astype(np.float64).ravel(), expected.astype(np.float64).ravel()
    finite = bool(np.isfinite(a).all())
    step = float(b.max() - b.min()) / (2 ** bits - 1) if b.size else 0.0
    step = step if step > 0 else max(float(np.abs(b).max()) / (2 ** bits - 1), 1e-12) if b.size else 1e-12
    err = np.abs(a - b) if finite else np.full(a.shape, np.inf)
    max_abs = float(err.max()) if a.size else 0.0
    rms = float(np.sqrt(np.mean(err ** 2))) if a.size else 0.0
    cos = cosine(a, b)
    passed = finite and rms <= tol.int8_rms_steps * step and max_abs <= tol.int8_max_steps * step \
        and cos >= tol.int8_min_cosine
    out = {"max_abs": max_abs, "max_rel": max_abs / step, "cosine": cos, "passed": bool(passed), "quant_step": step,
           "max_steps": max_abs / step, "rms_steps": rms / step,
           "within_one_step": float(np.mean(err <= step)) if a.size else 1.0}
    if noise is not None:
        out["reference_noise_rms_steps"] = noise["rms_steps"]
        if not passed and finite and noise["rms_steps"] > 0 and rms / step <= NOISE_FACTOR * noise["rms_steps"] \
                and 1 - cos <= NOISE_FACTOR * (1 - noise["cosine"]):
            out.update(passed=True, within="reference noise")
    if not out["passed"]:
        out["reason"] = (f"{rms / step:.3g} steps RMS, {max_abs / step:.3g} at most, cosine {cos:.6f} from the "
                         f"reference (allowed: {tol.int8_rms_steps:g} RMS, {tol.int8_max_steps:g} at most, cosine "
                         f">= {tol.int8_min_cosine:g}" + (f"; or within {NOISE_FACTOR:g}x the reference's own "
                                                          f"noise, {noise['rms_steps']:.3g} steps RMS"
                                                          if noise is not None else "") + ")")
    return out
