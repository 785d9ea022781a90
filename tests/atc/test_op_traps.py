"""ATC's per-op traps in the lint (atc/op_traps.py): each finding names the ATC error code it predicts, the PyTorch
module and source line, and the fix; errors our options can cause carry ATC's code (E10016, E10001); the healthy
models the lint tests use stay clean."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers.toy_models import ConvBnDropout, TwoInputs, make_mlp
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import cann_export
from cann_export import errors
from cann_export.atc import lint as atc_lint
from cann_export.graph.module_paths import KEY

TRAP_RULES = {"topk-int64", "empty-slice-concat", "avgpool-ksize", "conv1d-transdata", "reflect-pad",
              "int64-shape-subgraph", "parser-attribute", "input-name"}


def model_of(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def i64(name, values):
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def stamped(node, module="blocks.3.head"):
    node.metadata_props.add(key=KEY, value=module)
    return node


def by_rule(report, rule):
    return [f for f in report["findings"] if f["rule"] == rule]


def test_topk_int64_names_ezcode_module_and_msit_fix():
    node = stamped(helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk", axis=-1))
    report = atc_lint.lint_model(model_of([node], [f32("x", [2, 16])],
                                          [f32("v", [2, 3]), helper.make_tensor_value_info("i", TensorProto.INT64,
                                                                                           [2, 3])],
                                          [i64("k", [3])]))
    (finding,) = by_rule(report, "topk-int64")
    assert finding["severity"] == "warning" and finding["atc_code"] == "EZ3002"
    assert finding["module"] == "blocks.3.head" and "module blocks.3.head (TopK)" in finding["message"]
    assert "KnowledgeTopkFix" in finding["message"] and "int32" in finding["message"]
    assert report["passed"]  # a warning: ATC may convert it


def test_empty_slice_feeding_concat_is_an_error_and_a_full_slice_is_not():
    def graph(end):
        nodes = [helper.make_node("Slice", ["x", "s", "e", "a"], ["part"], name="slice"),
                 helper.make_node("Concat", ["part", "x"], ["y"], name="cat", axis=1)]
        return model_of(nodes, [f32("x", [2, 4])], [f32("y", [2, None])],
                        [i64("s", [0]), i64("e", [end]), i64("a", [1])])

    report = atc_lint.lint_model(graph(0))
    (finding,) = by_rule(report, "empty-slice-concat")
    assert finding["severity"] == "error" and finding["atc_code"] == "EZ9999" and not report["passed"]
    assert "'cat'" in finding["message"] and "torch.cat" in finding["message"]
    assert not by_rule(atc_lint.lint_model(graph(2)), "empty-slice-concat")


@pytest.mark.parametrize("kernel, expected", [([256, 1], 1), ([255, 255], 0)])
def test_avgpool_kernel_over_255(kernel, expected):
    node = helper.make_node("AveragePool", ["x"], ["y"], name="pool", kernel_shape=kernel)
    report = atc_lint.lint_model(model_of([node], [f32("x", [1, 2, 300, 300])], [f32("y", None)]))
    found = by_rule(report, "avgpool-ksize")
    assert len(found) == expected
    if found:
        assert found[0]["atc_code"] == "EZ3002" and "AdaptiveAvgPool2d" in found[0]["message"]
        assert found[0]["severity"] == "warning" and report["passed"]  # predicted, so it does not stop the export


def test_parser_rejected_attributes_are_errors_with_their_code():
    nodes = [helper.make_node("Pad", ["x", "p"], ["y"], name="wrap_pad", mode="wrap"),
             helper.make_node("ReduceMean", ["y"], ["z"], name="mean", noop_with_empty_axes=1)]
    report = atc_lint.lint_model(model_of(nodes, [f32("x", [1, 2, 4, 4])], [f32("z", None)],
                                          [i64("p", [0, 0, 1, 1, 0, 0, 1, 1])], opset=19))
    found = by_rule(report, "parser-attribute")
    assert {f["node"] for f in found} == {"wrap_pad", "mean"}
    assert all(f["severity"] == "error" and f["atc_code"] == "E19999" for f in found)
    assert "mode='wrap'" in found[0]["message"] or "mode='wrap'" in found[1]["message"]


@pytest.mark.parametrize("pads, rank, expected", [
    ([0, 0, 0, 1, 0, 0, 0, 1], 4, None),            # the last axis only: the AI Core kernel
    ([0, 1, 0, 0, 0, 1, 0, 0], 4, "warning"),       # the channel axis: AI CPU
    ([0] * 4 + [1] + [0] * 4 + [1], 5, "error"),    # rank 5: refused
])
def test_reflect_pad(pads, rank, expected):
    shape = [1, 4, 6, 6, 6][:rank]
    node = helper.make_node("Pad", ["x", "p"], ["y"], name="pad", mode="reflect")
    report = atc_lint.lint_model(model_of([node], [f32("x", shape)], [f32("y", None)], [i64("p", pads)]))
    found = by_rule(report, "reflect-pad")
    assert [f["severity"] for f in found] == ([expected] if expected else [])
    if expected == "error":
        assert found[0]["atc_code"] == "EZ3002"


def test_long_int64_shape_subgraph_is_noted_and_a_short_one_is_not():
    def graph(steps):
        nodes = [helper.make_node("Shape", ["x"], ["s0"], name="shape")]
        for k in range(steps):
            nodes.append(helper.make_node("Add", [f"s{k}", "one"], [f"s{k + 1}"], name=f"add{k}"))
        nodes.append(helper.make_node("Reshape", ["x", f"s{steps}"], ["y"], name="reshape"))
        return model_of(nodes, [f32("x", ["n", 4])], [f32("y", None)], [i64("one", [0, 0])])

    long_report = atc_lint.lint_model(graph(12), hints={"input_shape_range": "x:[1~8,4]"})
    (finding,) = by_rule(long_report, "int64-shape-subgraph")
    assert finding["severity"] == "info" and "atc_code" not in finding and "static shapes" in finding["message"]
    assert not by_rule(atc_lint.lint_model(graph(3), hints={"input_shape_range": "x:[1~8,4]"}),
                       "int64-shape-subgraph")


def test_input_shape_naming_an_input_the_graph_lacks_is_e10016(tmp_path):
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    report = atc_lint.lint_model(model_of([node], [f32("x", [1, 4])], [f32("y", [1, 4])]),
                                 hints={"input_shape": "images:1,4"})
    (finding,) = by_rule(report, "input-name")
    assert finding["atc_code"] == "E10016" and "'images'" in finding["message"] and "x" in finding["message"]
    with pytest.raises(errors.LintError, match="E10016"):
        cann_export.export(make_mlp(), tmp_path / "m", example_inputs=(torch.randn(2, 12),),
                           atc_hints={"input_shape": "images:2,12"})
    assert not (tmp_path / "m").exists()


def test_a_bad_option_value_names_e10001(tmp_path):
    with pytest.raises(errors.OptionsError, match="E10001"):
        cann_export.export(make_mlp(), tmp_path / "m", example_inputs=(torch.randn(2, 12),),
                           atc_hints={"op_select_implmode": "fastest"})
    with pytest.raises(errors.OptionsError, match="E10001"):
        cann_export.export(make_mlp(), tmp_path / "m", example_inputs=(torch.randn(2, 12),),
                           precision_mode="fp8_please")
    assert not (tmp_path / "m").exists()


def test_e19010_findings_carry_their_code():
    node = helper.make_node("Mish", ["x"], ["y"], name="mish")
    (finding,) = by_rule(atc_lint.lint_model(model_of([node], [f32("x", [1, 4])], [f32("y", [1, 4])], opset=18)),
                         "unsupported-op")
    assert finding["atc_code"] == "E19010"


class Traps(nn.Module):
    """A reflect pad of a rank-5 tensor, a Conv1d and a topk: what a real export's findings point at."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(6, 4, 3, padding=1)

    def forward(self, x):
        padded = F.pad(x.reshape(1, 1, 2, 4, 16), (1, 1, 1, 1, 0, 0), mode="reflect")
        y = self.conv(padded.reshape(2, 6, 18))
        return torch.topk(y, 3, dim=-1)


def test_an_export_names_the_module_and_source_line_of_each_trap(tmp_path):
    result = cann_export.export(Traps(), tmp_path / "t", example_inputs=(torch.randn(2, 4, 16),), lint="warn")
    findings = {f["rule"]: f for f in result.manifest["lint"]["atc-lint"]["findings"]}
    assert {"topk-int64", "conv1d-transdata", "reflect-pad"} <= set(findings)
    assert findings["conv1d-transdata"]["module"] == "conv" and findings["reflect-pad"]["severity"] == "error"
    for rule in ("topk-int64", "conv1d-transdata", "reflect-pad"):
        assert findings[rule]["source"].startswith(__file__), findings[rule]
        assert f"at {findings[rule]['source']}" in findings[rule]["message"]
    rerun = cann_export.validate(tmp_path / "t")  # validate re-derives the lint: the traps agree
    assert rerun["passed"] is True, rerun


def test_the_healthy_lint_models_raise_no_trap(tmp_path):
    torch.manual_seed(0)
    cases = [(ConvBnDropout(), (torch.randn(1, 3, 16, 16),), {}),
             (make_mlp(), (torch.randn(2, 12),), {}),
             (TwoInputs(), {"input_ids": torch.randint(0, 50, (2, 7)), "features": torch.randn(2, 7, 16)},
              {"dynamic": {"input_ids": {0: "batch"}, "features": {0: "batch"}}})]
    for k, (model, inputs, extra) in enumerate(cases):
        result = cann_export.export(model, tmp_path / f"m{k}", example_inputs=inputs, **extra)
        found = [f for f in result.manifest["lint"]["atc-lint"]["findings"] if f["rule"] in TRAP_RULES]
        assert found == [], (type(model).__name__, found)
