"""The int8 parity policy's two noise rules, on numbers built to sit either side of them: a Q/DQ graph within
twice the fake-quant model's own rounding noise (metrics.compare_quantized), and a device int8 result no
further from the float model than 1.5x the fake-quant model is (device_verdict.within_int8_noise). The corpus
(tests/qat/test_corpus.py) runs both on real architectures; this file pins their edges and the bundle reader."""
import json
import math

import numpy as np
import pytest

from cann_export.inputs.quant_noise import pooled, well_formed
from cann_export.validators.device_verdict import DevicePolicy, within_int8_noise
from cann_export.parity_metrics import compare_quantized

RNG = np.random.default_rng(0)
REF = RNG.uniform(-1, 1, size=(4, 100)).astype(np.float32)
STEP = float(REF.max() - REF.min()) / 255


def _off_by(steps_rms):
    return (REF + RNG.normal(size=REF.shape) * steps_rms * STEP).astype(np.float32)


def test_the_step_rule_and_the_noise_rule():
    noise = {"rms_steps": 3.0, "max_steps": 9.0, "cosine": 1 - 1e-3}
    close = compare_quantized(_off_by(0.5), REF)
    assert close["passed"] and "reason" not in close
    far = compare_quantized(_off_by(4.0), REF)
    assert not far["passed"] and "steps RMS" in far["reason"] and "allowed: 1 RMS" in far["reason"]
    within = compare_quantized(_off_by(4.0), REF, noise=noise)
    assert within["passed"] and within["within"] == "reference noise"
    beyond = compare_quantized(_off_by(7.0), REF, noise=noise)
    assert not beyond["passed"] and "2x the reference's own noise" in beyond["reason"]
    # a reference that never moved under the perturbation gives no floor
    assert not compare_quantized(_off_by(4.0), REF, noise={"rms_steps": 0.0, "max_steps": 0.0, "cosine": 1.0})["passed"]
    nan = _off_by(0.0)
    nan[0, 0] = np.nan
    assert not compare_quantized(nan, REF, noise=noise)["passed"]


@pytest.mark.parametrize("extra, passes", [(0.0, True), (0.5, True), (2.0, False)])
def test_device_int8_is_measured_against_the_float_model(extra, passes):
    """The fake-quant model is the float model plus int8 noise q; the device another draw of it, plus
    ``extra`` x |q| of error of its own: passes while its error against the float model stays within 1.5x."""
    float_out = [RNG.normal(size=(2, 50)) for _ in range(3)]
    noise = [0.3 * np.abs(f).mean() for f in float_out]
    fake_quant = [f + RNG.normal(size=f.shape) * n for f, n in zip(float_out, noise, strict=True)]
    device = [f + RNG.normal(size=f.shape) * n * math.sqrt(1 + extra ** 2)
              for f, n in zip(float_out, noise, strict=True)]
    entry = {"name": "out", "passed": False, "cosine": 0.95, "non_finite": False, "saturated": False,
             "reason": "the fp16 rule"}
    out = within_int8_noise(dict(entry), device, fake_quant, float_out, DevicePolicy())
    assert out["passed"] is passes, out
    assert out["int8_vs_float"]["allowed_ratio"] == 1.5
    assert ("fp16_rule" in out) is passes and ("reason" in out) is not passes
    # overflow, saturation and a cosine under fail_cosine are never excused
    for bad in ({"non_finite": True}, {"saturated": True}, {"cosine": 0.5}):
        assert not within_int8_noise({**entry, **bad}, device, fake_quant, float_out, DevicePolicy())["passed"]
    json.dumps(out, allow_nan=False)


def test_stored_noise_is_checked_before_use():
    good = [[{"rms_steps": 1.0, "max_steps": 2.0, "cosine": 0.999}], None]
    assert well_formed(good, 2)
    for bad in ([[{"rms_steps": float("nan"), "max_steps": 2.0, "cosine": 0.9}], None],
                [[{"rms_steps": -1.0, "max_steps": 2.0, "cosine": 0.9}], None],
                [[{"rms_steps": 1.0, "max_steps": 2.0, "cosine": 2.0}], None],
                [[{"rms_steps": True, "max_steps": 2.0, "cosine": 0.9}], None],
                [[{"rms_steps": 1.0, "max_steps": 2.0, "cosine": 0.9, "x": 1}], None],
                [["1.0"], None], good[:1], "noise", None):
        assert not well_formed(bad, 2), bad
    rows = pooled([[{"rms_steps": 1.0, "max_steps": 5.0, "cosine": 0.99}], None,
                   [{"rms_steps": 2.0, "max_steps": 3.0, "cosine": 0.999}]])
    assert rows[1] is None and rows[0] == rows[2] == [{"rms_steps": 2.0, "max_steps": 5.0, "cosine": 0.99}]
