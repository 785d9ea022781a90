"""Real architectures from transformers (tiny configs, random weights) through the Python API."""
import numpy as np
import onnx
import pytest
import torch
import transformers  # noqa: F401 - a declared test dependency: a broken install fails, never skips
from helpers import hf_models

import cann_export

CASES = {
    "bert": (hf_models.tiny_bert, hf_models.token_inputs),
    "gpt2": (hf_models.tiny_gpt2, hf_models.token_inputs),
    "vit": (hf_models.tiny_vit, hf_models.image_inputs),
    "resnet": (hf_models.tiny_resnet, hf_models.image_inputs),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_transformers_model_exports_atc_ready_with_parity(name, tmp_path, run_ort):
    build, make_inputs = CASES[name]
    model, feeds = build(), make_inputs()
    result = cann_export.export(model, tmp_path / name, "atc_ready", example_inputs=feeds)

    assert result.ok, result.parity
    assert result.parity["precision"]["mode"] == "force_fp16"  # passes under the device's fp16 emulation
    assert result.parity["graph_fp32_passed"]
    assert 11 <= result.onnx["opset"] <= 18
    graph = onnx.load(result.onnx["path"])
    onnx.checker.check_model(graph, full_check=True)
    ops = {n.op_type for n in graph.graph.node}
    assert "Dropout" not in ops and "BatchNormalization" not in ops

    # Independent check: onnxruntime against torch on the example inputs.
    _, outs = run_ort(result.onnx["path"], feeds)
    with torch.no_grad():
        ref = model(**feeds)
    ref_first = ref[0] if isinstance(ref, tuple) else next(iter(ref.values()))
    np.testing.assert_allclose(outs[0], ref_first.numpy(), atol=1e-4, rtol=1e-3)
