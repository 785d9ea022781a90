"""The device model per SoC: its float overflow mode (saturation on 310/310P/310B/910A, Inf/NaN on 910B*/910_93*),
constants converted as ATC converts them (saturated, so a float32-min mask reads -65504), recorded in the manifest,
and `validate --soc-version` judging one bundle for several SoCs.

Oracles: a torch per-op emulation of each mode (helpers/overflow_models.py), the node-by-node numpy interpretation
(helpers/reference_emulation.py, both modes), and real fp16 in torch (IEEE: the Inf/NaN mode)."""
import json

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from helpers import calibration_models as cm
from helpers import hf_models
from helpers import origin_models
from helpers import overflow_models as om
from helpers.reference_emulation import run_device

import cann_export
from cann_export.cli.main import cli
from cann_export.options import KNOWN_SOCS, Tolerance, soc_model
from cann_export.validators.fix_precision import device_report
from cann_export.validators.precision import FP16, Emulator, atc_convert, emulate, emulation_for, run

MODES = ("saturation", "inf_nan")
SOC_OF = {"saturation": "Ascend310P3", "inf_nan": "Ascend910B1"}


def invoke(args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _onnx(model, inputs, path):
    result = cann_export.export(model, path, "onnx", example_inputs=inputs)
    return onnx.load(result.onnx["path"])


def _feed(graph, inputs):
    names = {i.name for i in graph.graph.input}
    return {n: v.numpy() for n, v in inputs.items() if n in names}


def _fp32(graph, feed):
    return run(emulate(graph, emulation_for("force_fp32"), set()), [feed])[0]


def _report(graph, feed, overflow):
    names = [o.name for o in graph.graph.output]
    return device_report(graph, "force_fp16", [], [feed], [_fp32(graph, feed)], names, Tolerance().device_policy(),
                         {}, overflow=overflow)


def _real_fp16_cosine(model, inputs):
    """Cosine of real fp16 (model.half()) against fp32 on the first output, 0.0 when not finite."""
    with torch.no_grad():
        ref = model(**inputs)
        half = {k: v.half() if v.is_floating_point() else v for k, v in inputs.items()}
        got = __import__("copy").deepcopy(model).half()(**half)
    ref, got = (o if isinstance(o, torch.Tensor) else o[0] for o in (ref, got))
    ref, got = ref.double().flatten(), got.double().flatten()
    return float(torch.nn.functional.cosine_similarity(ref, got, dim=0)) if torch.isfinite(got).all() else 0.0


@pytest.mark.parametrize("soc, mode", [
    ("Ascend310P3", "saturation"), ("Ascend310", "saturation"), ("Ascend310B1", "saturation"),
    ("Ascend910", "saturation"), ("Ascend910A", "saturation"), ("Ascend910ProA", "saturation"),
    ("Ascend910B", "saturation"), ("Ascend910B1", "inf_nan"), ("Ascend910B4", "inf_nan"),
    ("Ascend910_9391", "inf_nan"), ("Ascend910_9362", "inf_nan")])
def test_the_overflow_mode_is_a_property_of_the_soc(soc, mode):
    model = soc_model(soc)
    assert (model.overflow, model.known, model.note) == (mode, True, None)


def test_an_unknown_soc_of_the_right_shape_is_assumed_by_its_family():
    assert all(soc_model(s).known for s in KNOWN_SOCS)
    newer, other = soc_model("Ascend910B9"), soc_model("Ascend999X")
    assert (newer.overflow, newer.known, other.overflow, other.known) == ("inf_nan", False, "saturation", False)
    assert "assumed to be saturation" in other.to_dict()["note"]


def test_a_mistyped_soc_is_refused_with_the_closest_name(tmp_path):
    result = invoke(["validate", tmp_path / "missing", "--soc-version", "Ascend31OP3"])
    assert result.exit_code == 2 and "did you mean Ascend310P3?" in result.output
    assert "Traceback" not in result.output


def test_atc_converts_constants_saturating():
    values = np.array([-3.4028235e38, 1e5, np.inf, -np.inf, 1.0, 65504.0, 7e4], np.float32)
    assert atc_convert(values, FP16).tolist() == [-65504.0, 65504.0, 65504.0, -65504.0, 1.0, 65504.0, 65504.0]
    assert atc_convert(np.array([np.nan], np.float32), FP16)[0] == 65504.0  # fp16_t: NaN -> max of its sign


@pytest.fixture(scope="module")
def softmax_graph(tmp_path_factory):
    x = om.scaled_softmax_inputs()
    graph = _onnx(om.ScaledSoftmax().eval(), {"x": x}, tmp_path_factory.mktemp("softmax") / "s.onnx")
    return graph, x, _feed(graph, {"x": x})


@pytest.mark.parametrize("overflow", MODES)
def test_saturation_heals_what_inf_nan_breaks(softmax_graph, overflow):
    """softmax over logits past 65504: one-hot as in fp32 when they saturate, NaN when they are inf."""
    graph, x, feed = softmax_graph
    ours = Emulator(graph, "force_fp16", overflow).session().run(feed)[0]
    oracle = om.scaled_softmax_on_device(x, overflow).numpy()
    theirs = run_device(graph, feed, set(), overflow)[0]
    for other in (oracle, theirs):
        assert np.array_equal(np.isnan(ours), np.isnan(other))
        assert np.allclose(np.nan_to_num(ours), np.nan_to_num(other), atol=1e-3)
    report = _report(graph, feed, overflow)
    if overflow == "saturation":
        assert np.isfinite(ours).all() and np.allclose(ours, _fp32(graph, feed)[0], atol=1e-3)
        assert report["passed"] and report["precision"]["overflow"] == "saturation"
    else:
        assert np.isnan(ours).any() and not report["passed"]
        assert report["outputs"][0]["reason"].startswith("overflow: inf/nan")
        with torch.no_grad():  # real fp16 (IEEE) agrees
            assert torch.isnan(om.ScaledSoftmax().half()(x.half())).any()


@pytest.mark.parametrize("overflow", MODES)
def test_an_output_past_the_range_fails_in_both_modes(tmp_path, overflow):
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    graph = _onnx(om.Saturating().eval(), {"x": x}, tmp_path / "s.onnx")
    feed = _feed(graph, {"x": x})
    out = Emulator(graph, "force_fp16", overflow).session().run(feed)[0]
    assert (np.abs(out).max() == 65504.0) if overflow == "saturation" else np.isinf(out).any()
    reason = _report(graph, feed, overflow)["outputs"][0]["reason"]
    assert reason.startswith("overflow: saturated at +-65504" if overflow == "saturation" else "overflow: inf/nan")


@pytest.mark.parametrize("build", ["bert", "exp_overflow", "large_constant", "huge_activations", "reduction_overflow"])
def test_saturation_agrees_with_the_independent_emulation(build, tmp_path):
    if build == "bert":
        model, inputs = hf_models.tiny_bert(), hf_models.token_inputs()
        inputs["attention_mask"][1, 8:] = 0
    else:
        model, inputs, _ = getattr(cm, build)()
    graph = _onnx(model, inputs, tmp_path / "g.onnx")
    feed = _feed(graph, inputs)
    emulator = Emulator(graph, "force_fp16", "saturation")
    names = [n.name for n in graph.graph.node]
    for keep in (set(), set(names[::2]), set(names[1::3])):
        for a, b in zip(emulator.session(keep).run(feed), run_device(graph, feed, keep, "saturation"), strict=False):
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
            assert np.isfinite(a).all() and np.isfinite(b).all(), keep  # nothing is inf on a saturating SoC
            assert np.abs(a - b).max() <= 4e-3 * max(np.abs(b).max(), 1.0), keep
    if build != "bert":  # still broken on the device: saturated values are wrong, not healed
        assert not _report(graph, feed, "saturation")["passed"]


@pytest.mark.parametrize("overflow", MODES)
def test_masked_attention_passes_in_both_modes(tmp_path, overflow):
    """finfo(float32).min fills whole rows of padded queries: read as -65504 (ATC's conversion) the softmax is
    uniform there, as in fp32 and real fp16; read as -inf it would be NaN."""
    model, inputs = om.MaskedAttention().eval(), om.masked_attention_inputs()
    assert _real_fp16_cosine(model, inputs) > 0.999
    result = cann_export.export(model, tmp_path / "b", example_inputs=inputs, num_random_inputs=1,
                                soc_version=SOC_OF[overflow])
    assert result.ok and result.parity["device"]["passed"], result.parity
    assert result.parity["device"]["device_model"]["overflow_mode"] == overflow
    graph = onnx.load(str(tmp_path / "b" / "model.onnx"))
    feed = _feed(graph, inputs)
    theirs = run_device(graph, feed, set(), overflow)[0]
    ours = Emulator(graph, "force_fp16", overflow).session().run(feed)[0]
    assert np.isfinite(theirs).all() and np.abs(ours - theirs).max() < 4e-3


@pytest.fixture(scope="module")
def deberta_bundle(tmp_path_factory):
    model, inputs = om.tiny_deberta()
    target = tmp_path_factory.mktemp("deberta") / "b"
    result = cann_export.export(model, target, example_inputs=inputs, num_random_inputs=1)  # default: 310P3
    return model, inputs, target, result


def test_deberta_device_model_is_recorded_and_passes(deberta_bundle):
    model, inputs, target, result = deberta_bundle
    assert _real_fp16_cosine(model, inputs) > 0.999
    assert result.ok, result.parity.get("first_divergence")
    manifest = json.loads((target / "manifest.json").read_text())
    ran = manifest["parity"]["precision"]["device_model"]
    assert (ran["soc_version"], ran["overflow_mode"]) == ("Ascend310P3", "saturation")
    assert manifest["parity"]["device"]["device_model"] == ran


def test_validate_judges_one_bundle_for_several_socs(deberta_bundle):
    target = deberta_bundle[2]
    result = invoke(["validate", target, "--soc-version", "Ascend910B1", "--soc-version", "Ascend310P3", "--json"])
    assert result.exit_code == 0, result.output
    socs = json.loads(result.output)["socs"]
    assert [(v["soc_version"], v["overflow_mode"], v["passed"]) for v in socs] == [
        ("Ascend910B1", "inf_nan", True), ("Ascend310P3", "saturation", True)]


def test_validate_gives_each_soc_its_own_verdict(tmp_path):
    """A graph that heals on a saturating SoC and breaks on an Inf/NaN one: one verdict per SoC, exit 1."""
    x = om.scaled_softmax_inputs()
    cann_export.export(om.ScaledSoftmax().eval(), tmp_path / "b", example_inputs={"x": x}, num_random_inputs=0)
    report = cann_export.validate(tmp_path / "b", soc_versions=["Ascend310P3", "Ascend910B1"])
    verdicts = {v["soc_version"]: v for v in report["socs"]}
    assert verdicts["Ascend310P3"]["passed"] and not verdicts["Ascend910B1"]["passed"]
    assert not report["passed"]
    result = invoke(["validate", tmp_path / "b", "--soc-version", "Ascend910B1"])
    assert result.exit_code == 1 and "Ascend910B1 (inf_nan overflow): FAILED" in result.output


def test_linear_times_1e4_softmax_passes_where_real_fp16_does(tmp_path):
    model, x = om.LinearSoftmax().eval(), torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    assert _real_fp16_cosine(model, {"x": x}) > 0.999
    result = cann_export.export(model, tmp_path / "b", example_inputs={"x": x}, num_random_inputs=1)
    assert result.ok, result.parity
    report = cann_export.validate(tmp_path / "b", soc_versions=["Ascend910B1", "Ascend310P3"])
    assert report["passed"] and all(v["passed"] for v in report["socs"])


@pytest.mark.slow
def test_attention_logits_past_the_range_heal_on_a_saturating_soc(tmp_path):
    """BERT whose attention logits pass 65504: broken in Inf/NaN mode (real fp16: NaN), healed where they saturate
    (the softmax of saturated logits still picks the largest); the tool says so for each, as the oracle does."""
    model, inputs, _ = cm.attention_overflow()
    graph = _onnx(model, inputs, tmp_path / "g.onnx")
    feed = _feed(graph, inputs)
    ref = _fp32(graph, feed)
    for overflow in MODES:
        truth = run_device(graph, feed, set(), overflow)
        cos = [float(np.dot(t.ravel(), r.ravel()) / (np.linalg.norm(t) * np.linalg.norm(r)))
               for t, r in zip(truth, ref, strict=True)]
        healthy = all(np.isfinite(t).all() for t in truth) and min(cos) > 0.999
        assert healthy == (overflow == "saturation") == _report(graph, feed, overflow)["passed"]


def test_the_rmsnorm_fix_lands_on_a_saturating_soc(tmp_path):
    """--fix-precision under the default SoC (Ascend310P3, saturation), verified by the saturating oracle on every
    input set the bundle holds."""
    from safetensors.numpy import load_file

    model, inputs, _ = origin_models.rms_decoder()
    result = cann_export.export(model, tmp_path / "b", example_inputs=inputs, fix_precision=True)
    assert result.ok and result.parity["device"]["device_model"]["overflow_mode"] == "saturation"
    graph = onnx.load(str(tmp_path / "b" / "model.onnx"))
    keep = set((tmp_path / "b" / "atc" / "keep_dtype.cfg").read_text().split())
    data = load_file(str(tmp_path / "b" / "parity" / "inputs.safetensors"))
    for s in sorted({k.split("/")[0] for k in data}, key=int):
        feed = {k.split("/", 1)[1]: v for k, v in data.items() if k.startswith(f"{s}/")}
        for d, r in zip(run_device(graph, feed, keep, "saturation"), _fp32(graph, feed), strict=True):
            cos = np.dot(d.ravel(), r.ravel()) / (np.linalg.norm(d) * np.linalg.norm(r))
            assert np.isfinite(d).all() and cos > 0.99, s
