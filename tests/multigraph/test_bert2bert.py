"""A text encoder-decoder composed from two encoder-only configs (transformers' EncoderDecoderModel, "bert2bert": a
BERT encoder, a BERT decoder with cross-attention; config model_type "encoder-decoder" with nested encoder /
decoder configs): a save_pretrained directory exported with no flags is encoder + decoder + decoder_with_past,
each judged by parity, and a 4-token greedy generation through the ONNX graphs equals transformers' generate()."""
from __future__ import annotations

import json

import onnx
import torch
import transformers

from helpers.bundle_runs import cli_export, greedy_seq2seq

STEPS = 4


def _model():
    # init 0.3, seed 3: random weights whose greedy tokens change from step to step, so a wrong cache shows
    torch.manual_seed(3)
    common = dict(vocab_size=90, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                  max_position_embeddings=64, initializer_range=0.3)
    enc = transformers.BertConfig(num_hidden_layers=1, **common)
    dec = transformers.BertConfig(num_hidden_layers=2, is_decoder=True, add_cross_attention=True, **common)
    cfg = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(enc, dec)
    cfg.decoder_start_token_id, cfg.pad_token_id, cfg.eos_token_id = 1, 0, 2
    return transformers.EncoderDecoderModel(cfg).eval()


def test_bert2bert_directory_exports_three_graphs_that_generate(tmp_path):
    model = _model()
    model.save_pretrained(tmp_path / "b2b")
    bundle, result = tmp_path / "out", cli_export(tmp_path / "b2b", tmp_path / "out", "--format", "onnx")
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert result["ok"] is True and manifest["kind"] == "encoder-decoder-with-past"
    assert [c["name"] for c in manifest["components"]] == ["encoder", "decoder", "decoder_with_past"]
    graph = onnx.load(str(bundle / "components" / "decoder" / "model.onnx"), load_external_data=False).graph
    assert [v.name for v in graph.input] == ["input_ids", "encoder_attention_mask", "encoder_hidden_states"]
    ids = torch.randint(3, 90, (1, 6), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids).numpy()
    tokens, _ = greedy_seq2seq(bundle, manifest, {"input_ids": ids.numpy(), "attention_mask": mask},
                               model.config.decoder_start_token_id, STEPS, extra={"encoder_attention_mask": mask})
    model.generation_config.eos_token_id = None  # all 4 tokens come
    with torch.no_grad():
        want = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=STEPS,
                              do_sample=False)[0, -STEPS:].tolist()
    assert tokens == want
    assert len(set(tokens)) > 1  # the yardstick moves: a cache that is not read would show
