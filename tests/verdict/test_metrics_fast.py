"""The chunked comparison (parity_metrics.py: a cache-blocked pass for finite chunks, ``all_within`` cleared
from each chunk's max |a-b|) gives exactly the numbers of a plain whole-array float64 comparison: max abs, max
rel, peak, the cosine's sums (per CHUNK, as the dot sums have always been taken), bad_special and every
all_within verdict, on NaN / inf on either side, -0.0, overflowing differences, empty and 0-d arrays, float16 /
float64 / integer inputs, and on chunks and blocks cut unevenly."""
import math
import warnings

import numpy as np
import pytest

from cann_export.options import Tolerance
from cann_export import parity_metrics as metrics


def reference_stats(actual, expected, rel_floor, chunk):
    """Whole-array float64: the pairs to compare (matching NaN / inf dropped), their maxima, and the cosine's
    sums over each CHUNK of the original positions until the first chunk with a one-sided NaN / inf."""
    a, b = actual.astype(np.float64).ravel(), expected.astype(np.float64).ravel()
    keep = ~((np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b)))
    ac, bc = a[keep], b[keep]
    err, ref = np.abs(ac - bc), np.abs(bc)
    out = {"size": int(ac.size), "bad_special": bool((~np.isfinite(ac) | ~np.isfinite(bc)).any()),
           "peak": float(ref.max()) if ac.size else 0.0, "max_abs": float(err.max()) if ac.size else 0.0,
           "max_rel": float((err / np.maximum(ref, rel_floor)).max()) if ac.size else 0.0}
    dot = norm_a = norm_b = 0.0
    bad = False
    for s in range(0, a.size, chunk):
        k = keep[s:s + chunk]
        x, y = a[s:s + chunk][k], b[s:s + chunk][k]
        if not x.size:
            continue
        bad = bad or bool((~np.isfinite(x) | ~np.isfinite(y)).any())
        if not bad:
            dot, norm_a, norm_b = dot + float(np.dot(x, y)), norm_a + float(np.dot(x, x)), norm_b + float(np.dot(y, y))
    out.update(dot=dot, norm_a=norm_a, norm_b=norm_b)
    return out, (err, ref)


def reference_within(pairs, atol, rtol, floor):
    err, ref = pairs
    return bool(np.all(err <= atol + rtol * (ref + floor)))


def reference_compare(actual, expected, tol, noise, chunk):
    st, pairs = reference_stats(actual, expected, max(tol.atol, 1e-12), chunk)
    if noise is not None and math.isfinite(noise):
        floor = max(tol.noise_share * noise, metrics.NOISE_MIN_SHARE * st["peak"])
    else:
        floor = tol.peak_share * st["peak"]
    within = not st["bad_special"] and reference_within(pairs, tol.atol, tol.rtol, floor)
    cos = 1.0
    if st["size"] and st["bad_special"]:
        cos = 0.0
    elif st["size"]:
        na, nb = math.sqrt(st["norm_a"]), math.sqrt(st["norm_b"])
        cos = 1.0 if na == nb == 0.0 else 0.0 if 0.0 in (na, nb) else float(np.clip(st["dot"] / (na * nb), -1, 1))
    passed = within and cos >= tol.min_cosine
    return {"max_abs": st["max_abs"], "max_rel": st["max_rel"], "cosine": cos, "passed": passed}


def same(x, y):
    """Bit-equal numbers (NaN equal to NaN, -0.0 apart from 0.0)."""
    if isinstance(x, float) or isinstance(y, float):
        return np.float64(x).tobytes() == np.float64(y).tobytes() or (math.isnan(x) and math.isnan(y))
    return x == y


def pair(case, rng, n):
    expected = rng.standard_normal(n).astype(np.float32)
    actual = (expected * np.float32(1.0000002)).astype(np.float32)
    actual[rng.integers(0, n, 5)] += np.float32(1e-5)
    spots = rng.integers(0, n, 7)
    if case == "nan_both":
        actual[spots] = expected[spots] = np.nan
    elif case in ("nan_actual", "nan_expected"):
        (actual if case == "nan_actual" else expected)[spots] = np.nan
    elif case == "inf_same":
        actual[spots] = expected[spots] = np.float32(-np.inf)
    elif case == "inf_opposite":
        actual[spots], expected[spots] = np.inf, -np.inf
    elif case in ("inf_actual", "inf_expected"):
        (actual if case == "inf_actual" else expected)[spots] = np.inf
    elif case == "special_chunk":  # a whole chunk NaN / inf on both sides: nothing compared there
        actual[:1500] = expected[:1500] = np.nan
        actual[1500:2100] = expected[1500:2100] = np.inf
    elif case == "signed_zeros":
        expected[::3], actual[::3] = -0.0, 0.0
        expected[1::3], actual[1::3] = 0.0, -0.0
    elif case == "zeros":
        actual, expected = np.zeros_like(actual), -np.zeros_like(expected)
    elif case == "large":  # |a-b| beyond atol + rtol x floor: the bound needs rtol x |ref|
        expected = (expected * np.float32(1e3)).astype(np.float32)
        actual = (expected * np.float32(1 + 4e-4)).astype(np.float32)
    elif case == "large_one_off":
        expected = (expected * np.float32(1e3)).astype(np.float32)
        actual = (expected * np.float32(1 + 4e-4)).astype(np.float32)
        actual[max(n - 3, 0)] *= np.float32(1.01)
    elif case == "float16":
        actual, expected = actual.astype(np.float16), expected.astype(np.float16)
    elif case == "mixed":  # float16 graph output against a float32 reference
        actual = actual.astype(np.float16)
    elif case == "float64_overflow":  # finite pairs whose difference overflows to inf
        actual, expected = actual.astype(np.float64), expected.astype(np.float64)
        actual[spots], expected[spots] = 1.7e308, -1.7e308
    elif case == "subnormal":
        actual, expected = actual * np.float32(1e-40), expected * np.float32(1e-40)
    elif case == "huge64":  # |ref| + floor overflows for a floor near float64's max (rtol 0 x inf: a NaN bound)
        expected = expected.astype(np.float64) * 1e307
        actual = expected.copy()
    elif case == "int_actual":
        actual = np.round(expected * 3).astype(np.int32)
    return actual, expected


CASES = ["close", "nan_both", "nan_actual", "nan_expected", "inf_same", "inf_opposite", "inf_actual", "inf_expected",
         "special_chunk", "signed_zeros", "zeros", "large", "large_one_off", "float16", "mixed", "float64_overflow",
         "subnormal", "huge64", "int_actual"]
FLOORS = [0.0, -0.0, 1e-3, 1.0, 1e3, -1.0, np.inf, np.nan, 1.7e308]
ATOL_RTOL = [(1e-4, 1e-3), (0.0, 0.0), (1e-4, 0.0), (0.0, 1e-3), (1e-4, -1e-3), (np.inf, 1e-3), (1e-4, np.nan)]


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(metrics, "CHUNK", 1000)  # many chunks, uneven last one
    monkeypatch.setattr(metrics, "BLOCK", 96)  # many blocks, uneven last one
    return 1000


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("n", [4321, 2000, 1, 0])
def test_pair_stats_equal_whole_float64(case, n, small_chunks):
    actual, expected = pair(case, np.random.default_rng(n), n) if n else pair(case, np.random.default_rng(0), 5)
    for a, e in [(actual, expected), (actual.reshape(-1, 1), expected.reshape(-1, 1))] if n else \
            [(actual[:0], expected[:0]), (actual[:0].reshape(3, 0), expected[:0].reshape(3, 0))]:
        st = metrics._PairStats(a, e, 1e-4)
        want, pairs = reference_stats(a, e, 1e-4, small_chunks)
        got = {k: getattr(st, k) for k in want}
        assert all(same(got[k], want[k]) for k in want), (got, want)
        for atol, rtol in ATOL_RTOL:
            for floor in FLOORS:
                assert st.all_within(atol, rtol, floor) == reference_within(pairs, atol, rtol, floor), (rtol, floor)


@pytest.mark.parametrize("case", CASES)
def test_compare_equals_whole_float64(case, small_chunks):
    actual, expected = pair(case, np.random.default_rng(7), 4321)
    for tol in (Tolerance(), Tolerance(peak_share=0.0), Tolerance(rtol=0.0)):
        for noise in (None, 1e-7, 1e-3, float("nan")):
            got, want = metrics.compare(actual, expected, tol, noise), reference_compare(actual, expected, tol, noise,
                                                                                          small_chunks)
            assert got.keys() == want.keys() and all(same(got[k], want[k]) for k in want), (tol, noise, got, want)
        probe, st = metrics.compare_probe(actual, expected, tol), reference_stats(actual, expected, 1e-4, 1000)[0]
        assert same(probe["max_abs"], st["max_abs"]) and same(probe["cosine"], want["cosine"])
    assert metrics.compare(actual, expected, Tolerance())["passed"] == (case in (
        "close", "nan_both", "inf_same", "special_chunk", "signed_zeros", "zeros", "large", "float16", "mixed",
        "subnormal"))
    if case in ("close", "nan_both", "inf_same", "special_chunk", "zeros"):  # nothing to warn of, as before
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            metrics.compare(actual, expected, Tolerance())


def test_scalars_and_integer_outputs():
    for a, e in [(np.float32(1.5), np.float32(1.5)), (np.array(np.nan, np.float32), np.array(np.nan, np.float32)),
                 (np.array(-0.0), np.array(0.0)), (np.array(2.0), np.array(np.inf))]:
        got, want = metrics.compare(np.asarray(a), np.asarray(e), Tolerance(), None), reference_compare(
            np.asarray(a), np.asarray(e), Tolerance(), None, metrics.CHUNK)
        assert all(same(got[k], want[k]) for k in want), (a, e, got, want)
    ints = np.arange(10)
    assert metrics.compare(ints, ints.copy(), Tolerance())["passed"] is True
    assert metrics.compare(ints + (ints == 3), ints, Tolerance())["max_abs"] == 1.0


def test_default_chunks_on_a_logits_sized_output():
    """The real CHUNK / BLOCK over 2.3 chunks, a NaN on both sides in the second and a one-sided inf in the last."""
    rng = np.random.default_rng(3)
    expected = rng.standard_normal((3, 7, 115_000)).astype(np.float32)
    actual = (expected + rng.standard_normal(expected.shape).astype(np.float32) * np.float32(1e-6)).astype(np.float32)
    for label in ("finite", "nan_both", "inf_last"):
        if label == "nan_both":
            actual[1, 2, 7] = expected[1, 2, 7] = np.nan
        elif label == "inf_last":
            actual[2, 6, 114_999] = np.inf
        for noise in (None, 1e-7):
            got = metrics.compare(actual, expected, Tolerance(), noise)
            want = reference_compare(actual, expected, Tolerance(), noise, metrics.CHUNK)
            assert all(same(got[k], want[k]) for k in want), (label, got, want)
        st, (want_st, _) = metrics._PairStats(actual, expected, 1e-4), reference_stats(actual, expected, 1e-4,
                                                                                       metrics.CHUNK)
        assert all(same(getattr(st, k), want_st[k]) for k in want_st), label


@pytest.mark.parametrize("ref", [0.0, 3.0])
def test_all_within_at_the_bound_exactly(ref, small_chunks):
    """A pair exactly at atol + rtol * (|ref| + floor) passes, one float64 step past it fails, in any chunk."""
    atol, rtol, floor = 0.25, 0.5, 0.5  # bounds 0.5 (ref 0) and 2.0 (ref 3), exact in float64
    bound = atol + rtol * (ref + floor)
    expected = np.full(4321, ref)
    for at in (0, 2500, 4320):
        for value, want in ((ref + bound, True), (np.nextafter(ref + bound, np.inf), False)):
            actual = expected.copy()
            actual[at] = value
            assert bool(actual[at] - expected[at] == bound) is want  # the difference is the one meant
            st = metrics._PairStats(actual, expected, 1e-4)
            assert st.all_within(atol, rtol, floor) is want
            assert reference_within(reference_stats(actual, expected, 1e-4, 1000)[1], atol, rtol, floor) is want
