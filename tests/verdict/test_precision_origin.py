"""The origin of a device-precision divergence, with simplification on (the default): the first node whose
fp16 result is wrong while its inputs are right, past values wrong by design that heal downstream (mask
fills), named as PyTorch module and source line. Ground truth: real fp16 in torch (helpers/fp16_origin)."""
import inspect
import json

import numpy as np
import onnx
import pytest
from helpers import origin_models as om
from helpers.fp16_origin import first_wrong_module

import cann_export
from cann_export.options import Tolerance
from cann_export.validators.fix_precision import device_report
from cann_export.validators.precision import emulate, emulation_for, run


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    model, inputs, module = om.qwen2_residual_growth()
    out = tmp_path_factory.mktemp("qwen2") / "b"
    return model, inputs, module, cann_export.export(model, out, example_inputs=inputs, num_random_inputs=1), out


def test_qwen2_residual_growth_is_named_at_its_layer0_mlp_not_at_the_mask_fill(qwen2):
    model, inputs, module, result, _ = qwen2
    truth = first_wrong_module(model, inputs)  # real fp16: the down projection's output is inf
    assert truth == "layers.0.mlp.down_proj"
    first = result.parity["first_divergence"]
    assert not result.ok and result.parity["graph_fp32_passed"]
    assert first["module"] == truth and first["overflow"] and first["op_type"] == "MatMul", first
    assert first["source"].startswith("transformers/models/qwen2/modeling_qwen2.py:"), first
    assert first["message"].startswith(f"first divergence: {truth} (MatMul) at {first['source']}")


def test_the_mask_fill_is_skipped_because_it_heals(qwen2):
    """The causal + padding fill holds float32 min: -inf in fp16, wrong by design; the softmax heals it."""
    _, inputs, _, result, out = qwen2
    healed = result.parity["first_divergence"]["skipped_healed"]
    graph = onnx.load(str(out / "model.onnx"))
    producers = {o: n.op_type for n in graph.graph.node for o in n.output}
    assert healed and producers[healed[0]] == "Where", healed
    assert inputs["attention_mask"].min() == 0  # there is a padded row to fill
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["parity"]["first_divergence"]["module"] == "layers.0.mlp.down_proj"


def test_rmsnorm_without_upcast_is_named_at_layer0s_first_norm(tmp_path):
    """Every RMSNorm's x.pow(2) is inf in fp16; the dead branches hide behind the residual, and only the final
    norm's zeros fail the output: the origin is still layer 0's first norm."""
    model, inputs, module = om.rms_decoder()
    assert first_wrong_module(model, inputs) == module
    result = cann_export.export(model, tmp_path / "b", example_inputs=inputs, num_random_inputs=1)
    first = result.parity["first_divergence"]
    assert first["module"] == module and first["op_type"] == "Pow" and first["overflow"], first
    lines, start = inspect.getsourcelines(om.NaiveRMSNorm.forward)
    line = start + next(k for k, text in enumerate(lines) if "return" in text)
    assert first["source"].endswith(f"origin_models.py:{line}"), first  # NaiveRMSNorm.forward's return line


def test_a_divergence_that_never_reaches_an_output_is_no_origin(tmp_path):
    """A value that overflows but is clamped back before the output heals: device parity passes, and where an
    output does fail, the origin is what makes it fail, not the clamped overflow before it."""
    import torch
    from torch import nn

    class Clamped(nn.Module):
        def forward(self, x):
            healed = torch.clamp(x * 1e5, -1.0, 1.0)  # inf in fp16, then clamped: right again
            return healed + torch.exp(x * 12.0)  # exp(12 x) passes 65504 where x > 0.93

    x = torch.linspace(-1, 1, 32).reshape(2, 16)
    path = tmp_path / "m.onnx"
    cann_export.export(Clamped(), path, "onnx", example_inputs=(x,), num_random_inputs=0)
    graph = onnx.load(str(path))
    feed = {graph.graph.input[0].name: x.numpy()}
    expected = run(emulate(graph, emulation_for("force_fp32"), set()), [feed])
    report = device_report(graph, "force_fp16", [], [feed], expected, [graph.graph.output[0].name],
                           Tolerance().device_policy(), {})
    first = report["first_divergence"]
    producers = {o: n for n in graph.graph.node for o in n.output}
    assert first["op_type"] == "Exp", first
    assert any(producers[t].op_type == "Mul" for t in first["skipped_healed"])  # x * 1e5: inf, then clamped
    assert np.isfinite(expected[0][0]).all()
