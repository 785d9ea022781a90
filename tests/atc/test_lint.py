"""The ATC lint: opset per CANN release, the packaged op table, inputs, quantized graphs, and `cann-export lint`."""
import json

import onnx
import pytest
import torch
from click.testing import CliRunner
from helpers.qdq_graphs import conv_model
from helpers.toy_models import ConvBnDropout, TwoInputs, make_mlp
from onnx import TensorProto, helper
from torch import nn

import cann_export
from cann_export import errors
from cann_export.atc import lint as atc_lint
from cann_export.graph.module_paths import KEY
from cann_export.cli.main import _register_plugin_commands, cli


class MishHead(nn.Module):
    """nn.Mish exports to the ONNX op Mish, which ATC has no parser for."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.block = nn.Sequential(nn.Linear(8, 8), nn.Mish())

    def forward(self, x):
        return self.block(self.fc(x))


class Uint8Image(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, image):
        return self.conv(image.float() / 255.0)


@pytest.fixture(scope="module")
def lint_cli():
    _register_plugin_commands()
    assert "lint" in cli.commands

    def run(*args):
        result = CliRunner().invoke(cli, ["lint", *map(str, args)], catch_exceptions=False)
        return result

    return run


def graph_model(nodes, inputs, outputs, opset=18, extra_opsets=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    imports = [helper.make_opsetid("", opset), *[helper.make_opsetid(d, 1) for d in extra_opsets]]
    return helper.make_model(graph, opset_imports=imports)


def stamp(node, module):
    node.metadata_props.add(key=KEY, value=module)
    return node


def f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def errors_of(report, rule=None):
    return [f for f in report["findings"] if f["severity"] == "error" and (rule is None or f["rule"] == rule)]


# --- the packaged table -------------------------------------------------------------------------------

def test_table_is_packaged_with_its_source():
    table = atc_lint.load_table()
    assert table["source"].startswith("https://www.hiascend.com/") and table["cann_version"] == "8.0.0"
    ops = table["ops"]
    assert len(ops) == 160
    for op in ("Conv", "Gemm", "MatMul", "Softmax", "LayerNormalization", "Erf", "ArgMax", "CumSum", "LogSoftmax"):
        assert op in ops, op
    for op in ("Mish", "Col2Im", "QuantizeLinear", "DequantizeLinear", "Argmax"):
        assert op not in ops, op


@pytest.mark.parametrize("text,expected", [("8.0", (8, 0)), ("7.0.RC1", (7, 0)), ("6.3.RC2", (6, 3)),
                                           ("8.0.0", (8, 0)), ("5.1.RC2.alpha001", (5, 1)), ("eight", None),
                                           ("8", None)])
def test_parse_cann_version(text, expected):
    assert atc_lint.parse_cann_version(text) == expected


@pytest.mark.parametrize("version,rng", [((5, 1), (9, 13)), ((6, 3), (9, 13)), ((7, 0), (9, 18)), ((8, 0), (9, 18))])
def test_opset_range_per_release(version, rng):
    assert atc_lint.opset_range(version) == rng


# --- through export() ---------------------------------------------------------------------------------

def test_clean_models_pass_and_bundle_lints_clean(tmp_path, lint_cli):
    torch.manual_seed(0)
    result = cann_export.export(ConvBnDropout(), tmp_path / "cnn", example_inputs=(torch.randn(1, 3, 16, 16),))
    assert result.ok
    out = lint_cli(tmp_path / "cnn", "--json")
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert report["ok"] and report["passed"] and report["findings"] == []
    assert report["table"]["cann_version"] == "8.0.0" and report["cann_version"] == "8.0"

    feeds = {"input_ids": torch.randint(0, 50, (2, 7)), "features": torch.randn(2, 7, 16)}
    cann_export.export(TwoInputs(), tmp_path / "two", example_inputs=feeds)
    out = lint_cli(tmp_path / "two")
    assert out.exit_code == 0, out.output
    assert "input-dtype" not in out.stdout and "passed" in out.stdout  # int64 token ids: what ATC takes there


def test_export_with_an_op_atc_lacks_fails_naming_the_module(tmp_path):
    out = tmp_path / "mish"
    with pytest.raises(errors.LintError) as err:  # Mish exists from opset 18 (at 17 torch spells it out)
        cann_export.export(MishHead(), out, example_inputs=(torch.randn(2, 8),), opset=18)
    text = str(err.value)
    assert "ATC has no parser for ONNX op Mish (E19010 at conversion)" in text
    assert "module block.1 (Mish)" in text and "lint='warn'" in text  # the API's spelling
    assert not out.exists()

    result = cann_export.export(MishHead(), out, example_inputs=(torch.randn(2, 8),), lint="warn", opset=18)
    assert result.ok and (out / "model.onnx").is_file()


def _validate(path):
    return CliRunner().invoke(cli, ["validate", str(path)], catch_exceptions=False)


def _tamper_lint(path, change):
    """Edit the manifest's lint record as an attacker would: the file table re-hashed to hide the edit."""
    from cann_export.fs import digests

    manifest = json.loads((path / "manifest.json").read_text())
    change(manifest["lint"]["atc-lint"])
    manifest["files"] = digests.file_table(path)
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_validate_re_derives_the_recorded_lint(tmp_path):
    """The lint a bundle records is run again on its graph: hiding an error, inventing a finding or dropping a
    warning is a difference (exit 2, named); an untouched bundle, failed lint included (--lint warn), validates."""
    import shutil

    failing = tmp_path / "mish"
    assert cann_export.export(MishHead(), failing, example_inputs=(torch.randn(2, 8),), lint="warn", opset=18).ok
    assert _validate(failing).exit_code == 0
    hidden = tmp_path / "hidden"
    shutil.copytree(failing, hidden)
    _tamper_lint(hidden, lambda r: r.update(passed=True, findings=[]))
    result = _validate(hidden)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "lint.atc-lint.passed: the manifest says true, the lint re-run on the graph fails" in result.stderr
    assert "the manifest lacks [\"error unsupported-op at" in result.stderr

    feeds = {"input_ids": torch.randint(0, 50, (2, 7)), "features": torch.randn(2, 7, 16)}
    clean = tmp_path / "two"
    assert cann_export.export(TwoInputs(), clean, example_inputs=feeds).ok
    invented = {"severity": "warning", "rule": "input-dtype", "node": "made_up", "module": None, "op_type": None,
                "message": "input 'input_ids' is int64"}
    _tamper_lint(clean, lambda r: r["findings"].append(invented))
    result = _validate(clean)
    assert result.exit_code == 2 and "which the lint re-run on the graph does not find" in result.stderr

    unlinted = tmp_path / "off"  # --lint off records no lint: nothing claimed, nothing to contradict
    assert cann_export.export(MishHead(), unlinted, example_inputs=(torch.randn(2, 8),), lint="off", opset=18).ok
    assert _validate(unlinted).exit_code == 0


def test_onnx_format_is_not_linted(tmp_path):
    result = cann_export.export(MishHead(), tmp_path / "m.onnx", "onnx", example_inputs=(torch.randn(2, 8),))
    assert result.ok


def test_opset_against_cann_release(tmp_path):
    with pytest.raises(errors.LintError) as err:
        cann_export.export(make_mlp(), tmp_path / "old", example_inputs=torch.randn(3, 12), cann_version="6.3")
    assert "parses opset 9..13" in str(err.value) and "CANN 6.3" in str(err.value)
    assert cann_export.export(make_mlp(), tmp_path / "new", example_inputs=torch.randn(3, 12),
                              cann_version="7.0.RC1").ok

    relu = [helper.make_node("Relu", ["x"], ["y"], name="r")]
    for opset, version, ok in ((17, "6.3", False), (13, "6.3.RC2", True), (17, "8.0", True), (8, "8.0", False)):
        report = atc_lint.lint_model(graph_model(relu, [f32("x", [1, 4])], [f32("y", [1, 4])], opset=opset), version)
        assert report["passed"] is ok, (opset, version, report["findings"])
        assert bool(errors_of(report, "opset")) is not ok


def test_uint8_input_needs_aipp(tmp_path, lint_cli):
    image = torch.randint(0, 256, (1, 3, 8, 8), dtype=torch.uint8)
    with pytest.raises(errors.LintError, match="input 'image' is uint8"):
        cann_export.export(Uint8Image(), tmp_path / "plain", example_inputs=(image,))
    aipp = {"input_format": "RGB888_U8", "src_image_size_w": 8, "src_image_size_h": 8}
    result = cann_export.export(Uint8Image(), tmp_path / "aipp", example_inputs=(image,), atc_hints={"aipp": aipp})
    assert result.ok
    # the bundle's manifest carries the aipp hint, so the CLI lints it clean too
    assert lint_cli(tmp_path / "aipp").exit_code == 0


# --- hand-made graphs through `cann-export lint` ------------------------------------------------------

def test_unknown_and_custom_domain_ops_are_reported_with_node_and_module(tmp_path, lint_cli):
    nodes = [stamp(helper.make_node("Relu", ["x"], ["a"], name="relu0"), "stem.act"),
             stamp(helper.make_node("Col2Im", ["a", "shape", "block"], ["b"], name="fold0"), "decoder.fold"),
             stamp(helper.make_node("FancyNorm", ["b"], ["y"], name="fancy0", domain="com.example"), "head.norm")]
    inits = [helper.make_tensor("shape", TensorProto.INT64, [2], [4, 4]),
             helper.make_tensor("block", TensorProto.INT64, [2], [2, 2])]
    model = graph_model(nodes, [f32("x", [1, 12, 9])], [f32("y", [1, 3, 4, 4])], extra_opsets=("com.example",))
    model.graph.initializer.extend(inits)
    path = tmp_path / "hand.onnx"
    onnx.save(model, str(path))

    out = lint_cli(path, "--json")
    assert out.exit_code == 1, out.output
    report = json.loads(out.stdout)
    assert not report["ok"] and not report["passed"]
    by_node = {f["node"]: f for f in report["findings"]}
    assert set(by_node) == {"fold0", "fancy0"}
    fold, fancy = by_node["fold0"], by_node["fancy0"]
    assert fold["rule"] == "unsupported-op" and fold["module"] == "decoder.fold" and fold["op_type"] == "Col2Im"
    assert "ATC has no parser for ONNX op Col2Im (E19010 at conversion)" in fold["message"]
    assert "module decoder.fold" in fold["message"] and "'fold0'" in fold["message"]
    assert fancy["rule"] == "custom-domain" and fancy["severity"] == "error" and fancy["module"] == "head.norm"
    assert "com.example" in fancy["message"] and "module head.norm" in fancy["message"]

    text = lint_cli(path)
    assert text.exit_code == 1
    assert "error: [unsupported-op] module decoder.fold (Col2Im), node 'fold0'" in text.stdout
    assert "FAILED" in text.stdout


def test_dynamic_dims_need_a_profile_hint(tmp_path, lint_cli):
    torch.manual_seed(0)
    cann_export.export(ConvBnDropout(), tmp_path / "b", example_inputs=(torch.randn(1, 3, 16, 16),))
    model = onnx.load(str(tmp_path / "b" / "model.onnx"))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[0].dim_param = "batch"
    path = tmp_path / "dyn_batch.onnx"
    onnx.save(model, str(path))

    out = lint_cli(path, "--json")
    assert out.exit_code == 1
    (finding,) = json.loads(out.stdout)["findings"]
    assert finding["rule"] == "dynamic-shape" and "dynamic dimension 0 (batch)" in finding["message"]
    assert lint_cli(path, "--atc-hint", "dynamic_batch_size=1,2,4").exit_code == 0
    assert lint_cli(path, "--atc-hint", "input_shape=x:1,3,16,16").exit_code == 0

    dims[2].dim_value = -1  # now H is dynamic too: a batch profile does not cover it, an image profile does not cover N
    onnx.save(model, str(path))
    assert lint_cli(path, "--atc-hint", "dynamic_batch_size=1,2,4").exit_code == 1
    assert lint_cli(path, "--atc-hint", "dynamic_image_size=16,16;32,32").exit_code == 1
    assert lint_cli(path, "--atc-hint", "dynamic_dims=1,16;2,32").exit_code == 1  # ATC: dynamic_dims needs ND
    assert lint_cli(path, "--atc-hint", "dynamic_dims=1,16;2,32", "--atc-hint", "input_format=ND").exit_code == 0
    assert lint_cli(path, "--atc-hint", "input_shape_range=x:[1~4],3,[16~32],16").exit_code == 0


def test_zero_dim_input_is_an_error():
    model = graph_model([helper.make_node("Relu", ["x"], ["y"], name="r")], [f32("x", [0, 4])], [f32("y", [0, 4])])
    report = atc_lint.lint_model(model, "8.0", {"dynamic_dims": "1;2"})
    (finding,) = errors_of(report, "zero-dim")
    assert finding["rule"] == "zero-dim" and "dimension 0 equal to 0" in finding["message"]


def test_uint8_and_other_dtypes_on_hand_graph():
    x = helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 3, 4, 4])
    cast = [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT, name="c")]
    model = graph_model(cast, [x], [f32("y", [1, 3, 4, 4])])
    assert errors_of(atc_lint.lint_model(model, "8.0"), "input-dtype")
    assert atc_lint.lint_model(model, "8.0", {"aipp": [{"input_format": "RGB888_U8"}]})["passed"]
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    (finding,) = errors_of(atc_lint.lint_model(model, "8.0", {"aipp": [{}]}))
    assert "double" in finding["message"]
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.INT32
    report = atc_lint.lint_model(model, "8.0")
    assert report["passed"] and [f["rule"] for f in report["findings"]] == ["input-dtype"]


def quantized_model():
    return conv_model()[0]  # int8 Q/DQ on a Conv's activation and weight: the form AMCT adapts


def test_quantized_graph_warnings():
    plain = atc_lint.lint_model(quantized_model(), "8.0", {}, "force_fp16")
    assert plain["passed"]  # Q/DQ graphs AMCT adapts are exportable: one line says AMCT runs before atc
    assert [(f["rule"], f["severity"]) for f in plain["findings"]] == [("qdq-amct", "info")]
    assert "convert_qat_model" in plain["findings"][0]["message"]

    report = atc_lint.lint_model(quantized_model(), "8.0", {"dynamic_batch_size": "1,2"}, "force_fp32")
    warnings = {f["rule"]: f for f in report["findings"] if f["severity"] == "warning"}
    assert set(warnings) == {"quant-dynamic-shape", "quant-precision-mode"}
    assert "force_fp32" in warnings["quant-precision-mode"]["message"]
    report = atc_lint.lint_model(quantized_model(), "8.0", {"precision_mode_v2": "origin"}, "force_fp16")
    assert {f["rule"] for f in report["findings"] if f["severity"] == "warning"} == {"quant-precision-mode"}


def test_lint_applies_amcts_rules_to_qdq():
    model = quantized_model()
    zp = next(t for t in model.graph.initializer if t.name == "act_zp")
    zp.CopyFrom(helper.make_tensor("act_zp", TensorProto.UINT8, [], [128]))  # a uint8 activation: AMCT refuses
    report = atc_lint.lint_model(model, "8.0", {}, "force_fp16", {"conv_node": "features.conv"})
    assert not report["passed"]
    (finding,) = errors_of(report)
    assert finding["rule"] == "amct-int8" and finding["module"] == "features.conv" and "uint8" in finding["message"]


def test_unreadable_input_is_one_line_exit_2(tmp_path, lint_cli):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00not a model")
    out = lint_cli(bad)
    assert out.exit_code == 2
    assert out.stderr.strip().startswith(f"error: [lint] ({bad}) not a readable ONNX model")
    assert "Traceback" not in out.output and len(out.stderr.strip().splitlines()) == 1

    out = lint_cli(tmp_path / "missing", "--json")
    assert out.exit_code == 2 and json.loads(out.stdout)["error"]["stage"] == "lint"
    (tmp_path / "dir").mkdir()
    assert lint_cli(tmp_path / "dir").exit_code == 2
    assert lint_cli(bad, "--cann-version", "eight").exit_code == 2


def test_a_lint_record_from_another_op_table_is_named_not_re_derived(tmp_path):
    """The lint is re-derived with the op table this release packages: a record naming another is a difference
    (edited or written by another release), never judged against the wrong table."""
    out = tmp_path / "m"
    assert cann_export.export(make_mlp(), out, example_inputs=(torch.randn(2, 12),)).ok
    _tamper_lint(out, lambda r: r["table"].update(cann_version="7.0.0"))
    result = _validate(out)
    assert result.exit_code == 2 and "lint.atc-lint.table: the lint was recorded with op table" in result.stderr
