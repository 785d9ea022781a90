"""The device-precision verdict for one output: emulated device values against the fp32 reference.

Calibrated against real fp16 in torch (tests/verdict/test_precision_calibration.py): a model whose real fp16
outputs have cosine >= 0.999 and are finite passes; one with inf/nan where fp32 is finite, or cosine
< 0.99, fails. The rule follows msit compare (an output is wrong when cosine < 0.99 and max abs error
> 1e-3, or cosine < 0.9) with the absolute threshold raised to the output's fp16 noise floor:
- fails when the emulation is inf/nan where the reference is finite (overflow);
- fails when cosine < ``fail_cosine`` (0.9), whatever the error's size;
- fails when cosine < ``min_cosine`` (0.99) and max abs error > the noise floor, max(``atol`` (1e-3),
  eps x max |reference|): one rounding step (eps = 2**-10 for fp16, 2**-7 for bf16) at the output's
  largest magnitude. Below it, a low cosine comes from an output too small or too flat for fp16 to
  resolve, which is rounding, not breakage.
- fails when the error's RMS exceeds ``max_rel_rms`` (0.1) of the reference's RMS and max abs error > the noise
  floor: a result off by a factor (a saturated constant: (x + 65504) * 1e-6 where fp32 has x + 1e6) keeps its
  cosine at 1.0;
- under a saturating SoC (``saturation``: the bound, 65504 for fp16), fails when an element sits at the bound
  where the reference lies past it (the overflow that Inf/NaN mode shows as inf).
It never compares the error with the output's range (max - min): real fp16 fails such a rule on healthy
models whose outputs vary little (DETR's box regressor).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class DevicePolicy:
    min_cosine: float = 0.99
    fail_cosine: float = 0.9
    atol: float = 1e-3
    max_rel_rms: float = 0.1

    def to_dict(self) -> dict[str, float]:
        return {"min_cosine": self.min_cosine, "fail_cosine": self.fail_cosine, "atol": self.atol,
                "max_rel_rms": self.max_rel_rms}


def judge(actual: np.ndarray, expected: np.ndarray, policy: DevicePolicy, epsilon: float,
          saturation: float | None = None) -> dict[str, Any]:
    """Metrics and verdict of one output on one input set (JSON-safe: every number is finite)."""
    if actual.shape != expected.shape:
        return {"max_abs": 0.0, "max_rel": 0.0, "rel_rms": 0.0, "cosine": 0.0, "noise_floor": 0.0,
                "non_finite": False, "saturated": False, "passed": False,
                "reason": f"shape {list(actual.shape)} != reference {list(expected.shape)}"}
    if not np.issubdtype(expected.dtype, np.floating):
        agree = float(np.mean(actual == expected)) if expected.size else 1.0
        result = {"max_abs": 0.0, "max_rel": 0.0, "rel_rms": 0.0, "cosine": 1.0 if agree == 1.0 else 0.0,
                  "noise_floor": 0.0, "non_finite": False, "saturated": False, "passed": agree == 1.0,
                  "agreement": agree}
        if agree < 1.0:
            result["reason"] = f"integer output differs in {1 - agree:.1%} of its elements"
        return result
    a = actual.astype(np.float64).ravel()
    b = expected.astype(np.float64).ravel()
    finite_ref = np.isfinite(b)
    non_finite = bool(np.any(~np.isfinite(a) & finite_ref))
    both = finite_ref & np.isfinite(a)
    err = np.abs(a[both] - b[both])
    ref = b[finite_ref]
    peak = float(np.abs(ref).max()) if ref.size else 0.0
    max_abs = float(err.max()) if err.size else 0.0
    ref_rms = float(np.sqrt(np.mean(ref ** 2))) if ref.size else 0.0
    err_rms = float(np.sqrt(np.mean(err ** 2))) if err.size else 0.0
    cos = 0.0 if non_finite else cosine(a[finite_ref], ref)
    floor = max(policy.atol, epsilon * peak)
    result = {"max_abs": max_abs, "max_rel": max_abs / peak if peak > 0 else 0.0,
              "rel_rms": err_rms / ref_rms if ref_rms > 0 else 0.0, "cosine": cos, "noise_floor": floor,
              "non_finite": non_finite}
    saturated = saturation is not None and bool(np.any((np.abs(a[both]) == saturation)  # a kept fp32 value may be past
                                                         & (np.abs(b[both]) > saturation * (1 + 2 * epsilon))))
    result["saturated"] = saturated
    if non_finite:
        reason = "overflow: inf/nan where the fp32 reference is finite"
    elif saturated:
        reason = f"overflow: saturated at +-{saturation:.6g} where the fp32 reference lies past it"
    elif cos < policy.fail_cosine:
        reason = f"cosine {cos:.4f} < {policy.fail_cosine}"
    elif cos < policy.min_cosine and max_abs > floor:
        reason = f"cosine {cos:.4f} < {policy.min_cosine} and max abs error {max_abs:.3g} > noise floor {floor:.3g}"
    elif result["rel_rms"] > policy.max_rel_rms and max_abs > floor:
        reason = (f"error RMS {result['rel_rms']:.3g} of the reference's > {policy.max_rel_rms} (off by a factor) "
                  f"and max abs error {max_abs:.3g} > noise floor {floor:.3g}")
    else:
        reason = None
    result["passed"] = reason is None
    if reason:
        result["reason"] = reason
    return result


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two flat float64 vectors (1.0 for two zero vectors; sums, not BLAS, so a
    loaded machine's BLAS threads never stall it)."""
    if a.size == 0:
        return 1.0
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return 0.0
    na, nb = float(np.sqrt(np.sum(a * a))), float(np.sqrt(np.sum(b * b)))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.clip(np.sum(a * b) / (na * nb), -1.0, 1.0))


def is_classifier(name: str, shape: tuple[int, ...]) -> bool:
    """Outputs read as class scores: ``[batch, classes]``, or any output named ``*logits*``."""
    return len(shape) >= 2 and shape[-1] >= 2 and (len(shape) == 2 or "logit" in name.lower())


def topk_agreement(actual: np.ndarray, expected: np.ndarray) -> dict[str, float]:
    """Over the last axis: the share of rows whose top-1 class is the reference's, and whose top-5
    holds the reference's top-1 (the reference acting as the labels)."""
    classes = expected.shape[-1]
    a = np.nan_to_num(actual.reshape(-1, classes).astype(np.float64), copy=False, nan=-np.inf)
    b = expected.reshape(-1, classes)
    ref_top = np.argmax(b, axis=1)
    top1 = float(np.mean(np.argmax(a, axis=1) == ref_top))
    # the reference's top-1 class ranks among a's top k when fewer than k classes come before it in a's order
    # (higher score, or the same score at a lower index: a stable sort's order), counted without sorting the rows
    score = a[np.arange(len(a)), ref_top][:, None]
    ahead = np.count_nonzero(a > score, axis=1)
    ahead += np.count_nonzero((a == score) & (np.arange(classes) < ref_top[:, None]), axis=1)
    top5 = float(np.mean(ahead < min(5, classes)))
    return {"top1_agreement": top1, "top5_agreement": top5}


def merge(per_set: list[dict[str, Any]]) -> dict[str, Any]:
    """Worst case over the input sets."""
    merged: dict[str, Any] = {
        "max_abs": max(r["max_abs"] for r in per_set), "max_rel": max(r["max_rel"] for r in per_set),
        "rel_rms": max(r["rel_rms"] for r in per_set), "cosine": min(r["cosine"] for r in per_set),
        "noise_floor": min(r["noise_floor"] for r in per_set),
        "non_finite": any(r["non_finite"] for r in per_set), "saturated": any(r.get("saturated") for r in per_set),
        "passed": all(r["passed"] for r in per_set)}
    for key in ("top1_agreement", "top5_agreement", "agreement"):
        if key in per_set[0]:
            merged[key] = min(r[key] for r in per_set)
    reasons = [r["reason"] for r in per_set if r.get("reason")]
    if reasons:
        merged["reason"] = reasons[0]
    return merged


def compare_output(name: str, actual: list[np.ndarray], expected: list[np.ndarray], policy: DevicePolicy,
                   epsilon: float, saturation: float | None = None) -> dict[str, Any]:
    """One output over every input set: metrics, verdict and (for class scores) top-1/top-5 agreement."""
    per_set = []
    for a, b in zip(actual, expected, strict=False):
        a = np.asarray(a)
        r = judge(a, b, policy, epsilon, saturation)
        if a.shape == b.shape and np.issubdtype(b.dtype, np.floating) and is_classifier(name, b.shape):
            r.update(topk_agreement(a, b))
        per_set.append(r)
    return {"name": name, "shape": list(expected[0].shape), **merge(per_set)}


INT8_FLOAT_RATIO = 1.5  # the device's int8 result may be at most this much further from the float model


def within_int8_noise(entry: dict[str, Any], actual: list[np.ndarray], fake_quant: list[np.ndarray],
                      float_: list[np.ndarray], policy: DevicePolicy) -> dict[str, Any]:
    """The int8 yardstick of one device output that failed the fp16 rule against the fake-quant model: the
    fake-quant model is one draw of int8 rounding around the float model, the device (fp16 between its
    quantized ops: rounding flips at AscendQuant) another. Measured on the QAT corpus (three fresh inputs), the
    device's distance from the float model is the fake-quant model's: 0.99-1.42 per input, 1.12 pooled on
    torchvision's MobileNetV3 and 1.03 on transformers' MobileNetV2, whose coarse fp16 activations flip 8-bit
    steps 8-17 % of the reference's RMS away from the fake-quant model; a device that loses precision adds its
    error on top. Passes when the device output is finite, not saturated, its cosine to
    the fake-quant model at least ``fail_cosine``, and its error against the float model (RMS pooled over the
    sets) at most ``INT8_FLOAT_RATIO`` x the fake-quant model's; ``entry`` is updated with the measures."""
    pairs = [(np.asarray(a, np.float64).ravel(), np.asarray(q, np.float64).ravel(), np.asarray(f, np.float64).ravel())
             for a, q, f in zip(actual, fake_quant, float_, strict=False)]
    if not pairs or any(a.shape != f.shape or q.shape != f.shape for a, q, f in pairs) \
            or not all(np.isfinite(a).all() and np.isfinite(q).all() and np.isfinite(f).all() for a, q, f in pairs):
        return entry
    device_err = float(np.sqrt(sum(np.sum((a - f) ** 2) for a, _, f in pairs)))
    quant_err = float(np.sqrt(sum(np.sum((q - f) ** 2) for _, q, f in pairs)))
    if quant_err == 0:  # the fake-quant model is the float model here: no int8 noise to measure against
        return entry
    ratio = device_err / quant_err
    entry["int8_vs_float"] = {"device_error_rms_ratio": ratio, "allowed_ratio": INT8_FLOAT_RATIO}
    if entry["passed"] or entry.get("non_finite") or entry.get("saturated") or entry["cosine"] < policy.fail_cosine:
        return entry
    if ratio <= INT8_FLOAT_RATIO:
        entry.update(passed=True, within="int8 rounding noise (against the float model)",
                     fp16_rule=entry.pop("reason", None))
    else:
        entry["reason"] = (f"{entry.get('reason')}; and {ratio:.3g}x further from the float model than the "
                           f"fake-quant model is (allowed {INT8_FLOAT_RATIO:g}x)")
    return entry
