"""transformers 4.53-4.57 build attention masks with vmap, which the TorchScript tracer cannot record: a decoder's
trace failed ("unordered_map::at") and capture fell back to dynamo, 3-4x slower (capture/traceable_masks.py swaps in
a broadcasting builder while tracing). These run where transformers has that builder (tests/transformers4_env.sh;
.ci/run) and skip on transformers 5, which builds masks without vmap by default."""
from __future__ import annotations

import contextlib
import itertools
import json

import pytest
import torch

from cann_export import api
from cann_export.capture import traceable_masks
from helpers.hf_models import tiny_decoder_gpt2

masking = pytest.importorskip("transformers.masking_utils")
VMAP_MASKS = hasattr(masking, "sdpa_mask_recent_torch")
# the transformers4 marker selects them in tests/transformers4_env.sh's venv
on_vmap_masks = pytest.mark.skipif(
    not VMAP_MASKS,
    reason="this transformers builds its masks without vmap (run: bash tests/transformers4_env.sh; .ci/run runs it)")


def _masks() -> list:
    return [("causal", masking.causal_mask_function),
            ("sliding window 3", masking.sliding_window_causal_mask_function(3)),
            ("chunked 2", masking.chunked_causal_mask_function(2, torch.zeros(2, dtype=torch.long)))]


@pytest.mark.transformers4
@on_vmap_masks
@pytest.mark.parametrize("q_length,kv_offset,padded", list(itertools.product((1, 4), (0, 3), (False, True))))
def test_the_broadcast_mask_is_transformers_vmap_mask(q_length, kv_offset, padded):
    """Every mask function, with and without padding, prefill (offset 0) and decode (a cache before): the same
    booleans as transformers' own vmap builder, run eagerly (the reference)."""
    kv_length = q_length + kv_offset
    attention = torch.ones(2, kv_length, dtype=torch.long)
    if padded:
        attention[1, :2] = 0  # left padding on the second row
    ours = traceable_masks._broadcast_sdpa_mask(masking)
    cache_position = torch.arange(kv_offset, kv_offset + q_length)
    for name, function in _masks():
        kwargs = dict(batch_size=2, cache_position=cache_position, kv_length=kv_length, kv_offset=0,
                      mask_function=function, attention_mask=attention if padded else None,
                      allow_is_causal_skip=False)
        expected = masking.sdpa_mask_recent_torch(**kwargs)
        got = ours(**kwargs)
        assert got.shape == expected.shape == (2, 1, q_length, kv_length), name
        assert torch.equal(got, expected), name


@pytest.mark.transformers4
@on_vmap_masks
def test_the_swap_is_undone_after_the_trace_and_after_an_error():
    registry = masking.ALL_MASK_ATTENTION_FUNCTIONS
    before = (masking.sdpa_mask, registry._global_mapping["sdpa"])
    with traceable_masks.traceable_masks():
        assert masking.sdpa_mask is not before[0] and registry._global_mapping["sdpa"] is masking.sdpa_mask
    assert (masking.sdpa_mask, registry._global_mapping["sdpa"]) == before
    with pytest.raises(RuntimeError), traceable_masks.traceable_masks():
        raise RuntimeError("a failed trace")
    assert (masking.sdpa_mask, registry._global_mapping["sdpa"]) == before


def _captures(tmp_path, name: str) -> dict[str, dict]:
    result = api.export_multi(tiny_decoder_gpt2(n_positions=32), tmp_path / name, export_format="onnx",
                              num_random_inputs=1)
    assert result.ok, result
    out = {}
    for graph in ("prefill", "decode"):
        manifest = json.loads((tmp_path / name / "components" / graph / "manifest.json").read_text())
        out[graph] = {"capture": manifest["capture"], "parity": manifest["parity"]["passed"]}
    return out


@pytest.mark.transformers4
@on_vmap_masks
def test_a_decoder_is_traced_and_agrees_with_the_model(tmp_path):
    """Prefill and decode graphs come from the trace (no dynamo fallback), and parity passes on every set: padded
    rows, the batch and sequence ranges' ends and middle."""
    for graph, found in _captures(tmp_path, "gpt2").items():
        assert found["capture"]["exporter"] == "torchscript", (graph, found)
        assert [a for a in found["capture"]["attempts"] if "error" in a] == [], (graph, found)
        assert found["parity"] is True, graph


@pytest.mark.transformers4
@on_vmap_masks
def test_without_the_swap_the_trace_fails_on_vmap(tmp_path, monkeypatch):
    """What the swap mends: with it off, the tracer fails on the vmap mask and dynamo writes the graph."""
    monkeypatch.setattr(traceable_masks, "traceable_masks", contextlib.nullcontext)
    for graph, found in _captures(tmp_path, "gpt2-unswapped").items():
        assert found["capture"]["exporter"] == "dynamo", (graph, found)
        assert "unordered_map::at" in found["capture"]["attempts"][0]["error"], (graph, found)


@pytest.mark.skipif(VMAP_MASKS, reason="this transformers builds its masks with vmap: the swap applies")
def test_a_release_without_the_vmap_builder_is_left_alone():
    """transformers 5 (the README's environment): nothing is swapped while tracing."""
    registry = masking.ALL_MASK_ATTENTION_FUNCTIONS
    before = (masking.sdpa_mask, dict(registry._global_mapping))
    with traceable_masks.traceable_masks():
        assert (masking.sdpa_mask, dict(registry._global_mapping)) == before
