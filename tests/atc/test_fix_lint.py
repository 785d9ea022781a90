"""--fix-lint (atc/lint_fixes.py): each fixable per-op trap, triggered by a real model, is fixed in the written graph;
the fixed graph runs in onnxruntime and matches eager, the trap is gone from the lint (and from validate's re-run of
it), parity judged the fixed graph; a graph with nothing to fix is written byte for byte as without the flag."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from helpers.calibration_models import efficientnet
from helpers.toy_models import make_mlp
from torch import nn

import cann_export
from cann_export import errors
from cann_export.cli.main import cli


class EmptyCacheConcat(nn.Module):
    """A cache sliced past its end (a past of length 0) joined to the new tokens: TorchScript's graph keeps the
    empty Slice feeding Concat."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x, cache):
        return self.proj(torch.cat([cache[:, 8:], x], dim=1))


class WidePool(nn.Module):
    """A global average over a 8 x 300 map written as AvgPool2d: kernel 300 > 255."""

    def forward(self, x):
        return F.avg_pool2d(torch.relu(x), (8, 300)) * 2


class ReflectPad5d(nn.Module):
    """A reflect pad of the last two axes of a rank-5 tensor (ATC's reflect kernel takes rank <= 4)."""

    def forward(self, x):
        return F.pad(x.reshape(1, 2, 3, 4, 6), (1, 2, 2, 1, 0, 0), mode="reflect") * 3


def findings(result, rule):
    return [f for f in result.manifest["lint"]["atc-lint"]["findings"] if f["rule"] == rule]


def eager_vs_graph(model, path, inputs, names):
    """The fixed graph in onnxruntime against the module in eager mode, on fresh random inputs."""
    torch.manual_seed(1)
    fresh = tuple(torch.randn_like(t) for t in inputs)
    with torch.no_grad():
        expected = model(*fresh).numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    (got,) = session.run(None, {n: t.numpy() for n, t in zip(names, fresh, strict=True) if n in wanted})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def ops(path):
    return [n.op_type for n in onnx.load(str(path)).graph.node]


def test_an_empty_slice_feeding_concat_is_dropped(tmp_path):
    model, inputs = EmptyCacheConcat().eval(), (torch.randn(2, 5, 4), torch.randn(2, 8, 4))
    with pytest.raises(errors.LintError, match="empty-slice|empty tensor"):  # the trap fails the export unfixed
        cann_export.export(model, tmp_path / "plain", example_inputs=inputs, exporter="torchscript")
    result = cann_export.export(model, tmp_path / "b", example_inputs=inputs, exporter="torchscript", fix_lint=True)
    assert result.ok and result.parity["passed"] and result.parity["device"]["passed"]
    (fix,) = result.manifest["lint"]["atc-lint"]["fixes"]
    assert fix["rule"] == "empty-slice-concat" and fix["before"]["op"] == "Concat"
    assert len(fix["after"]["inputs"]) == len(fix["before"]["inputs"]) - 1 and fix["after"]["removed"]
    assert not findings(result, "empty-slice-concat") and result.manifest["lint"]["atc-lint"]["passed"]
    assert "Slice" not in ops(tmp_path / "b" / "model.onnx")
    eager_vs_graph(model, tmp_path / "b" / "model.onnx", inputs, ["x", "cache"])
    assert cann_export.validate(tmp_path / "b")["passed"] is True  # the re-derived lint agrees with the record


@pytest.mark.parametrize("case", ["wide_pool", "efficientnet"])
def test_a_whole_input_avgpool_becomes_global(tmp_path, case):
    if case == "wide_pool":
        model, inputs = WidePool().eval(), (torch.randn(1, 3, 8, 300),)
    else:  # transformers' pooler: AvgPool2d(hidden_dim=320, ceil_mode=True) over a 2 x 2 map
        classifier, images = efficientnet()
        model, inputs = Logits(classifier).eval(), (images["pixel_values"],)
    plain = cann_export.export(model, tmp_path / "plain", example_inputs=inputs, num_random_inputs=1)
    assert findings(plain, "avgpool-ksize")
    result = cann_export.export(model, tmp_path / "b", example_inputs=inputs, num_random_inputs=1, fix_lint=True)
    assert result.ok and result.parity["passed"] and result.parity["device"]["passed"]
    (fix,) = result.manifest["lint"]["atc-lint"]["fixes"]
    assert fix["rule"] == "avgpool-ksize" and fix["after"] == {"op": "GlobalAveragePool"}
    assert max(fix["before"]["kernel_shape"]) > 255
    assert not findings(result, "avgpool-ksize")
    graph_ops = ops(tmp_path / "b" / "model.onnx")
    assert "AveragePool" not in graph_ops and "GlobalAveragePool" in graph_ops
    names = [i["name"] for i in result.manifest["model"]["inputs"]]
    eager_vs_graph(model, tmp_path / "b" / "model.onnx", inputs, names)
    assert cann_export.validate(tmp_path / "b")["passed"] is True


class Logits(nn.Module):
    """A Hugging Face classifier's logits as the one output."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values).logits


def test_a_rank5_reflect_pad_is_padded_at_rank4(tmp_path):
    model, inputs = ReflectPad5d().eval(), (torch.randn(2, 3, 4, 6),)
    with pytest.raises(errors.LintError, match="rank-5"):
        cann_export.export(model, tmp_path / "plain", example_inputs=inputs)
    result = cann_export.export(model, tmp_path / "b", example_inputs=inputs, fix_lint=True)
    assert result.ok and result.parity["passed"]
    (fix,) = result.manifest["lint"]["atc-lint"]["fixes"]
    assert fix["rule"] == "reflect-pad" and len(fix["after"]["pad_input_shape"]) == 4
    assert not findings(result, "reflect-pad")
    graph = onnx.load(str(tmp_path / "b" / "model.onnx"))
    onnx.checker.check_model(graph, full_check=True)
    eager_vs_graph(model, tmp_path / "b" / "model.onnx", inputs, ["x"])
    assert cann_export.validate(tmp_path / "b")["passed"] is True


class TopK(nn.Module):
    def forward(self, x):
        return torch.topk(x * 2, 3, dim=-1).values


def written(bundle):
    """The graph's bytes and its metadata but the export's time."""
    graph = onnx.load(str(bundle / "model.onnx"))
    stamped = {p.key: p.value for p in graph.metadata_props if p.key != "cann_export.created_utc"}
    return graph.graph.SerializeToString(), stamped


def test_nothing_to_fix_leaves_the_graph_byte_for_byte(tmp_path):
    for k, (model, inputs) in enumerate([(make_mlp(), (torch.randn(2, 12),)), (TopK(), (torch.randn(2, 16),))]):
        plain = cann_export.export(model, tmp_path / f"plain{k}", example_inputs=inputs, num_random_inputs=1)
        fixed = cann_export.export(model, tmp_path / f"fixed{k}", example_inputs=inputs, num_random_inputs=1,
                                   fix_lint=True)
        assert plain.ok and fixed.ok
        assert written(tmp_path / f"plain{k}") == written(tmp_path / f"fixed{k}")
        assert "fixes" not in fixed.manifest["lint"]["atc-lint"]
    (left,) = fixed.manifest["lint"]["atc-lint"]["not_fixed"]  # TopK's cast is not a graph onnxruntime runs
    assert left["rule"] == "topk-int64" and "int64 K only" in left["reason"]
    assert findings(fixed, "topk-int64")


def test_the_cli_flag_prints_each_fix(tmp_path):
    path = tmp_path / "pool.pt2"
    torch.export.save(torch.export.export(WidePool().eval(), (torch.randn(1, 3, 8, 300),)), str(path))
    run = CliRunner().invoke(cli, [str(path), "-o", str(tmp_path / "b"), "--fix-lint"],
                             catch_exceptions=False)
    assert run.exit_code == 0, run.output
    assert "--fix-lint: avgpool-ksize" in run.output and "AveragePool -> GlobalAveragePool" in run.output
