"""Decode's parity sets take their past from prefill's own parity references (bundle/parity_reuse.py), sliced to
each decode shape, instead of running prefill eagerly again for every decode shape and draw; the slice equals
prefill run on that batch and prompt (rows independent, the cache causal). An encoder-decoder's sets take the
encoder's output (and decoder_with_past its past) from what the earlier graph already computed, sliced along the
batch only: an encoder attends to every position, so a longer sequence never stands for a shorter one."""
from __future__ import annotations

import inspect

import pytest
import torch
import transformers

from cann_export import api
from cann_export.hf import cache_wrappers as wrappers
from cann_export.hf.graph_plans import plan_for
from cann_export.bundle import parity_reuse
from cann_export.bundle.parity_reuse import keeper, release, remember, reused
from helpers.hf_models import tiny_whisper


def _gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=96, n_positions=16,
                                  bos_token_id=0, eos_token_id=None, pad_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).eval()


@pytest.fixture(scope="module")
def counted(tmp_path_factory):
    """The bundle and how often prefill ran eagerly to feed a decode set (gears.feed_at's eager path)."""
    calls = []
    compute = wrappers.DecoderPrefill.compute

    def counting(self, feed):
        if any(f.function == "feed_at" for f in inspect.stack(0)[1:6]):
            calls.append(tuple(feed["input_ids"].shape))
        return compute(self, feed)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(wrappers.DecoderPrefill, "compute", counting)
        out = tmp_path_factory.mktemp("reuse") / "gpt2"
        result = api.export_multi(_gpt2(), out, num_random_inputs=1)
    return result, calls


def test_decode_sets_run_no_eager_prefill_and_parity_passes(counted):
    result, calls = counted
    assert result.ok, result.to_dict()
    assert calls == []  # every decode shape's past was sliced from prefill's references
    assert result.manifest["parity"]["components"] == {"prefill": True, "decode": True}


def _kept(plan, source, consumer, feed, point):
    """``source`` run on ``feed`` and its outputs kept as its parity references at ``point`` (draw 0); the
    (source output, consumer input) pairs that connect them."""
    with torch.no_grad():
        big = source.module(**feed)
    names = list(big)
    keeper(plan, source)(point, names, [[big[n].numpy() for n in names]])
    return [(out, inp) for src, out, dst, inp in plan.connections if (src, dst) == (source.name, consumer.name)]


def test_sliced_past_equals_prefill_run_at_that_shape():
    plan = plan_for(_gpt2())
    prefill, decode = plan.components
    ids = torch.randint(1, 96, (4, 9), generator=torch.Generator().manual_seed(3))
    feed = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "position_ids": torch.arange(9).expand(4, 9).contiguous()}
    feed = {n: feed[n] for n in prefill.module.graph_input_names}
    pairs = _kept(plan, prefill, decode, feed, {"batch_size": 4, "sequence_length": 9})
    got = reused(plan, "prefill", {"batch_size": 2, "sequence_length": 5}, 0, pairs, decode.module,
                 decode.example_inputs)
    assert got is not None and set(got) == {d for _, d in pairs}
    with torch.no_grad():
        small = prefill.module(**{n: v[:2, :5].contiguous() for n, v in feed.items()})
    for out, inp in pairs:
        assert got[inp].shape == small[out].shape
        torch.testing.assert_close(got[inp], small[out], rtol=1e-5, atol=1e-6)
    assert reused(plan, "prefill", {"batch_size": 5, "sequence_length": 5}, 0, pairs, decode.module,
                  decode.example_inputs) is None  # nothing kept covers a larger batch: prefill runs eagerly


def _t5():
    torch.manual_seed(2)
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=None)).eval()


def _feeding_runs(monkeypatch, classes):
    """The eager runs of ``classes`` made to feed a later graph's set (feed_at's eager path): (class, shapes)."""
    calls = []
    for cls in classes:
        def counting(self, feed, _compute=cls.compute, _name=cls.__name__):
            if any(f.function == "feed_at" for f in inspect.stack(0)[1:6]):
                calls.append((_name, tuple(sorted((k, tuple(v.shape)) for k, v in feed.items()))))
            return _compute(self, feed)
        monkeypatch.setattr(cls, "compute", counting)
    return calls


def test_whisper_decoder_sets_take_the_encoder_output_already_computed(tmp_path, monkeypatch):
    """Tiny Whisper with past: the decoder's and decoder_with_past's sets ran the encoder 16 times and the decoder
    11 times to make their inputs (the same batch again and again); now each point's feeding output comes from
    the encoder's own parity references or an earlier feeding run, and no feeding run repeats a point."""
    calls = _feeding_runs(monkeypatch, [wrappers.Seq2SeqEncoder, wrappers.Seq2SeqDecoder])
    result = api.export_multi(tiny_whisper(), tmp_path / "whisper", num_random_inputs=1)
    assert result.ok, result.to_dict()
    assert [c for c in calls if c[0] == "Seq2SeqEncoder"] == []
    assert len(calls) == len(set(calls)) <= 2, calls


def test_encoder_output_is_sliced_along_the_batch_only():
    """The encoder's kept output at batch 4 gives batch 2's rows, equal to the encoder run on them; at another
    sequence length it gives nothing (bidirectional attention: the first positions of a longer input are not a
    shorter input's output)."""
    plan = plan_for(_t5())
    encoder, decoder = plan.components[:2]
    ids = torch.randint(1, 96, (4, 9), generator=torch.Generator().manual_seed(3))
    feed = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    pairs = _kept(plan, encoder, decoder, feed, {"batch_size": 4, "encoder_sequence_length": 9})
    got = reused(plan, "encoder", {"batch_size": 2, "encoder_sequence_length": 9}, 0, pairs, decoder.module,
                 decoder.example_inputs)
    with torch.no_grad():
        small = encoder.module(**{n: v[:2] for n, v in feed.items()})
    assert got is not None and set(got) == {"encoder_hidden_states"}
    torch.testing.assert_close(got["encoder_hidden_states"], small["last_hidden_state"], rtol=1e-5, atol=1e-6)
    assert reused(plan, "encoder", {"batch_size": 2, "encoder_sequence_length": 5}, 0, pairs, decoder.module,
                  decoder.example_inputs) is None
    assert reused(plan, "encoder", {"batch_size": 5, "encoder_sequence_length": 9}, 0, pairs, decoder.module,
                  decoder.example_inputs) is None


def test_kept_outputs_stay_within_their_budget_and_go_when_no_graph_left_reads_them(monkeypatch):
    """A kept set that would pass the budget is not kept (that point's set runs the earlier graph eagerly); what no
    component left to export reads (directly, or through the earlier graph it runs) is let go; a bfloat16 output
    (which numpy lacks) is kept as float32 and handed back in the consumer's dtype."""
    plan = plan_for(_t5())
    encoder, decoder, _ = plan.components
    ids = torch.randint(1, 96, (4, 9), generator=torch.Generator().manual_seed(3))
    pairs = _kept(plan, encoder, decoder, {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                  {"batch_size": 4, "encoder_sequence_length": 9})
    kept_bytes = sum(a.nbytes for _, _, arrays in plan.kept["encoder"] for a in arrays.values())
    monkeypatch.setattr(parity_reuse, "KEPT_FLOOR", kept_bytes + 1)
    monkeypatch.setattr(parity_reuse, "KEPT_SHARE", 0.0)
    remember(plan, "encoder", {"batch_size": 4, "encoder_sequence_length": 5}, 0,
             {"last_hidden_state": torch.zeros(4, 5, 32)})  # past the budget: not kept
    assert [p for p, _, _ in plan.kept["encoder"]] == [{"batch_size": 4, "encoder_sequence_length": 9}]
    plan.kept.clear()
    remember(plan, "encoder", {"batch_size": 1, "encoder_sequence_length": 2}, 0,
             {"last_hidden_state": torch.ones(1, 2, 32, dtype=torch.bfloat16)})
    got = reused(plan, "encoder", {"batch_size": 1, "encoder_sequence_length": 2}, 0, pairs, decoder.module,
                 decoder.example_inputs)
    assert got["encoder_hidden_states"].dtype == decoder.example_inputs["encoder_hidden_states"].dtype
    release(plan, {"encoder", "decoder"})  # decoder_with_past reads the decoder, which reads the encoder
    assert set(plan.kept) == {"encoder"}
    release(plan, {"encoder", "decoder", "decoder_with_past"})
    assert plan.kept == {}
