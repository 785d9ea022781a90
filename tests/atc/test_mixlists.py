"""Mixed precision as ATC does it: the per-SoC white/black/gray lists, gray ops following their producer,
--modify-mixlist and --customize-dtypes, keep_dtype in Ascend IR types.

The oracle here is a second, deliberately simple implementation of the documented list rule, written from
Huawei's --modify_mixlist page (white: reduced; black: fp32; not listed: gray, "follows the same precision
processing as its upstream operator") without importing the tool's code: its own ONNX -> Ascend IR names for the
ops these graphs hold, the list data read as data, the modify_mixlist edits applied as the page documents them.
Its reduced set drives the node-by-node numpy interpreter of the device rule (helpers/reference_emulation.py)."""
import json
from importlib.resources import files

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from helpers import calibration_models as cm
from helpers import hf_models
from helpers.reference_emulation import _constants, run_device
from onnx import TensorProto, helper, numpy_helper

import cann_export
from cann_export.cli.main import cli

# the oracle's own ONNX -> Ascend IR names (ATC's parser plugins), for the ops of the graphs below
ORACLE_TYPES = {"MatMul": "BatchMatMulV2", "Gemm": "MatMulV2", "Conv": "Conv2D", "Softmax": "SoftmaxV2",
                "Div": "RealDiv", "Where": "SelectV2", "Gather": "GatherV2", "Concat": "ConcatD", "Slice":
                "StridedSliceV2", "Split": "SplitV", "MaxPool": "MaxPoolV3", "AveragePool": "AvgPoolV2",
                "Max": "Maximum", "Min": "Minimum", "Clip": "ClipByValue", "Pad": "PadV3",
                "ConstantOfShape": "Fill", "LayerNormalization": "LayerNorm", "BatchNormalization": "BatchNorm"}
SOCS = ("Ascend910B1", "Ascend310P3", "Ascend910_9391", "Ascend310")


def _oracle_lists(soc, edits=None):
    """White and black sets: the shipped data's family for the SoC, then the documented edits (a to-remove moves
    an op to gray, a to-add moves it onto that list, removals before additions)."""
    data = json.loads(files("cann_export.atc.data").joinpath("mixlists.json").read_text())
    fam = ("ascend910b" if soc.startswith("Ascend910B") else "ascend910_93" if soc.startswith("Ascend910_93")
           else "ascend310p" if soc.startswith("Ascend310P") else "default")
    white, black = set(data["families"][fam]["white"]), set(data["families"][fam]["black"])
    for edit in (edits or {}).values():
        for op in edit.get("to-remove", []):
            white.discard(op)
            black.discard(op)
    for lst, edit in (edits or {}).items():
        for op in edit.get("to-add", []):
            white.discard(op)
            black.discard(op)
            {"black-list": black, "white-list": white}.get(lst, set()).add(op)
    return white, black


def _ranks(model):
    inferred = onnx.shape_inference.infer_shapes(model).graph
    out = {}
    for v in list(inferred.value_info) + list(inferred.input) + list(inferred.output):
        out[v.name] = (v.type.tensor_type.elem_type, len(v.type.tensor_type.shape.dim))
    for i in model.graph.initializer:
        out[i.name] = (i.data_type, len(i.dims))
    return out


def _oracle_type(node, ranks):
    if node.op_type == "MatMul" and all(ranks.get(i, (0, 0))[1] == 2 for i in node.input[:2]):
        return "MatMulV2"
    return ORACLE_TYPES.get(node.op_type, node.op_type)


def oracle_reduced(model, soc, edits=None, keep=()):
    """The nodes the documented rule reduces: in graph order, white reduced, black fp32, gray as the node that
    produces its first float input (a graph input or a weight: fp32). keep_dtype nodes and what ATC folds on the
    host (constants and what is computed from them) stay fp32."""
    white, black = _oracle_lists(soc, edits)
    ranks = _ranks(model)
    host = _constants(model)
    reduced, reduced_values = set(), set()
    for node in model.graph.node:
        if node.op_type == "Constant" or node.name in keep or set(node.output) <= host:
            continue
        kind = _oracle_type(node, ranks)
        if kind in white:
            mine = True
        elif kind in black:
            mine = False
        else:
            floats = [i for i in node.input if i and ranks.get(i, (0, 0))[0] == TensorProto.FLOAT]
            mine = bool(floats) and floats[0] in reduced_values
        if mine:
            reduced.add(node.name)
            reduced_values.update(node.output)
    return reduced


def _onnx(model, inputs, tmp_path):
    result = cann_export.export(model, tmp_path / "plain.onnx", "onnx", example_inputs=inputs)
    return onnx.load(result.onnx["path"])


def _feed(graph, inputs):
    names = [i.name for i in graph.graph.input]
    return {n: v.numpy() for n, v in inputs.items() if n in names}


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x):
        h = torch.nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        h = torch.sigmoid(self.conv2(h)) * h + 0.5
        return torch.softmax(self.head(h.mean((2, 3))), -1)


def gray_chain():
    """x -> MatMul -> Add -> Tanh -> Mul -> Softmax, and beside it x -> Add -> Tanh (gray ops fed by a graph
    input), joined by an Add whose first input is the fp32 branch."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "b"], ["a"], name="bias"),
             helper.make_node("Tanh", ["a"], ["t"], name="tanh"),
             helper.make_node("Mul", ["t", "a"], ["p"], name="mul"),
             helper.make_node("Add", ["x", "b"], ["xb"], name="side_add"),
             helper.make_node("Tanh", ["xb"], ["xt"], name="side_tanh"),
             helper.make_node("Add", ["xt", "p"], ["j"], name="join"),
             helper.make_node("Softmax", ["j"], ["y"], name="softmax", axis=-1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, {"x": rng.standard_normal((4, 8)).astype(np.float32)}


def _graphs(tmp_path):
    bert_inputs = hf_models.token_inputs()
    bert = _onnx(hf_models.tiny_bert(), bert_inputs, tmp_path / "bert")
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    conv = _onnx(ConvNet().eval(), {"x": x}, tmp_path / "conv")
    chain, chain_feed = gray_chain()
    return {"bert": (bert, _feed(bert, bert_inputs)), "conv": (conv, _feed(conv, {"x": x})),
            "gray_chain": (chain, chain_feed)}


EDITS = [None,
         {"black-list": {"to-add": ["Tanh", "SoftmaxV2"]}},
         {"white-list": {"to-add": ["Add", "Mul"], "to-remove": ["BatchMatMulV2", "MatMulV2"]}},
         {"black-list": {"to-add": ["Conv2D", "Add"]}, "gray-list": {"to-add": ["Relu"]}}]


def test_the_list_rule_agrees_with_an_independent_oracle(tmp_path):
    """On a tiny BERT, a conv net and a gray chain, for each SoC family and list edits: the nodes the emulation
    reduces are the oracle's, and its outputs are the numpy interpreter's with the oracle's reduced set."""
    from cann_export.atc.mixlists import lists_for
    from cann_export.validators.precision import Emulator

    seen = set()
    for name, (graph, feed) in _graphs(tmp_path).items():
        for soc in SOCS:
            for k, edits in enumerate(EDITS):
                emulator = Emulator(graph, "mixed_float16", lists=lists_for(soc, edits))
                expected = oracle_reduced(graph, soc, edits)
                assert emulator.mixed_reduced(set()) == expected, (name, soc, edits)
                seen.add(frozenset(expected))
                if k > 1 or soc not in ("Ascend910B1", "Ascend310P3"):
                    continue  # the numeric comparison on a subset (each run interprets the graph in numpy)
                keep = {n.name for n in graph.graph.node} - expected
                ours = emulator.session().run(feed)
                theirs = run_device(graph, feed, keep)
                for a, b in zip(ours, theirs, strict=True):
                    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
                    assert np.array_equal(np.isfinite(a), np.isfinite(b)), (name, soc, edits)
                    fin = np.isfinite(a)
                    scale = max(np.abs(b[fin]).max(initial=0.0), 1.0)
                    assert np.abs(a[fin] - b[fin]).max(initial=0.0) <= 4e-3 * scale, (name, soc, edits)
    assert len(seen) >= 10  # the edits and families really change what is reduced


def test_gray_ops_follow_their_producer():
    from cann_export.atc.mixlists import lists_for
    from cann_export.validators.precision import Emulator

    graph, _ = gray_chain()
    plain = Emulator(graph, "mixed_float16", lists=lists_for("Ascend310P3")).mixed_reduced(set())
    # the cube op and the gray chain after it are reduced; the gray ops fed by the graph input and the join whose
    # first input is that fp32 branch are not; Softmax (gray on 310P) follows the join
    assert plain == {"mm", "bias", "tanh", "mul"}
    blacked = Emulator(graph, "mixed_float16", lists=lists_for("Ascend310P3", {"black-list": {"to-add": ["Tanh"]}}))
    assert blacked.mixed_reduced(set()) == {"mm", "bias"}  # a black op breaks the chain, and Mul follows it
    kept = Emulator(graph, "mixed_float16", lists=lists_for("Ascend310P3")).mixed_reduced({"mm"})
    assert kept == set()  # keep_dtype on the cube op: nothing downstream inherits fp16
    by_type = Emulator(graph, "mixed_float16", lists=lists_for("Ascend310P3")).mixed_reduced({"OpType::MatMulV2"})
    assert by_type == set()
    onnx_spelled = Emulator(graph, "mixed_float16", lists=lists_for("Ascend310P3")).mixed_reduced({"OpType::MatMul"})
    assert onnx_spelled == plain  # ATC matches Ascend IR types: OpType::MatMul keeps nothing on the device


def _cli(*args):
    """The CLI in this process (the interpreter's imports paid once for the module, not once a command: a
    subprocess's torch import was most of each command's CPU time); tests/cli/ runs it as a real subprocess."""
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def mlp_pt2(tmp_path_factory):
    """The exported MLP the CLI tests read (read only: each test writes its bundle in its own tmp_path)."""
    from helpers import files as model_files

    return model_files.pt2(tmp_path_factory.mktemp("pt2"))


def _export_cli(tmp_path, pt2, *args):
    return _cli(pt2, "-o", tmp_path / "b", *args)


@pytest.mark.parametrize("entry, says", [
    ({"black-list": {"to-add": ["Softmax"]}}, "write SoftmaxV2"),
    ({"white-list": {"to-add": ["NotAnOp"]}}, "'NotAnOp' is not an Ascend IR op type"),
    ({"grey-list": {"to-add": ["Add"]}}, "unknown list 'grey-list'"),
])
def test_a_bad_mixlist_is_refused_before_any_work(tmp_path, mlp_pt2, entry, says):
    mixlist = tmp_path / "mix.json"
    mixlist.write_text(json.dumps(entry))
    out = _export_cli(tmp_path, mlp_pt2, "--precision-mode", "allow_mix_precision", "--modify-mixlist", mixlist)
    assert out.exit_code == 2, out.stderr
    assert "--modify-mixlist" in out.stderr and says in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "b").exists()


def test_mixlist_and_customize_dtypes_are_rendered_emulated_and_validated(tmp_path, mlp_pt2):
    mixlist = tmp_path / "mix.json"
    mixlist.write_text(json.dumps({"black-list": {"to-add": ["Relu"]}}))
    custom = tmp_path / "custom.cfg"
    line = "OpType::MatMulV2:InputDtype:float,float,float,OutputDtype:float"
    custom.write_text(line + "\n")
    out = _export_cli(tmp_path, mlp_pt2, "--precision-mode", "allow_mix_precision", "--soc-version", "Ascend310P3",
                      "--modify-mixlist", mixlist, "--customize-dtypes", custom)
    assert out.exit_code == 0, out.stderr
    atc = tmp_path / "b" / "atc"
    assert json.loads((atc / "modify_mixlist.json").read_text()) == {"black-list": {"to-add": ["Relu"]}}
    assert (atc / "customize_dtypes.cfg").read_text() == line + "\n"
    script = (atc / "convert.sh").read_text()
    assert "--modify_mixlist=atc/modify_mixlist.json" in script
    assert "--customize_dtypes=atc/customize_dtypes.cfg" in script
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    precision = manifest["parity"]["precision"]
    assert "Relu" in precision["mixed_lists"]["black"] and precision["mixed_lists"]["family"] == "ascend310p"
    assert precision["customize_dtypes"][0]["target"] == "OpType::MatMulV2"
    assert str(mixlist) not in json.dumps(manifest)  # the checked content is kept, never the path
    assert _cli("validate", tmp_path / "b").exit_code == 0


def test_customize_dtypes_keeps_the_named_node_in_fp32():
    """A node whose fp16 output overflows: a customize_dtypes float entry keeps it (and its output) fp32."""
    from cann_export.atc.mixlists import lists_for
    from cann_export.validators.precision import Emulator

    graph, feed = gray_chain()
    feed = {"x": feed["x"] * 3000}  # x + b past 65504 after the Mul below
    big = helper.make_node("Mul", ["xb", "xb"], ["sq"], name="square")
    graph.graph.node.insert(5, big)
    graph.graph.node[6].input[0] = "sq"  # side_tanh reads the square
    graph.graph.output[0].name = "y"
    force = lists_for("Ascend310P3")
    plain = Emulator(graph, "force_fp16", lists=force).session(expose=["sq"]).run(feed, ["sq"])[0]
    assert not np.isfinite(plain).all()
    custom = lists_for("Ascend310P3", custom="square::InputDtype:float,float,OutputDtype:float")
    kept = Emulator(graph, "force_fp16", lists=custom).session(expose=["sq"]).run(feed, ["sq"])[0]
    assert np.isfinite(kept).all()
    by_type = lists_for("Ascend310P3", custom="OpType::Mul:InputDtype:float,float,OutputDtype:float")
    assert np.isfinite(Emulator(graph, "force_fp16", lists=by_type).session(expose=["sq"]).run(feed, ["sq"])[0]).all()


def test_a_customize_dtypes_name_the_graph_lacks_is_refused(tmp_path, mlp_pt2):
    custom = tmp_path / "custom.cfg"
    custom.write_text("no_such_node::InputDtype:float,OutputDtype:float\n")
    out = _export_cli(tmp_path, mlp_pt2, "--customize-dtypes", custom)
    assert out.exit_code == 2 and "no_such_node" in out.stderr and "not a node of the written graph" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "b").exists()


def test_customize_dtypes_entries_are_checked():
    from cann_export.atc.customize import parse

    with pytest.raises(ValueError, match="write OpType::SoftmaxV2"):
        parse("OpType::Softmax:InputDtype:float,OutputDtype:float")
    with pytest.raises(ValueError, match="dtype 'fp16'"):
        parse("node::InputDtype:fp16,OutputDtype:float")
    with pytest.raises(ValueError, match="does not parse"):
        parse("node:float")


def test_keep_dtype_under_origin_warns_that_atc_ignores_it(tmp_path, mlp_pt2):
    out = _export_cli(tmp_path, mlp_pt2, "--precision-mode", "must_keep_origin_dtype", "--atc-hint",
                      "keep_dtype=OpType::MatMulV2")
    assert out.exit_code == 0, out.stderr
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert any("ATC ignores it" in w for w in manifest["warnings"]["atc_hints"])


# (model builder, the device run must pass) under every mode that reduces
VERDICT_MODELS = {"bert": (cm.bert, True), "distilbert_classifier": (cm.distilbert_classifier, True),
                  "attention_overflow": (lambda: cm.attention_overflow()[:2], False),
                  "exp_overflow": (lambda: cm.exp_overflow()[:2], False)}


@pytest.fixture(scope="module")
def verdict_graphs(tmp_path_factory):
    """name -> (graph, feed, its fp32 emulation's outputs), each model of VERDICT_MODELS built and exported once for
    the module (the export was nine tenths of each verdict test's time; the modes only change the device run)."""
    from cann_export.validators.precision import emulate, emulation_for, run

    root = tmp_path_factory.mktemp("verdict")
    cache = {}

    def get(name):
        if name not in cache:
            model, inputs = VERDICT_MODELS[name][0]()
            graph = _onnx(model, inputs, root / name)
            feed = _feed(graph, inputs)
            cache[name] = (graph, feed, run(emulate(graph, emulation_for("force_fp32"), set()), [feed]))
        return cache[name]

    return get


@pytest.mark.parametrize("mode, soc, overflow", [
    ("mixed_float16", "Ascend910B1", "inf_nan"), ("mixed_bfloat16", "Ascend910B1", "inf_nan"),
    ("allow_mix_precision", "Ascend910B1", "inf_nan"), ("force_fp16", "Ascend910B1", "inf_nan"),
    ("allow_mix_precision", "Ascend310P3", "saturation")])
@pytest.mark.parametrize("name", sorted(VERDICT_MODELS))
def test_healthy_pass_and_sick_are_caught_under_each_mode(name, mode, soc, overflow, verdict_graphs):
    """0 false alarms on healthy models and the sick ones still caught, under the mixed modes with the lists on
    (Atlas A2's, where the bf16 modes exist, in Inf/NaN mode; Atlas inference's, saturating), as under force_fp16.
    The sick ones overflow fp16's range, which
    bf16 (fp32's exponent) does not: under mixed_bfloat16 they pass, as they would on the device."""
    from cann_export.options import Tolerance
    from cann_export.validators.device_parity_run import device_report
    from cann_export.validators.parity import mixed_lists

    healthy = VERDICT_MODELS[name][1]
    graph, feed, expected = verdict_graphs(name)
    names = [o.name for o in graph.graph.output]
    report = device_report(graph, mode, [], [feed], expected, names, Tolerance().device_policy(), {},
                           overflow=overflow, lists=mixed_lists(mode, soc, None))
    # attention logits past 65504 heal where they saturate (the softmax still picks the largest: as the saturating
    # oracle of tests/test_soc_overflow.py says)
    heals = name == "attention_overflow" and overflow == "saturation"
    assert report["passed"] is (healthy or mode == "mixed_bfloat16" or heals), report["outputs"]


def test_fix_precision_writes_op_types_where_names_could_vanish():
    """A kept set holding every node of a type ATC's fusion may fold away is written as that OpType (the same
    set); a partial one by names, and the choice is reported."""
    from cann_export.atc.precision_cfg import fix_entries

    graph, _ = gray_chain()
    lines, written = fix_entries(["mm", "bias", "side_add", "join"], graph)
    assert lines == ["mm", "OpType::Add"] and written == {"op_types": ["Add"], "names": ["mm"]}
    lines, written = fix_entries(["bias", "softmax"], graph)
    assert lines == ["bias", "softmax"] and written == {"op_types": [], "names": ["bias", "softmax"]}


def test_names_atc_likely_fuses_away_are_found_and_warned():
    """A bias add after a MatMul is fused into it (its name may vanish); the same Add on a graph input is not;
    customize_dtypes and keep_dtype name entries of a fused node warn, with the reason."""
    from cann_export.atc.ascend_ir import likely_fused
    from cann_export.atc.customize import check_names, parse
    from cann_export.atc.precision_cfg import fused_name_warnings

    graph, _ = gray_chain()
    fused = likely_fused(graph)
    assert set(fused) == {"bias"} and "bias add" in fused["bias"]
    warned = check_names(parse("bias::InputDtype:float,float,OutputDtype:float\n"
                               "side_add::InputDtype:float,float,OutputDtype:float"), graph)
    assert len(warned) == 1 and warned[0].startswith("customize_dtypes: bias (Add) is a bias add")
    assert [w.split(" is ")[0] for w in fused_name_warnings(["bias", "side_add", "mm"], graph)] == ["keep_dtype: bias"]


def test_what_atc_ignores_or_the_emulation_approximates_is_a_warning(tmp_path):
    from cann_export.atc.hints import resolve
    from cann_export.options import ExportOptions

    def warnings(**kw):
        return " | ".join(resolve(ExportOptions(**kw)))

    assert "HiFloat8's 8-bit rounding is not emulated" in warnings(atc_hints={"precision_mode_v2": "mixed_hif8"})
    assert "Atlas A2/A3" in warnings(precision_mode="allow_mix_precision_bf16", soc_version="Ascend310P3")
    assert "Atlas A2/A3" not in warnings(precision_mode="allow_mix_precision_bf16", soc_version="Ascend910B1")
    edits = {"modify_mixlist": {"black-list": {"to-add": ["Exp"]}}}
    assert "modify_mixlist has no effect under precision mode force_fp16" in warnings(atc_hints=dict(edits))
    assert warnings(atc_hints=dict(edits), precision_mode="allow_mix_precision") == ""
    mixlist = tmp_path / "m.json"
    mixlist.write_text(json.dumps(edits["modify_mixlist"]))
    opts = ExportOptions(modify_mixlist=str(mixlist), precision_mode="allow_mix_precision")
    resolve(opts)
    assert opts.atc_hints["modify_mixlist"] == edits["modify_mixlist"] and opts.modify_mixlist is None
