"""``cann_export.load(BUNDLE)`` on one-graph and multi-graph bundles (issue 43 item 6): the graph's input names as
keywords (numpy or torch), the outputs by name from onnxruntime, compared with eager; GPT-2's prefill + decode and
T5's encoder / decoder / decoder_with_past by name, a greedy generation wired by the runner equal to generate();
a path that is no bundle, a tampered graph or an unlisted file: a clear refusal (exit 2 through the CLI's error)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import cann_export
from cann_export.errors import ExportError, OptionsError, ValidateError
from helpers.hf_models import tiny_decoder_gpt2
from helpers.toy_models import TwoInputs


@pytest.fixture(scope="module")
def one_graph(tmp_path_factory):
    root = tmp_path_factory.mktemp("one")
    torch.manual_seed(0)
    model = TwoInputs().eval()
    inputs = (torch.randint(0, 50, (2, 5)), torch.randn(2, 5, 16))
    for out in ("two", "two.pth"):
        result = cann_export.export(model, root / out, example_inputs=inputs, num_random_inputs=1)
        assert result.ok, result.to_dict()
    return model, root


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt2")
    model = tiny_decoder_gpt2(n_positions=32)
    result = cann_export.export_multi(model, root / "gpt2", num_random_inputs=1)
    assert result.ok, result.to_dict()
    return model, root / "gpt2"


def test_a_one_graph_bundle_runs_by_input_name_as_eager(one_graph):
    model, root = one_graph
    ids, feats = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(1)), torch.randn(2, 5, 16)
    with torch.no_grad():
        want = model(ids, feats)
    for bundle in (root / "two", root / "two.pth"):
        runner = cann_export.load(bundle)
        assert runner.input_names == ["input_ids", "features"] and set(runner.output_names) == {"hidden", "pooled"}
        from_torch = runner(input_ids=ids, features=feats)
        from_numpy = runner(input_ids=ids.numpy().astype(np.int32), features=feats.numpy())  # cast to the graph's
        for got in (from_torch, from_numpy):
            np.testing.assert_allclose(got["hidden"], want["hidden"].numpy(), atol=1e-5)
            np.testing.assert_allclose(got["pooled"], want["pooled"].numpy(), atol=1e-5)
        assert Path(runner) == bundle  # the bundle it came from, as a path (cann_export.validate(runner) reads it)


def test_a_one_graph_runner_names_missing_and_unknown_inputs(one_graph):
    _, root = one_graph
    runner = cann_export.load(root / "two")
    with pytest.raises(OptionsError, match=r"input_ids, features .*missing 'features', unknown 'feats'"):
        runner(input_ids=np.zeros((1, 3), np.int64), feats=np.zeros((1, 3, 16), np.float32))
    with pytest.raises(OptionsError, match="refused its inputs"):
        runner(input_ids=np.zeros((1, 3), np.int64), features=np.zeros((1, 3, 9), np.float32))


def test_gpt2_prefill_and_decode_by_name_generate_as_transformers(gpt2):
    model, bundle = gpt2
    runner = cann_export.load(bundle)
    assert runner.components == ["prefill", "decode"] and runner["decode"] is runner.decode
    ids = torch.randint(1, 96, (1, 5), generator=torch.Generator().manual_seed(7))
    n = ids.shape[1]
    out = runner["prefill"](input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=torch.arange(n)[None])
    with torch.no_grad():
        np.testing.assert_allclose(out["logits"], model(ids).logits.numpy(), atol=1e-4)
    tokens, source = [int(out["logits"][0, -1].argmax())], "prefill"
    for step in range(3):  # the caches wired as the runner's connections say
        past = {c["to"]["input"]: out[c["from"]["output"]] for c in runner.connections
                if c["from"]["component"] == source and c["to"]["component"] == "decode"}
        length = n + step + 1
        out = runner.decode(input_ids=[[tokens[-1]]], attention_mask=np.ones((1, length), np.int64),
                            position_ids=[[length - 1]], **past)
        tokens.append(int(out["logits"][0, -1].argmax()))
        source = "decode"
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        want = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4,
                              do_sample=False)[0, -4:].tolist()
    assert tokens == want
    with pytest.raises(KeyError, match="it has prefill, decode"):
        runner["decoder"]


@pytest.mark.slow
def test_t5_encoder_and_decoders_by_name_as_transformers(tmp_path):
    import transformers

    torch.manual_seed(2)
    cfg = transformers.T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                decoder_start_token_id=0, pad_token_id=0, eos_token_id=None)
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    assert cann_export.export_multi(model, tmp_path / "t5", num_random_inputs=1).ok
    runner = cann_export.load(tmp_path / "t5")
    assert runner.components == ["encoder", "decoder", "decoder_with_past"]
    ids = torch.randint(1, 96, (1, 6), generator=torch.Generator().manual_seed(3))
    enc = runner.encoder(input_ids=ids, attention_mask=torch.ones_like(ids))
    with torch.no_grad():
        want = model.encoder(input_ids=ids).last_hidden_state.numpy()
    np.testing.assert_allclose(enc["last_hidden_state"], want, atol=1e-4)


def test_what_is_not_a_bundle_is_refused_naming_it(tmp_path, one_graph):
    with pytest.raises(OptionsError, match="no such bundle"):
        cann_export.load(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValidateError, match="not a cann-export bundle"):
        cann_export.load(tmp_path / "empty")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ExportError) as caught:
        cann_export.load(tmp_path / "notes.txt")
    assert caught.value.exit_code == 2 and caught.value.stage == "load"


def test_a_tampered_graph_or_an_unlisted_file_is_never_loaded(tmp_path, one_graph, gpt2):
    _, root = one_graph
    bundle = tmp_path / "one"
    shutil.copytree(root / "two", bundle)
    graph = bundle / json.loads((bundle / "manifest.json").read_text())["model"]["file"]
    graph.write_bytes(graph.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(ValidateError, match="sha256 mismatch") as caught:
        cann_export.load(bundle)
    assert caught.value.stage == "load"
    multi = tmp_path / "multi"
    shutil.copytree(gpt2[1], multi)
    (multi / "components" / "decode" / "extra.onnx").write_bytes((multi / "components/decode/model.onnx").read_bytes())
    with pytest.raises(ValidateError, match="extra.onnx"):
        cann_export.load(multi)


def test_load_model_onnx_gives_the_runner_of_a_published_bundle(tmp_path, one_graph, gpt2):
    from cann_export.model_zoo.zoo_api import load_model, publish

    _, root = one_graph
    zoo = str(tmp_path / "zoo")
    publish(str(root / "two"), name="two", zoo=zoo)
    publish(str(gpt2[1]), name="gpt2", zoo=zoo)
    one = load_model("two", framework="onnx", zoo=zoo)
    assert sorted(one(input_ids=np.ones((2, 5), np.int64), features=np.ones((2, 5, 16), np.float32))) == \
        ["hidden", "pooled"]
    assert cann_export.validate(one)["passed"] is True  # still the verified bundle's path
    many = load_model("gpt2", framework="onnx", zoo=zoo)
    assert many.components == ["prefill", "decode"] and cann_export.validate(many)["passed"] is True
