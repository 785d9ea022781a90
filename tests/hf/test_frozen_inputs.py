"""Forward arguments that change the outputs are graph inputs or named as frozen (issue 46): LayoutLM's bbox is an
input with realistic word boxes (its graph right on real boxes); a model file's segment ids left out of its example
are named in the manifest's warnings; an input the model never reads (RWKV's attention_mask) stays in the graph, so
the bundle's torch.export program and its graph agree and ``validate`` accepts the bundle."""
import json

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from helpers import toy_models

from cann_export.cli.main import cli

TEXT = dict(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
            max_position_embeddings=64)


def invoke(args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _save(cls, config_cls, directory, **kwargs):
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, cls)(getattr(transformers, config_cls)(**kwargs)).eval()
    model.save_pretrained(str(directory))
    return model


@pytest.fixture(scope="module")
def layoutlm(tmp_path_factory):
    root = tmp_path_factory.mktemp("layoutlm")
    model = _save("LayoutLMForSequenceClassification", "LayoutLMConfig", root / "layoutlm", **TEXT, num_labels=3)
    out = root / "layoutlm.onnx"
    result = invoke([root / "layoutlm", "--format", "onnx", "-o", out])
    assert result.exit_code == 0, result.output
    return model, out


def _boxes(batch, seq, seed):
    g = torch.Generator().manual_seed(seed)
    corners = torch.randint(0, 1001, (batch, seq, 2, 2), generator=g)
    low, high = corners.min(-1).values, corners.max(-1).values
    return torch.stack([low[..., 0], low[..., 1], high[..., 0], high[..., 1]], dim=-1)


def test_layoutlm_boxes_are_a_graph_input_and_the_graph_is_right_on_real_boxes(layoutlm, run_ort):
    model, out = layoutlm
    graph = onnx.load(str(out))
    inputs = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.graph.input}
    assert list(inputs) == ["input_ids", "bbox", "attention_mask", "token_type_ids"]
    assert inputs["bbox"] == ["batch_size", "sequence_length", 4]  # Optimum's axes
    g = torch.Generator().manual_seed(3)
    for batch, seq, seed in ((2, 16, 1), (3, 9, 2)):
        feeds = {"input_ids": torch.randint(0, 100, (batch, seq), generator=g), "bbox": _boxes(batch, seq, seed),
                 "attention_mask": torch.ones(batch, seq, dtype=torch.int64),
                 "token_type_ids": torch.zeros(batch, seq, dtype=torch.int64)}
        _, (got,) = run_ort(out, feeds)
        with torch.no_grad():
            want = model(**feeds).logits.numpy()
        np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-3)


def test_a_model_files_argument_that_changes_the_outputs_is_named_frozen(tmp_path):
    torch.manual_seed(0)
    weights = tmp_path / "seg.pt"
    torch.save(toy_models.SegmentedTokens().state_dict(), weights)
    from safetensors.torch import save_file

    save_file({"input_ids": torch.randint(0, 50, (2, 8))}, str(tmp_path / "ids.safetensors"))
    out = tmp_path / "seg_bundle"
    result = invoke([weights, "--model-class", "helpers.toy_models:SegmentedTokens", "--example-inputs",
                     tmp_path / "ids.safetensors", "--format", "atc_ready", "-o", out, "--no-validate"])
    assert result.exit_code == 0, result.output
    assert "frozen in the graph: token_type_ids" in result.output
    manifest = json.loads((out / "manifest.json").read_text())
    (warning,) = manifest["warnings"]["frozen"]
    assert "'token_type_ids'" in warning and "frozen" in warning


def test_a_decoders_unused_attention_mask_stays_an_input_and_its_bundle_validates(tmp_path):
    directory = tmp_path / "rwkv"
    _save("RwkvForCausalLM", "RwkvConfig", directory, vocab_size=100, hidden_size=32, num_hidden_layers=2,
          attention_hidden_size=32, intermediate_size=37, context_length=64)
    out = tmp_path / "rwkv_bundle"
    # one traced shape (the default's dynamic sequence re-captures RWKV with dynamo: minutes on a busy machine)
    result = invoke([directory, "--task", "text-generation", "-o", out, "--static-shapes"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert [i["name"] for i in manifest["model"]["inputs"]] == ["input_ids", "attention_mask"]
    graph = onnx.load(str(out / "model.onnx"))
    assert [i.name for i in graph.graph.input] == ["input_ids", "attention_mask"]
    result = invoke(["validate", out])
    assert result.exit_code == 0, result.output
