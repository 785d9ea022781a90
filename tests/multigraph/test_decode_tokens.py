"""``--decode-tokens N`` (``decode_tokens=N``): the decode graph (a decoder's ``decode``, an encoder-decoder's
``decoder_with_past``) takes N new tokens on the cache (chunked prefill, speculative decoding's drafts): run in
onnxruntime over 4 new tokens with the past, it equals eager's logits; parity checked it at 4 tokens; the manifest's
run notes and the ATC command record it. One token by default (the golden bundles are unchanged); a bad value is
refused before any load (the flag before torch is imported: tests/cli/test_option_checks.py)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
import transformers

from cann_export import api
from cann_export.errors import OptionsError
from helpers.bundle_runs import component_session, feeds_from, run_named
from helpers.hf_models import tiny_decoder_gpt2

N = 4
PROMPT = 5


def _t5():
    torch.manual_seed(2)
    cfg = transformers.T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                decoder_start_token_id=0, pad_token_id=0, eos_token_id=None)
    return transformers.T5ForConditionalGeneration(cfg).eval()


def _ids(shape, seed):
    return torch.randint(1, 96, shape, generator=torch.Generator().manual_seed(seed))


def _dims(graph_input):
    return [d.dim_param or d.dim_value for d in graph_input.type.tensor_type.shape.dim]


def _recorded(out, loop):
    """The decode graph's input_ids dims, the top-level run notes, the loop graph's ATC command and parity."""
    graph = onnx.load(str(out / "components" / loop / "model.onnx"), load_external_data=False).graph
    ids = next(i for i in graph.input if i.name == "input_ids")
    manifest = json.loads((out / "manifest.json").read_text())
    script = (out / "components" / loop / "atc" / "convert.sh").read_text()
    parity = json.loads((out / "components" / loop / "manifest.json").read_text())["parity"]
    return _dims(ids), manifest, script, parity


def test_gpt2_decode_graph_takes_four_new_tokens_on_the_past(tmp_path):
    model = tiny_decoder_gpt2(n_positions=64)
    out = tmp_path / "gpt2"
    result = api.export_multi(model, out, decode_tokens=N, num_random_inputs=1)
    assert result.ok, result.to_dict()
    dims, manifest, script, parity = _recorded(out, "decode")
    assert dims == ["batch_size", N]
    assert manifest["run"]["decode_tokens"] == N and manifest["run"]["loop"] == "decode"
    assert f"input_ids:1~64,{N};" in script and f"position_ids:1~64,{N};" in script
    assert parity["passed"] and parity["shapes"]
    batch, prompt = 2, _ids((2, PROMPT), 3)
    first = run_named(component_session(out, "prefill"), {
        "input_ids": prompt.numpy(), "attention_mask": np.ones((batch, PROMPT), np.int64),
        "position_ids": np.tile(np.arange(PROMPT), (batch, 1))})
    new = _ids((batch, N), 4)
    got = run_named(component_session(out, "decode"), {
        "input_ids": new.numpy(), "attention_mask": np.ones((batch, PROMPT + N), np.int64),
        "position_ids": np.tile(np.arange(PROMPT, PROMPT + N), (batch, 1)),
        **feeds_from(manifest, "prefill", "decode", first)})
    with torch.no_grad():
        want = model(input_ids=torch.cat([prompt, new], 1)).logits[:, PROMPT:]
    assert got["logits"].shape == (batch, N, 96)
    np.testing.assert_allclose(got["logits"], want.numpy(), atol=1e-4)
    assert got["present.0.key"].shape[2] == PROMPT + N


def test_t5_decoder_with_past_takes_four_new_tokens(tmp_path):
    model = _t5()
    model.save_pretrained(tmp_path / "t5-dir")
    out = tmp_path / "t5"
    from helpers.bundle_runs import cli_export

    result = cli_export(tmp_path / "t5-dir", out, "--decode-tokens", str(N))
    assert result["ok"], result
    dims, manifest, script, parity = _recorded(out, "decoder_with_past")
    assert dims == ["batch_size", N] and manifest["run"]["decode_tokens"] == N
    assert f"input_ids:1~64,{N};" in script and parity["passed"]
    source, mask = _ids((1, 6), 5), np.ones((1, 6), np.int64)
    enc = run_named(component_session(out, "encoder"), {"input_ids": source.numpy(), "attention_mask": mask})
    start = torch.tensor([[0, 7]])
    first = run_named(component_session(out, "decoder"), {
        "input_ids": start.numpy(), "encoder_attention_mask": mask, **feeds_from(manifest, "encoder", "decoder", enc)})
    new = _ids((1, N), 6)
    got = run_named(component_session(out, "decoder_with_past"), {
        "input_ids": new.numpy(), "encoder_attention_mask": mask,
        **feeds_from(manifest, "decoder", "decoder_with_past", first)})
    with torch.no_grad():
        want = model(input_ids=source, attention_mask=torch.from_numpy(mask),
                     decoder_input_ids=torch.cat([start, new], 1)).logits[:, 2:]
    np.testing.assert_allclose(got["logits"], want.numpy(), atol=1e-4)
    assert got["present.1.decoder.value"].shape[2] == 2 + N
    # validate re-derives the run notes from the graphs (the decode graph's N tokens)
    assert api.validate(out)["passed"] is True


@pytest.mark.parametrize("value", [0, -1, True, 2.5, "4", 100_000])
def test_a_bad_decode_tokens_keyword_is_refused(tmp_path, value):
    with pytest.raises(OptionsError, match=r"--decode-tokens .* 1\.\."):
        api.export_multi(tiny_decoder_gpt2(n_positions=16), tmp_path / "b", decode_tokens=value)
    assert not (tmp_path / "b").exists()


def test_decode_tokens_past_the_position_table_is_refused(tmp_path):
    with pytest.raises(OptionsError, match="decode-tokens 20"):
        api.export_multi(tiny_decoder_gpt2(n_positions=16), tmp_path / "b", decode_tokens=20)


def test_decode_tokens_with_a_static_cache_is_refused(tmp_path):
    with pytest.raises(OptionsError, match="decode-tokens.*static"):
        api.export_multi(tiny_decoder_gpt2(n_positions=16), tmp_path / "b", decode_tokens=2, kv_cache="static:8")


def test_decode_tokens_for_an_export_with_no_decode_graph_is_refused(tmp_path):
    with pytest.raises(OptionsError, match=r"decode_tokens=4 .* one graph"):
        api.export(torch.nn.Linear(4, 2), tmp_path / "one", example_inputs=(torch.randn(2, 4),), decode_tokens=4)
    with pytest.raises(OptionsError, match=r"--decode-tokens 2 .*decoder_with_past"):
        api.export_multi(_t5(), tmp_path / "nopast", task="text2text-generation", decode_tokens=2)
    assert not (tmp_path / "one").exists() and not (tmp_path / "nopast").exists()
