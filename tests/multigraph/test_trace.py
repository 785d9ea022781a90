"""A decoder's prefill and decode graphs are captured as Optimum does, by a TorchScript trace with the components'
declared axes as ``dynamic_axes`` (batch, sequence, past length; Optimum's names), kept only after the trace gate
ran it against the model at the example and at each dimension's range ends and middle; a component whose trace is
specialised to the example's size is rejected and captured by dynamo instead."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from cann_export import api
from cann_export.bundle.graph_shapes import shape_sets
from cann_export.hf.graph_plans import decoder_plan
from cann_export.hf.cache_wrappers import DecoderPrefill
from helpers.bundle_runs import component_session, run_named
from helpers.hf_models import tiny_decoder_gpt2


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    out = tmp_path_factory.mktemp("trace") / "gpt2"
    with pytest.MonkeyPatch.context() as patch:  # what the export reads and writes a whole graph for (spied on)
        spied = _spy(patch)
        result = api.export_multi(tiny_decoder_gpt2(n_positions=32), out, export_format="onnx", num_random_inputs=1)
    return out, result, spied


def _spy(patch: pytest.MonkeyPatch) -> dict[str, list]:
    """Calls of the helpers that write or read a whole graph for capture's check and the staged check, recorded."""
    from cann_export.bundle import rederive
    from cann_export.capture import large_graph
    from cann_export.graph import onnx_helpers

    from cann_export.inputs import activations

    calls: dict[str, list] = {"check_graph": [], "load_captured": [], "load_graph": [], "sizing_runs": []}

    def spy(module, name, key, record):
        real = getattr(module, name)

        def called(*args, **kwargs):
            calls[key].append(record(*args, **kwargs))
            return real(*args, **kwargs)

        patch.setattr(module, name, called)

    spy(onnx_helpers, "check_graph", "check_graph", lambda model, *a, **k: len(model.graph.output))
    spy(large_graph, "load_captured", "load_captured", lambda path, ctx: str(path))
    spy(rederive, "_load_graph", "load_graph", lambda d, f, diffs, weights=True: weights)
    spy(activations, "op_sizes", "sizing_runs", lambda: 1)  # an eager run sizing a component's parity budget
    return calls


def test_the_graphs_are_checked_without_writing_or_reading_them_whole_again(traced):
    """Capture checks the graph torch serialised from its bytes in memory (no file written and read back), a
    narrowed output (decode's one-token logits) by the full check's inference without the weights; the staged
    check before commit reads each graph without its weights' bytes (the file table hashes them)."""
    _, result, spied = traced
    assert result.ok
    assert spied["check_graph"] == [] and spied["load_captured"] == [], spied
    assert spied["load_graph"] and not any(spied["load_graph"]), spied  # every staged check: weights=False


def test_prefill_is_sized_once_for_both_graphs_budgets(traced):
    """Decode's parity budget counts prefill's inputs and outputs (prefill makes decode's past): prefill's sizes are
    measured once, by its own budget, not run eagerly again for decode's. Each graph runs at its example and at the
    low end of each of its two dimensions (batch and sequence / past length): 3 runs each."""
    _, result, spied = traced
    assert result.ok
    assert len(spied["sizing_runs"]) == 6, spied["sizing_runs"]


def _dims(values):
    return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in values}


def test_prefill_and_decode_are_traced_with_symbolic_dims_and_checked_at_the_range_ends(traced):
    out, result, _ = traced
    assert result.ok, result.to_dict()
    ranges = {"prefill": ("sequence_length", 32), "decode": ("past_sequence_length", 31)}
    for name, (length, end) in ranges.items():
        manifest = json.loads((out / "components" / name / "manifest.json").read_text())
        capture = manifest["capture"]
        assert capture["exporter"] == "torchscript" and [a["exporter"] for a in capture["attempts"]] == ["torchscript"]
        checked = capture["specialized"]["checked"]  # the gate ran at every range point
        shapes = checked["shapes"]
        assert {s["batch_size"] for s in shapes} >= {1, 2, 64} and {s[length] for s in shapes} >= {1, 7, end}
        # at each other shape its one set; parity judges every set again on the written graph
        sets = manifest["parity"]["shapes"]
        assert all(len(s["input_sets"]) == 1 for s in sets[1:]) and len(sets[0]["input_sets"]) > 1, sets
        # (the path probes, built once the trace warned on a value, are judged apart: other_paths)
        probes = (manifest["parity"]["trace_specialized"].get("other_paths") or {}).get("input_sets", 0)
        assert checked["input_sets"] == manifest["parity"]["input_sets"] + probes == manifest["parity"]["input_sets"] \
            + checked["path_variants"], (checked, probes)
        assert manifest["parity"]["passed"] and len(manifest["parity"]["shapes"]) == len(shapes)
        graph = onnx.load(str(out / "components" / name / "model.onnx"), load_external_data=False).graph
        inputs, outputs = _dims(graph.input), _dims(graph.output)
        if name == "prefill":
            assert set(map(tuple, inputs.values())) == {("batch_size", "sequence_length")}
            assert outputs["logits"] == ["batch_size", "sequence_length", 96]
            assert outputs["present.1.value"] == ["batch_size", 2, "sequence_length", 16]
        else:  # onnxsim does not rename input_ids' batch (it made it unk__0)
            assert inputs["input_ids"] == ["batch_size", 1] and inputs["position_ids"] == ["batch_size", 1]
            assert inputs["attention_mask"] == ["batch_size", "past_sequence_length + 1"]
            assert inputs["past_key_values.0.key"] == ["batch_size", 2, "past_sequence_length", 16]
            assert outputs["logits"] == ["batch_size", 1, 96]
            assert outputs["present.0.key"] == ["batch_size", 2, "past_sequence_length + 1", 16]
            # its warnings test sizes only (masking_utils' kv_length, a size passed as an argument; sdpa's
            # is_causal.item()): gated at the ranges' sizes, no probe (capture/shape_tests.py)
            assert checked["path_variants"] == 0 and "tests sizes only" in capture["specialized"]["probes"], capture


def test_traced_graphs_run_at_sizes_they_were_not_traced_at(traced):
    out, _, _ = traced
    model = tiny_decoder_gpt2(n_positions=32)
    ids = torch.randint(1, 96, (3, 11), generator=torch.Generator().manual_seed(3))
    feed = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "position_ids": torch.arange(11)[None].repeat(3, 1)}
    got = run_named(component_session(out, "prefill"), {k: v.numpy() for k, v in feed.items()})
    with torch.no_grad():
        want = DecoderPrefill(model.eval())(**feed)
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value.numpy(), atol=1e-4)


def _size_scaled(self, feed):
    """Prefill's logits divided by the prompt's length as a Python float: a trace bakes in the example's 7."""
    out = COMPUTE(self, feed)
    return {**out, "logits": out["logits"] / float(feed["input_ids"].shape[1])}


COMPUTE = DecoderPrefill.compute


def test_a_component_whose_trace_specialises_falls_back_to_dynamo(tmp_path, monkeypatch):
    """Prefill alone, exported as the bundle exports each component (its parity shapes from the plan)."""
    monkeypatch.setattr(DecoderPrefill, "compute", _size_scaled)
    plan = decoder_plan(tiny_decoder_gpt2(n_positions=16))
    prefill = plan.components[0]
    prefill.module.graph_shape_sets = shape_sets(plan, prefill, {}, False)
    result = api.export(prefill.module, tmp_path / "prefill", example_inputs=prefill.example_inputs,
                        export_format="onnx_bundle", num_random_inputs=1)
    attempts = result.manifest["capture"]["attempts"]
    assert [a["exporter"] for a in attempts] == ["torchscript", "dynamo"], attempts
    assert "traced graph not kept" in attempts[0]["note"] and "differs from the model" in attempts[0]["note"]
    assert result.manifest["capture"]["exporter"] == "dynamo" and result.ok, result.parity
    assert result.parity["shapes"]  # parity at the dimensions the dynamo graph kept (it fixes the length)


def _bart():
    import transformers

    torch.manual_seed(4)
    cfg = transformers.BartConfig(vocab_size=96, d_model=32, encoder_layers=2, decoder_layers=2,
                                  encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                  decoder_ffn_dim=64, max_position_embeddings=64)
    return transformers.BartForConditionalGeneration(cfg).eval()


def test_encoder_decoder_graphs_are_traced_checked_and_right_on_padded_rows(tmp_path):
    """BART's three graphs traced as the decoders' are (dynamo took 4-16 s a graph), each trace judged by parity at
    its range points; the traced encoder and decoder keep the mask path for rows the example did not pad."""
    from cann_export.hf.cache_wrappers import Seq2SeqDecoder, Seq2SeqEncoder

    model, out = _bart(), tmp_path / "bart"
    result = api.export_multi(model, out, export_format="onnx", num_random_inputs=1)
    assert result.ok, result.to_dict()
    for name in ("encoder", "decoder", "decoder_with_past"):
        manifest = json.loads((out / "components" / name / "manifest.json").read_text())
        assert [a["exporter"] for a in manifest["capture"]["attempts"]] == ["torchscript"], manifest["capture"]
        assert manifest["parity"]["passed"] and len(manifest["parity"]["shapes"]) > 1
    graph = onnx.load(str(out / "components" / "decoder" / "model.onnx"), load_external_data=False).graph
    outputs = _dims(graph.output)
    assert outputs["logits"] == ["batch_size", "decoder_sequence_length", 96]
    assert outputs["present.0.encoder.key"] == ["batch_size", 4, "encoder_sequence_length", 8]
    ids = torch.randint(1, 96, (3, 9), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[0, 4:], mask[2, 7:] = 0, 0  # rows padded at other lengths than any example
    enc = run_named(component_session(out, "encoder"), {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    with torch.no_grad():
        want = Seq2SeqEncoder(model)(input_ids=ids, attention_mask=mask)["last_hidden_state"]
    np.testing.assert_allclose(enc["last_hidden_state"], want.numpy(), atol=1e-4)
    start = torch.tensor([[2, 5, 6]] * 3)
    feed = {"input_ids": start, "encoder_attention_mask": mask, "encoder_hidden_states": want}
    got = run_named(component_session(out, "decoder"), {k: v.numpy() for k, v in feed.items()})
    with torch.no_grad():
        eager = Seq2SeqDecoder(model)(**feed)["logits"]
    np.testing.assert_allclose(got["logits"], eager.numpy(), atol=1e-4)
