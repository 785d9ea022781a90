"""A vision encoder-decoder (TrOCR / Donut's VisionEncoderDecoderModel: a ViT encoder, a GPT-2 decoder with
cross-attention) as a multi-graph bundle: a save_pretrained directory exported with no flags is Optimum's
image-to-text-with-past (encoder on ``pixel_values`` + decoder + decoder_with_past, no encoder attention mask; the
config's model_type "vision-encoder-decoder" and its nested encoder / decoder configs are read), a 4-token greedy
generation through the ONNX graphs equals transformers' generate(), ``--task image-to-text`` writes encoder +
decoder only, and a text task is refused (exit 2, nothing written)."""
from __future__ import annotations

import json

import onnx
import pytest
import torch
import transformers
from click.testing import CliRunner

from cann_export.cli.main import cli
from helpers.bundle_runs import cli_export, greedy_seq2seq

STEPS = 4
IMAGE, PATCH = 32, 8  # 16 patches + the class token: the encoder's output length is 17


def _model():
    # init 0.3, seed 3: random weights whose greedy tokens change from step to step, so a wrong cache shows;
    # encoder width 48 against the decoder's 32: the graph projects the encoder's states (enc_to_dec_proj)
    torch.manual_seed(3)
    enc = transformers.ViTConfig(hidden_size=48, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                 image_size=IMAGE, patch_size=PATCH)
    dec = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=90, n_positions=40,
                                  add_cross_attention=True, is_decoder=True, bos_token_id=1, eos_token_id=2,
                                  initializer_range=0.3)
    cfg = transformers.VisionEncoderDecoderConfig.from_encoder_decoder_configs(enc, dec)
    cfg.decoder_start_token_id, cfg.pad_token_id, cfg.eos_token_id = 1, 0, 2
    return transformers.VisionEncoderDecoderModel(cfg).eval()


@pytest.fixture(scope="module")
def ved(tmp_path_factory):
    root = tmp_path_factory.mktemp("ved")
    model = _model()
    model.save_pretrained(root / "ved-dir")
    return {"model": model, "dir": root / "ved-dir", "root": root,
            "past": (root / "past", cli_export(root / "ved-dir", root / "past"))}


def _pixels():
    return torch.randn(1, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(4))


def test_default_is_with_past_and_greedy_generation_equals_generate(ved):
    model, (bundle, result) = ved["model"], ved["past"]
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert result["ok"] is True and manifest["kind"] == "encoder-decoder-with-past"
    assert [c["name"] for c in manifest["components"]] == ["encoder", "decoder", "decoder_with_past"]
    pixels, start = _pixels(), model.config.decoder_start_token_id
    tokens, _ = greedy_seq2seq(bundle, manifest, {"pixel_values": pixels.numpy()}, start, STEPS)
    model.generation_config.eos_token_id = None  # all 4 tokens come
    with torch.no_grad():
        want = model.generate(pixels, max_new_tokens=STEPS, do_sample=False)[0, -STEPS:].tolist()
    assert tokens == want
    assert len(set(tokens)) > 1  # the yardstick moves: a cache that is not read would show


def test_graph_names_axes_and_atc_ranges(ved):
    bundle, _ = ved["past"]

    def inputs(component):
        graph = onnx.load(str(bundle / "components" / component / "model.onnx"), load_external_data=False).graph
        return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in graph.input}

    assert inputs("encoder") == {"pixel_values": ["batch_size", 3, IMAGE, IMAGE]}
    decoder = inputs("decoder")
    assert list(decoder) == ["input_ids", "encoder_hidden_states"]  # no encoder_attention_mask, as Optimum
    assert decoder["encoder_hidden_states"] == ["batch_size", "encoder_sequence_length", 48]  # before the projection
    step = inputs("decoder_with_past")
    assert step["past_key_values.1.encoder.key"] == ["batch_size", 2, "encoder_sequence_length", 16]
    assert step["past_key_values.1.decoder.key"] == ["batch_size", 2, "past_decoder_sequence_length", 16]
    script = (bundle / "components" / "decoder" / "atc" / "convert.sh").read_text()  # the CLI's default: atc_ready
    assert "encoder_hidden_states:1~64,1~17,48" in script
    manifest = json.loads((bundle / "components" / "decoder" / "manifest.json").read_text())
    lengths = {s["shape"].get("encoder_sequence_length") for s in manifest["parity"]["shapes"]}
    assert max(lengths) == (IMAGE // PATCH) ** 2 + 1, lengths  # the encoder's one output length bounds it


def test_image_to_text_without_past_and_a_text_task_refused(ved):
    result = cli_export(ved["dir"], ved["root"] / "nopast", "--task", "image-to-text")
    manifest = json.loads((ved["root"] / "nopast" / "manifest.json").read_text())
    assert result["ok"] is True and [c["name"] for c in manifest["components"]] == ["encoder", "decoder"]
    res = CliRunner().invoke(cli, [str(ved["dir"]), "-o", str(ved["root"] / "bad"), "--task",
                                   "text-classification"])
    assert res.exit_code == 2 and "image-to-text" in res.output, res.output
    assert not (ved["root"] / "bad").exists()
