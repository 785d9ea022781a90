"""The device verdict's top-1 / top-5 agreement counts ranks instead of sorting every row (device parity's cost,
issue 45): it agrees with a stable argsort of the rows, ties and NaN included, and weights round as torch's half()
does (the emulation's rounding moved from torch to numpy's one-thread conversion)."""
import numpy as np
import torch

from cann_export.validators.device_verdict import topk_agreement
from cann_export.validators.precision import FP16, round_array


def sorted_agreement(actual, expected):
    """The oracle: the top-5 by a stable sort of each row (NaN last), as the verdict computed it before."""
    classes = expected.shape[-1]
    a = np.nan_to_num(actual.reshape(-1, classes).astype(np.float64), nan=-np.inf)
    ref_top = np.argmax(expected.reshape(-1, classes), axis=1)
    top5 = np.argsort(-a, axis=1, kind="stable")[:, :min(5, classes)]
    return {"top1_agreement": float(np.mean(np.argmax(a, axis=1) == ref_top)),
            "top5_agreement": float(np.mean(np.any(top5 == ref_top[:, None], axis=1)))}


def test_topk_agreement_matches_a_stable_sort_with_ties_and_nan():
    rng = np.random.default_rng(0)
    for classes in (3, 5, 7, 50):
        expected = rng.normal(size=(64, classes)).astype(np.float32)
        actual = rng.integers(-3, 4, size=(64, classes)).astype(np.float32)  # many ties
        actual[rng.random(actual.shape) < 0.05] = np.nan
        actual[:8] = expected[:8]  # rows that agree
        assert topk_agreement(actual, expected) == sorted_agreement(actual, expected)


def test_weights_round_as_torch_half_does():
    rng = np.random.default_rng(1)
    values = np.concatenate([rng.normal(size=10_000).astype(np.float32) * 10.0 ** rng.integers(-9, 6, 10_000),
                             np.array([65504, 65520, 7e4, -7e4, 6e-8, 3e-8, 0.0, -0.0], np.float32)])
    expected = torch.from_numpy(values).half().float().numpy()
    assert np.array_equal(round_array(values, FP16), expected, equal_nan=True)
