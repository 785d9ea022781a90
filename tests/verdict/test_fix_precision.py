"""--fix-precision with simplification on (the default): the keep set is made of names of the graph as
written (never a crash on a name onnxsim removed), grown from the origin and shrunk by bisection, reported as
kept ops and their share of the graph's FLOPs, and checked by the independent emulation
(helpers/reference_emulation: numpy fp16, node by node) on the written model.onnx + keep_dtype.cfg."""
import json

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from helpers import origin_models as om
from helpers.reference_emulation import run_device, values
from onnx import helper
from safetensors.numpy import load_file

from cann_export.graph.module_paths import collect
from cann_export.cli.main import _print_fix, cli
from cann_export.options import Tolerance
from cann_export.validators import flops
from cann_export.validators.fix_precision import fix_precision
from cann_export.validators.precision import emulate, emulation_for, run

NORMS = ["layers.0.attn_norm", "layers.0.mlp_norm", "layers.1.attn_norm", "layers.1.mlp_norm", "norm"]


def _fp32(graph, feed):
    return run(emulate(graph, emulation_for("force_fp32"), set()), [feed])[0]


def _cosine(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-30))


def _cfg_nodes(bundle, graph):
    """keep_dtype.cfg's lines as node names: an ``OpType::T`` line (--fix-precision writes one where every node
    of a type fusion may fold away is kept) stands for the graph's nodes of that Ascend IR type (the ones these
    norms hold spell it as ONNX does, but Div, which ATC calls RealDiv)."""
    lines = (bundle / "atc" / "keep_dtype.cfg").read_text().split()
    ascend = {"Div": "RealDiv"}
    out = [ln for ln in lines if not ln.startswith("OpType::")]
    for ln in lines:
        if ln.startswith("OpType::"):
            out += [n.name for n in graph.graph.node if ascend.get(n.op_type, n.op_type) == ln[len("OpType::"):]]
    return out


def _input_sets(bundle):
    data = load_file(str(bundle / "parity" / "inputs.safetensors"))
    sets = sorted({k.split("/")[0] for k in data}, key=int)
    return [{k.split("/", 1)[1]: v for k, v in data.items() if k.startswith(f"{s}/")} for s in sets]


@pytest.fixture(scope="module")
def rms_fixed(tmp_path_factory):
    model, inputs, _ = om.rms_decoder()
    tmp = tmp_path_factory.mktemp("rms")
    torch.export.save(torch.export.export(model, (inputs["input_ids"],)), str(tmp / "m.pt2"))
    result = CliRunner().invoke(cli, [str(tmp / "m.pt2"), "-o", str(tmp / "b"), "--fix-precision",
                                      "--soc-version", "Ascend910B1"])  # Inf/NaN mode, as the oracle below
    return result, tmp / "b"


def test_rmsnorm_fix_lands_with_simplification_on(rms_fixed):
    result, bundle = rms_fixed
    assert result.exit_code == 0, result.output
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["optimize"]["onnxsim"] == "applied"
    graph = onnx.load(str(bundle / "model.onnx"))
    lines = (bundle / "atc" / "keep_dtype.cfg").read_text().split()
    cfg = _cfg_nodes(bundle, graph)
    assert set(cfg) <= {n.name for n in graph.graph.node}  # names of the written graph, every one
    assert manifest["atc"]["keep_dtype"]["nodes"] == lines
    assert sorted(cfg) == sorted(manifest["parity"]["fixed_by_keep_dtype"])
    written = manifest["parity"]["precision"]["fix"]["written_as"]  # which lines are types, which names
    assert set(lines) == {f"OpType::{t}" for t in written["op_types"]} | set(written["names"])
    assert written["op_types"]  # every norm's Pow kept: a type ATC's fusion may rename is written as a type
    assert f"--fix-precision wrote {', '.join(written['op_types'])} as OpType:: entries" in result.stdout
    paths = collect(graph)
    for norm in NORMS:  # every norm keeps its x.pow(2): no block is left with a dead branch
        assert any(paths.get(n) == norm and op == "Pow" for n, op in ((n.name, n.op_type) for n in graph.graph.node)
                   if n in cfg), norm


def test_the_fixed_bundle_is_healthy_in_the_independent_emulation(rms_fixed):
    _, bundle = rms_fixed
    graph = onnx.load(str(bundle / "model.onnx"))
    keep = set(_cfg_nodes(bundle, graph))
    for feed in _input_sets(bundle):
        device, reference = run_device(graph, feed, keep), _fp32(graph, feed)
        assert all(np.isfinite(d).all() and _cosine(d, r) >= 0.99 for d, r in zip(device, reference, strict=True))
        held = values(graph, feed, keep)  # no inf/nan anywhere: no branch dies behind the residual
        assert all(np.isfinite(v).all() for v in held.values() if isinstance(v, np.ndarray) and v.dtype.kind == "f")
    assert not all(np.isfinite(v).all() for v in values(graph, feed, set()).values()
                   if isinstance(v, np.ndarray) and v.dtype.kind == "f")  # and without the keep set it overflows


def test_the_report_says_how_many_ops_and_what_share_of_the_flops(rms_fixed):
    result, bundle = rms_fixed
    fix = json.loads((bundle / "parity.json").read_text())["precision"]["fix"]
    graph = onnx.load(str(bundle / "model.onnx"))
    cfg = _cfg_nodes(bundle, graph)
    assert fix["fixed"] and fix["kept_ops"] == len(cfg) and fix["graph_ops"] < len(graph.graph.node) + 1
    assert 0 < fix["kept_flops_share"] < 0.05  # norms: elementwise work, no MatMul
    shapes = {name: value.shape for name, value in _input_sets(bundle)[0].items()}  # weighed at the parity shapes
    assert fix["kept_flops_share"] == pytest.approx(flops.share(cfg, flops.node_flops(graph, shapes)), abs=1e-6)
    assert fix["rounds"][0]["because"].startswith("first divergence: layers.0.attn_norm (Pow)")
    assert (f"--fix-precision kept {len(cfg)} of {fix['graph_ops']} ops in fp32 ({fix['kept_flops_share']:.1%} "
            "of the graph's FLOPs)") in result.stdout


def test_a_name_onnxsim_removed_never_reaches_the_keep_set(rms_fixed):
    """The capture stage's module paths name nodes onnxsim folded away; the fix must not keep them."""
    _, bundle = rms_fixed
    graph = onnx.load(str(bundle / "model.onnx"))
    paths = {**collect(graph), **{f"node_gone_{k}": norm for k, norm in enumerate(NORMS)}}
    feed = _input_sets(bundle)[0]
    names = [o.name for o in graph.graph.output]
    report, kept = fix_precision(graph, "force_fp16", [], [feed], [_fp32(graph, feed)], names,
                                 Tolerance().device_policy(), paths)
    assert report["passed"] and kept and set(kept) <= {n.name for n in graph.graph.node}


def test_a_graph_wrong_in_fp32_cannot_be_fixed_and_says_why(rms_fixed, capsys):
    _, bundle = rms_fixed
    graph = onnx.load(str(bundle / "model.onnx"))
    feed = _input_sets(bundle)[0]
    wrong = [-o for o in _fp32(graph, feed)]  # a reference the graph does not compute, in any precision
    report, kept = fix_precision(graph, "force_fp16", [], [feed], [wrong], [o.name for o in graph.graph.output],
                                 Tolerance().device_policy(), collect(graph))
    fix = report["precision"]["fix"]
    assert not report["passed"] and not fix["fixed"] and kept == [] and fix["kept_ops"] == 0
    assert "even with every node kept in fp32" in fix["reason"] and "not the device's precision" in fix["reason"]
    _print_fix({"precision": report["precision"], "fixed_by_keep_dtype": kept})
    assert "--fix-precision cannot fix this: device parity fails even with every node" in capsys.readouterr().out


def test_flops_estimate_weighs_the_cube_ops():
    x = helper.make_tensor_value_info("x", 1, [2, 16])
    y = helper.make_tensor_value_info("y", 1, [2, 32])
    w = onnx.numpy_helper.from_array(np.ones((16, 32), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"], name="r")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]))
    per_node = flops.node_flops(model)
    assert per_node == {"mm": 2 * 2 * 32 * 16, "r": 2 * 32}
    assert flops.share(["mm"], per_node) == pytest.approx(2048 / 2112)



def test_a_dynamic_graph_weighs_its_flops_at_the_parity_shapes():
    """A dynamic batch leaves every size unknown: weighed at the first parity set's shapes, not as 0 for all."""
    x = helper.make_tensor_value_info("x", 1, ["batch_size", 16])
    y = helper.make_tensor_value_info("y", 1, ["batch_size", 32])
    w = onnx.numpy_helper.from_array(np.ones((16, 32), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"], name="r")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]))
    assert flops.share(["mm"], flops.node_flops(model)) == 0.0  # what --fix-precision reported for such a graph
    per_node = flops.node_flops(model, {"x": (2, 16)})
    assert per_node == {"mm": 2 * 2 * 32 * 16, "r": 2 * 32}
    feed = {"x": np.full((2, 16), 5000.0, np.float32)}  # 5000 * 16 = 80000 overflows fp16 at the MatMul
    report, kept = fix_precision(model, "force_fp16", [], [feed], [_fp32(model, feed)], ["y"],
                                 Tolerance().device_policy(), {"mm": "proj", "r": "act"}, overflow="inf_nan")
    fix = report["precision"]["fix"]
    assert report["passed"] and "mm" in kept and fix["kept_flops_share"] >= 2048 / 2112 - 1e-6, fix


def test_the_keep_set_is_offered_as_customize_dtypes_entries_that_mend_the_graph(rms_fixed):
    """atc/customize_dtypes.fix.cfg: keep_dtype.cfg's entries in the --customize_dtypes form (every float input
    and output ``float``); emulated as ATC reads that form, with no keep_dtype, the graph is as healthy as with it."""
    from cann_export.atc.customize import parse
    from cann_export.atc.mixlists import lists_for
    from cann_export.validators.precision import Emulator

    _, bundle = rms_fixed
    lines = (bundle / "atc" / "keep_dtype.cfg").read_text().split()
    text = (bundle / "atc" / "customize_dtypes.fix.cfg").read_text()
    entries = parse(text)
    assert [e.target for e in entries] == lines and all(set(e.outputs) == {"float"} for e in entries)
    assert "--customize_dtypes=atc/customize_dtypes.fix.cfg" in text  # says how to use it instead
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["atc"]["keep_dtype"]["customize_dtypes"] == "atc/customize_dtypes.fix.cfg"
    assert "atc/customize_dtypes.fix.cfg" in manifest["files"]
    graph = onnx.load(str(bundle / "model.onnx"))
    names = [o.name for o in graph.graph.output]
    feed = _input_sets(bundle)[0]
    plain = Emulator(graph, "force_fp16", "inf_nan").session(set()).run(feed, names)
    custom = Emulator(graph, "force_fp16", "inf_nan", lists=lists_for("Ascend910B1", None, text))
    mended = custom.session(set()).run(feed, names)
    reference = _fp32(graph, feed)
    assert not all(np.isfinite(p).all() and _cosine(p, r) >= 0.99 for p, r in zip(plain, reference, strict=True))
    assert all(np.isfinite(m).all() and _cosine(m, r) >= 0.99 for m, r in zip(mended, reference, strict=True))


@pytest.mark.slow
def test_qwen2_residual_growth_fix_lands_and_the_independent_emulation_agrees(tmp_path):
    import cann_export

    model, inputs, _ = om.qwen2_residual_growth()
    result = cann_export.export(model, tmp_path / "b", example_inputs=inputs, num_random_inputs=1, fix_precision=True)
    fix = result.parity["precision"]["fix"]
    assert result.ok and fix["fixed"] and 0 < fix["kept_flops_share"] < 0.5, fix
    graph = onnx.load(str(tmp_path / "b" / "model.onnx"))
    keep = set((tmp_path / "b" / "atc" / "keep_dtype.cfg").read_text().split())
    assert keep <= {n.name for n in graph.graph.node} and "layers.0.mlp.down_proj" in {collect(graph).get(n)
                                                                                      for n in keep}
    overflow = result.parity["precision"]["device_model"]["overflow_mode"]  # the SoC's, as the fix used it
    for feed in _input_sets(tmp_path / "b"):
        device, reference = run_device(graph, feed, keep, overflow), _fp32(graph, feed)
        assert all(np.isfinite(d).all() and _cosine(d, r) >= 0.99 for d, r in zip(device, reference, strict=True))
