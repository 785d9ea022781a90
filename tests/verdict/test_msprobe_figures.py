"""msprobe's comparison figures in parity.json, checked against a second implementation written from the
definitions in validators/msprobe_metrics.py's docstring (torch, float64, whole tensors, no shared code)."""
import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from helpers.toy_models import TwoInputs, make_mlp

import cann_export
from cann_export.inputs.parity_data import read_bundle_labels, read_bundle_parity
from cann_export.validators import msprobe_metrics

EPS = 1e-12


def oracle(actual, expected):
    """The figures, straight from their definitions."""
    a = torch.as_tensor(np.asarray(actual, dtype=np.float64)).flatten()
    b = torch.as_tensor(np.asarray(expected, dtype=np.float64)).flatten()
    diff = (a - b).abs()
    rel = diff / b.abs().clamp_min(EPS)
    kl = F.kl_div(F.log_softmax(a, 0), F.log_softmax(b, 0), reduction="sum", log_target=True)
    return {"cosine": float(F.cosine_similarity(a, b, dim=0, eps=0.0)),
            "max_abs": float(diff.max()),
            "rel_euclidean": float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)),
            "kl": float(kl),
            "rmse": float(torch.sqrt(F.mse_loss(a, b))),
            "mre": float(rel.mean()),
            "one_thousandth": float((rel <= 1e-3).double().mean()),
            "five_thousandth": float((rel <= 5e-3).double().mean())}


def assert_close(got, want):
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


@pytest.mark.parametrize("chunk", [msprobe_metrics.CHUNK, 1000])  # whole, and across chunk borders
def test_figures_match_the_definitions(monkeypatch, chunk):
    monkeypatch.setattr(msprobe_metrics, "CHUNK", chunk)
    rng = np.random.default_rng(0)
    expected = rng.normal(size=(7, 613)).astype(np.float32)
    expected[0, :5] = 0.0  # zero reference elements: the EPS floor
    noise = rng.normal(scale=1e-3, size=expected.shape).astype(np.float32)
    actual = expected + noise * np.abs(expected)
    actual[0, :5] = 0.0
    got = msprobe_metrics.figures(actual, expected)
    assert_close(got, oracle(actual, expected))
    assert 0.0 < got["one_thousandth"] < got["five_thousandth"] <= 1.0 and got["kl"] > 0.0


def test_a_far_output_scores_far():
    rng = np.random.default_rng(1)
    expected = rng.normal(size=4096).astype(np.float32) * 20
    actual = rng.normal(size=4096).astype(np.float32) * 20
    got = msprobe_metrics.figures(actual, expected)
    assert_close(got, oracle(actual, expected))
    assert got["cosine"] < 0.2 and got["kl"] > 1.0 and got["one_thousandth"] < 0.01


@pytest.mark.parametrize("actual, expected", [
    (np.array([1.0, np.nan], np.float32), np.array([1.0, 2.0], np.float32)),
    (np.array([1, 2], np.int64), np.array([1, 2], np.int64)),
    (np.zeros(0, np.float32), np.zeros(0, np.float32)),
])
def test_no_figures_where_they_do_not_apply(actual, expected):
    assert msprobe_metrics.figures(actual, expected) is None


def test_worst_case_over_sets():
    sets = [{f: 0.5 for f in msprobe_metrics.FIELDS}, {f: 0.9 for f in msprobe_metrics.FIELDS}]
    worst = msprobe_metrics.worst(sets)
    assert worst["cosine"] == 0.5 and worst["one_thousandth"] == 0.5 and worst["max_abs"] == 0.9
    assert msprobe_metrics.worst([sets[0], None]) is None


@pytest.mark.parametrize("model, inputs", [
    (make_mlp(), (torch.randn(2, 12),)),
    (TwoInputs(), {"input_ids": torch.randint(0, 50, (2, 7)), "features": torch.randn(2, 7, 16)}),
])
def test_parity_json_holds_msprobe_figures_beside_ours(tmp_path, model, inputs):
    torch.manual_seed(0)
    out = tmp_path / "b"
    assert cann_export.export(model, out, example_inputs=inputs).ok
    parity = json.loads((out / "parity.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    feeds, expected, _ = read_bundle_parity(out, manifest)
    labels = read_bundle_labels(out, len(feeds))
    verdict = [s for s, label in enumerate(labels) if label["role"] == "verdict"]
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    runs = {s: session.run(None, {i.name: feeds[s][i.name] for i in session.get_inputs()}) for s in verdict}
    fp32_rows = parity["graph_fp32"]["outputs"]  # the graph in onnxruntime against the PyTorch reference
    for k, entry in enumerate(fp32_rows):
        assert entry["name"] == names[k] and "cosine" in entry
        if expected[0][k].dtype.kind != "f":
            assert entry["msprobe"] is None
            continue
        per_set = [oracle(runs[s][k], expected[s][k]) for s in verdict]
        want = {f: (min if f in ("cosine", "one_thousandth", "five_thousandth") else max)(r[f] for r in per_set)
                for f in msprobe_metrics.FIELDS}
        got = entry["msprobe"]
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
        assert got["cosine"] > 0.9999 and got["one_thousandth"] > 0.5
    for entry in parity["outputs"]:  # the emulated device run (fp16): its own figures, its max abs the verdict's
        if entry["msprobe"] is None:
            continue
        assert entry["msprobe"]["max_abs"] == pytest.approx(entry["max_abs"], rel=1e-6)
        assert 0.99 < entry["msprobe"]["cosine"] <= 1.0
