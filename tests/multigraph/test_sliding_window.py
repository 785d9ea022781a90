"""Decoders whose cache keeps a sliding window (transformers' DynamicSlidingWindowLayer: Mistral, Gemma2's
alternate layers): past ``window - 1`` tokens the cache is cropped and the graph captured at the example no longer
holds (Gemma2's decode graph failed in onnxruntime; Mistral's was wrong on left-padded rows). The graphs' ranges
stop there: prompt <= window - 1, past <= window - 2; checked against eager incremental decoding with transformers'
own cache, a left-padded row included, at the range's end."""
import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers

from cann_export import api
from cann_export.errors import OptionsError

SMALL = dict(vocab_size=100, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=None)


def _mistral(window):
    torch.manual_seed(3)
    return transformers.MistralForCausalLM(transformers.MistralConfig(**SMALL, sliding_window=window)).eval()


def _gemma2(window):
    torch.manual_seed(4)
    cfg = transformers.Gemma2Config(**SMALL, head_dim=16, sliding_window=window,
                                    layer_types=["sliding_attention", "full_attention"])
    return transformers.Gemma2ForCausalLM(cfg).eval()


@pytest.fixture(scope="module", params=["mistral", "gemma2"])
def exported(request, tmp_path_factory):
    model = {"mistral": _mistral, "gemma2": _gemma2}[request.param](16)
    out = tmp_path_factory.mktemp("sliding") / request.param
    result = api.export_multi(model, out, export_format="onnx", num_random_inputs=1)
    assert result.ok, result.to_dict()
    return model, out


def _own(bundle, name):
    return json.loads((bundle / "components" / name / "manifest.json").read_text())


def test_the_ranges_stop_at_the_window(exported):
    _, bundle = exported
    prefill = {s["shape"]["sequence_length"] for s in _own(bundle, "prefill")["parity"]["shapes"]}
    decode = {s["shape"]["past_sequence_length"] for s in _own(bundle, "decode")["parity"]["shapes"]}
    assert max(prefill) == 15 and max(decode) == 14  # window 16: the cache holds 15 tokens


def test_a_padded_batch_decodes_as_transformers_does_at_the_range_end(exported):
    model, bundle = exported
    gen = torch.Generator().manual_seed(5)
    batch, prompt = 2, 14
    ids = torch.randint(3, 100, (batch, prompt + 1), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # the second row left-padded
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        cache = transformers.DynamicCache(config=model.config)
        model(input_ids=ids[:, :prompt], attention_mask=mask[:, :prompt], position_ids=pos[:, :prompt],
              past_key_values=cache, use_cache=True)
        want = model(input_ids=ids[:, prompt:], attention_mask=mask, position_ids=pos[:, prompt:],
                     past_key_values=cache, use_cache=True).logits[:, -1].numpy()
    prefill = ort.InferenceSession(str(bundle / "components" / "prefill" / "model.onnx"))
    decode = ort.InferenceSession(str(bundle / "components" / "decode" / "model.onnx"))
    feed = {"input_ids": ids[:, :prompt].numpy(), "attention_mask": mask[:, :prompt].numpy(),
            "position_ids": pos[:, :prompt].numpy()}
    outs = dict(zip([o.name for o in prefill.get_outputs()], prefill.run(None, feed), strict=True))
    past = {k.replace("present.", "past_key_values.", 1): v for k, v in outs.items() if k.startswith("present.")}
    step = {"input_ids": ids[:, prompt:].numpy(), "attention_mask": mask.numpy(),
            "position_ids": pos[:, prompt:].numpy(), **past}
    got = decode.run(["logits"], step)[0][:, -1]
    assert np.abs(got - want).max() < 1e-4, np.abs(got - want).max(-1)


def test_a_window_shorter_than_the_prompt_or_a_static_cache_past_it_is_refused(tmp_path):
    with pytest.raises(OptionsError, match="sliding window .8 tokens.* too short for the 7-token prompt"):
        api.export_multi(_mistral(8), tmp_path / "x")
    with pytest.raises(OptionsError, match="keeps only the last 15 in its cache"):
        api.export_multi(_mistral(16), tmp_path / "x", kv_cache="static:32")
    assert not (tmp_path / "x").exists()
