"""Decode's parity sets take their past from prefill's own parity references (bundle/parity_reuse.py), sliced to
each decode shape, instead of running prefill eagerly again for every decode shape and draw; the slice equals
prefill run on that batch and prompt (rows independent, the cache causal)."""
from __future__ import annotations

import inspect

import pytest
import torch
import transformers

from cann_export import api
from cann_export.hf import cache_wrappers as wrappers
from cann_export.hf.graph_plans import plan_for
from cann_export.bundle.parity_reuse import keeper, reused


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


def test_sliced_past_equals_prefill_run_at_that_shape():
    plan = plan_for(_gpt2())
    prefill, decode = plan.components
    ids = torch.randint(1, 96, (4, 9), generator=torch.Generator().manual_seed(3))
    feed = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "position_ids": torch.arange(9).expand(4, 9).contiguous()}
    feed = {n: feed[n] for n in prefill.module.graph_input_names}
    with torch.no_grad():
        big = prefill.module(**feed)
    names = list(big)
    keeper(plan, prefill)({"batch_size": 4, "sequence_length": 9}, names, [[big[n].numpy() for n in names]])
    pairs = [(out, inp) for src, out, dst, inp in plan.connections if (src, dst) == ("prefill", "decode")]
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
