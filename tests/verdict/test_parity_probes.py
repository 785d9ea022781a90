"""Input sets vs specialisation probes and the calibrated fp32 policy: healthy third-party architectures whose
large outputs the old elementwise rule refused pass the plain export; graphs that really differ still fail;
every failing set is named by what it was; probes are judged and reported apart; the device verdict runs on
the realistic sets only."""
import json

import numpy as np
import onnx
import pytest
import torch
from helpers import fp32_corpus, wrong_graphs

import cann_export
from cann_export.inputs.parity_data import read_bundle_labels, read_bundle_parity
from cann_export.inputs.tensors import set_label
from cann_export.options import Tolerance
from cann_export.validators.parity import parity_report

OLD_RULE = Tolerance(peak_share=0.0)  # the elementwise rule before the calibration


def _export(tmp_path_factory, name):
    model, example = fp32_corpus.CORPUS[name]()
    out = tmp_path_factory.mktemp(name) / "bundle"
    result = cann_export.export(model, out, example_inputs=example)
    return out, result


@pytest.fixture(scope="module")
def deeplab(tmp_path_factory):
    return _export(tmp_path_factory, "deeplabv3_mobilenet_v3_large")


@pytest.fixture(scope="module")
def lraspp(tmp_path_factory):
    return _export(tmp_path_factory, "lraspp_mobilenet_v3_large")


def _stored(bundle):
    """The bundle's graph, stored input sets, reference outputs and set labels."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    feeds, expected, _ = read_bundle_parity(bundle, manifest)
    return bundle / manifest["model"]["file"], feeds, expected, read_bundle_labels(bundle, len(feeds))


@pytest.mark.vision
@pytest.mark.parametrize("head", ["deeplab", "lraspp"])
def test_segmentation_heads_pass_fp32_where_the_elementwise_rule_refused(head, request):
    bundle, result = request.getfixturevalue(head)
    parity = result.parity
    assert parity["fp32"]["passed"] is True, parity.get("reason")
    assert parity["fp32"]["outputs"][0]["cosine"] > 0.9999999
    assert [s["kind"] for s in json.loads((bundle / "parity.json").read_text())["sets"]] == [
        "example", "normal", "uniform", "laplace", "wide_normal"]
    path, feeds, expected, labels = _stored(bundle)
    old = parity_report(path, feeds, expected, OLD_RULE, labels=[{**x, "role": "verdict"} for x in labels])
    assert old["passed"] is False  # the hard regime: outputs of ~1e4 whose near-zero elements carry float noise
    assert old["outputs"][0]["cosine"] > 0.9999999 and old["failing_sets"][0]["kind"] == "example"


@pytest.mark.vision
def test_efficientnet_b0_passes_the_plain_export(tmp_path_factory):
    _, result = _export(tmp_path_factory, "efficientnet_b0")
    assert result.ok and result.parity["passed"] is True, result.parity.get("reason")


@pytest.mark.vision
@pytest.mark.parametrize("tamper", ["weight x1.01", "dropped activation"])
def test_graphs_that_differ_from_the_model_still_fail(tamper, deeplab, tmp_path):
    path, feeds, expected, labels = _stored(deeplab[0])
    wrong = wrong_graphs.TAMPERS[tamper](onnx.load(str(path)))
    onnx.save(wrong, str(tmp_path / "wrong.onnx"))
    report = parity_report(tmp_path / "wrong.onnx", feeds, expected, Tolerance(), labels=labels)
    assert report["passed"] is False and report["outputs"][0]["passed"] is False
    failing = [f for f in report["failing_sets"] if f["role"] == "verdict"]
    assert failing[0]["set"] == 0 and failing[0]["kind"] == "example"
    assert "input set 0 (example)" in report["reason"]
    json.dumps(report, allow_nan=False)


class ClampedLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.clamp(self.fc(x), -5.0, 5.0)


def _without_clip(path, out):
    model = onnx.load(str(path))
    for node in model.graph.node:
        if node.op_type == "Clip":
            node.CopyFrom(onnx.helper.make_node("Identity", [node.input[0]], list(node.output), node.name))
    onnx.save(model, str(out))
    return out


@pytest.fixture(scope="module")
def clamped(tmp_path_factory):
    torch.manual_seed(0)
    model = ClampedLinear().eval()
    path = tmp_path_factory.mktemp("clamped") / "m.onnx"
    result = cann_export.export(model, path, export_format="onnx", example_inputs={"x": torch.randn(4, 8) * 0.3})
    assert result.parity["passed"] is True
    return model, _without_clip(path, path.with_name("no_clip.onnx"))


def _sets(model, scales):
    g = torch.Generator().manual_seed(3)
    feeds = [{"x": (torch.randn(4, 8, generator=g) * s).numpy()} for s in scales]
    with torch.no_grad():
        expected = [[model(torch.from_numpy(f["x"])).numpy()] for f in feeds]
    return feeds, expected


def test_a_probe_failure_is_reported_apart_and_named(clamped):
    model, wrong = clamped  # the graph lost the clamp: it differs only on inputs large enough to reach it
    labels = [set_label("example", "example", 0), set_label("random", "normal", 1),
              set_label("random", "wide_normal", 2, probe=True)]
    report = parity_report(wrong, *_sets(model, (0.3, 0.3, 30.0)), Tolerance(), labels=labels)
    assert report["outputs"][0]["passed"] is True and report["outputs"][0]["failed_sets"] == 0
    assert report["probes"]["passed"] is False and report["probes"]["outputs"][0]["failed_sets"] == 1
    assert report["passed"] is False
    assert report["failing_sets"] == [{**report["failing_sets"][0], "set": 2, "kind": "wide_normal", "role": "probe"}]
    assert "specialisation probe 2 (wide_normal)" in report["reason"]


def test_a_failing_parity_data_sample_is_named(clamped):
    model, wrong = clamped
    labels = [set_label("example", "example", 0), set_label("parity_data", "sample 0", 1),
              set_label("parity_data", "sample 1", 2)]
    report = parity_report(wrong, *_sets(model, (0.3, 0.3, 30.0)), Tolerance(), labels=labels)
    assert report["passed"] is False and "probes" not in report
    assert report["failing_sets"][0]["kind"] == "sample 1" and report["failing_sets"][0]["source"] == "parity_data"
    assert "input set 2 (sample 1)" in report["reason"]


def test_probes_use_a_rule_relative_to_their_own_output(clamped):
    model, _ = clamped
    feeds, expected = _sets(model, (1.0,))
    noisy = [[expected[0][0] * (1 + 3e-3)]]  # 0.3% of the output: noise for a probe, a wrong graph for a verdict set
    from cann_export.parity_metrics import compare, compare_probe

    assert compare_probe(noisy[0][0], expected[0][0], Tolerance())["passed"] is True
    assert compare(noisy[0][0], expected[0][0], Tolerance())["passed"] is False


class Quartic(torch.nn.Module):
    """Past |x| ~ 3.8 its fp16 value overflows: realistic inputs (the example's spread, ~1) stay far below,
    the wide / heavy-tailed probes reach it."""

    def forward(self, x):
        return x ** 4 * 300.0


def test_device_verdict_runs_on_the_realistic_sets_only(tmp_path):
    example = {"x": torch.randn(2, 64, generator=torch.Generator().manual_seed(0)).clamp(-2, 2)}
    out = tmp_path / "quartic"
    result = cann_export.export(Quartic(), out, example_inputs=example)
    parity = json.loads((out / "parity.json").read_text())
    assert result.ok and parity["device"]["passed"] is True, parity.get("reason")
    assert parity["probes"]["passed"] is True  # fp32 follows the model on the probes
    roles = [s["role"] for s in parity["sets"]]
    assert roles == ["verdict", "verdict", "verdict", "probe", "probe"]
    emulated = json.loads((out / "parity.json").read_text())["device"]["outputs"][0]
    assert emulated["non_finite"] is False
    # the same graph judged on every set (as before the split) overflows on a probe
    from cann_export.validators.fix_precision import device_report

    path, feeds, expected, _ = _stored(out)
    every = device_report(onnx.load(str(path)), "force_fp16", [], feeds, expected, ["output"],
                          Tolerance().device_policy(), {})
    assert every["passed"] is False and every["outputs"][0]["non_finite"] is True
    checked = cann_export.validate(out)  # the stored labels make validate judge as export did
    assert checked["passed"] is True and not checked.get("differences"), checked


def test_token_only_inputs_have_no_probes():
    from cann_export.inputs.tensors import variant_labels

    feed = {"input_ids": torch.zeros(2, 8, dtype=torch.int64), "attention_mask": torch.ones(2, 8, dtype=torch.int64)}
    labels = variant_labels(feed, 4, 1)
    assert [x["role"] for x in labels] == ["verdict"] * 4
    assert [x["kind"] for x in labels][:2] == ["padding at the end", "padding in the middle"]
    assert np.array_equal([x["index"] for x in labels], [1, 2, 3, 4])


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    model, example = fp32_corpus.qwen2()  # token ids and a padded mask: no float input to probe with
    out = tmp_path_factory.mktemp("qwen2") / "bundle"
    return out, cann_export.export(model, out, example_inputs=example)


def test_a_decoder_on_padded_batches_decides_on_every_set(qwen2):
    bundle, result = qwen2
    assert result.ok and result.parity["passed"] is True, result.parity.get("reason")
    assert "probes" not in result.parity and result.parity["failing_sets"] == []
    sets = json.loads((bundle / "parity.json").read_text())["sets"]
    assert [s["role"] for s in sets] == ["verdict"] * 5
    assert [s["kind"] for s in sets[1:3]] == ["padding at the end", "padding in the middle"]


def test_the_reference_noise_floor_sees_a_small_wrong_constant(qwen2, tmp_path):
    from cann_export.inputs.parity_data import read_bundle_noise

    path, feeds, expected, labels = _stored(qwen2[0])
    noise = read_bundle_noise(qwen2[0], len(feeds))
    assert noise == [[0.0]] * len(feeds)  # every verdict set passed at the least floor: stored as that floor
    onnx.save(wrong_graphs.wrong_constant(onnx.load(str(path)), 1.001), str(tmp_path / "wrong.onnx"))
    healthy = parity_report(path, feeds, expected, Tolerance(), labels=labels, noise=noise)
    wrong = parity_report(tmp_path / "wrong.onnx", feeds, expected, Tolerance(), labels=labels, noise=noise)
    assert healthy["passed"] is True and wrong["passed"] is False
    # 0.1% of one weight moves the logits by ~3e-4 of their peak: below the peak-relative floor (no noise measured)
    assert parity_report(tmp_path / "wrong.onnx", feeds, expected, Tolerance(), labels=labels)["passed"] is True


def test_float64_noise_is_an_estimate_never_a_requirement():
    from cann_export.inputs.float_noise import fp64_noise

    class Float32Only(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 8))

        def forward(self, x):
            return x @ self.w.float().T.to(torch.float32) @ torch.ones(8, 8)  # a float32 constant: fails in float64

    x = {"x": torch.randn(2, 8)}
    with torch.no_grad():
        ref = [[ClampedLinear().eval()(x["x"]).numpy()]]
    assert fp64_noise(Float32Only(), "module", [x], ref, [0]) == [None]
    assert fp64_noise(ClampedLinear(), "program", [x], ref, [0]) == [None]  # not a module: no estimate
    model = ClampedLinear().eval()
    with torch.no_grad():
        ref = [[model(x["x"]).numpy()], [model(x["x"] * 2).numpy()]]
    noise = fp64_noise(model, "module", [x, {"x": x["x"] * 2}], ref, [1])
    assert noise[0] is None and 0 <= noise[1][0] < 1e-5


@pytest.mark.parametrize("labels, expected", [
    (None, None),  # a bundle from before the labels: every stored set decides, as it did
    ('[{"source": "random", "kind": "laplace", "role": "probe"}]', None),  # not one label per set
    ('{"not": "a list"}', None), ("not json", None),
    ('[{"source": "example", "kind": "example", "role": "verdict"}, {"source": "random", "kind": "laplace", '
     '"role": "probe"}]', ["verdict", "probe"]),
])
def test_stored_labels_are_read_back_or_ignored(tmp_path, labels, expected):
    from safetensors.torch import save_file

    (tmp_path / "parity").mkdir()
    meta = {"inputs": "x", "outputs": "y", "sets": "2", **({"labels": labels} if labels else {})}
    save_file({"0/x": torch.zeros(1), "1/x": torch.ones(1)}, str(tmp_path / "parity" / "inputs.safetensors"), meta)
    got = read_bundle_labels(tmp_path, 2)
    assert (None if got is None else [x["role"] for x in got]) == expected
