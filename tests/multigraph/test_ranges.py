"""Issue 19: a multi-graph bundle's ranges narrowed by dimension name (``--dynamic batch_size=1..8``, one graph's:
``decode:past_sequence_length=4..10``) drive the torch.export Dims, each component's ATC ranges and its parity
shapes, which validate re-derives; ``--atc-hint COMPONENT:KEY=VALUE`` reaches one component; bad ranges are
refused before the model loads; an ATC range never lands on a dim the exported graph fixed."""
from __future__ import annotations

import dataclasses
import json

import onnxruntime as ort
import pytest
import torch
import transformers
from click.testing import CliRunner

from cann_export import api
from cann_export.cli.main import cli
from cann_export.errors import OptionsError
from helpers.hf_models import tiny_decoder_gpt2


def _gpt2():
    return tiny_decoder_gpt2()


def _profile(slots, batch, past):
    return ",".join(str((batch if dim == "batch_size" else past) + plus) for dim, plus in slots)


@pytest.fixture(scope="module")
def narrowed(tmp_path_factory):
    """GPT-2 (positions 16): batch 1..8 and sequence 1..12 everywhere, decode's past 4..10, and ATC gears
    (dynamic_dims) for decode alone."""
    from cann_export.bundle import graph_shapes as gears
    from cann_export.hf.graph_plans import decoder_plan

    model = _gpt2()
    slots = gears.slots(decoder_plan(model).components[1].module)
    dims = ";".join(_profile(slots, b, p) for b, p in ((1, 4), (2, 7), (4, 10)))
    out = tmp_path_factory.mktemp("ranges") / "gpt2"
    result = api.export_multi(model, out, num_random_inputs=1,
                              dynamic=["batch_size=1..8", "sequence_length=1..12", "decode:past_sequence_length=4..10"],
                              atc_hints={"decode:input_format": "ND", "decode:dynamic_dims": dims})
    assert result.ok, result.to_dict()
    return out


def _own(bundle, name):
    return json.loads((bundle / "components" / name / "manifest.json").read_text())


def test_narrowed_ranges_reach_atc_parity_and_the_graph(narrowed):
    prefill = _own(narrowed, "prefill")
    assert prefill["atc"]["hints"]["input_shape"].startswith("input_ids:1~8,1~12;attention_mask:1~8,1~12")
    assert "1~8,1~12" in (narrowed / "components" / "prefill" / "atc" / "convert.sh").read_text()
    assert [r["shape"] for r in prefill["parity"]["shapes"]] == [
        {"batch_size": 2, "sequence_length": 7}, *({"batch_size": b, "sequence_length": 7} for b in (1, 4, 8)),
        *({"batch_size": 2, "sequence_length": s} for s in (1, 6, 12))]
    # the graph holds the narrowed range: batch 8 runs (torch.export's Dim max), the position table is untouched
    session = ort.InferenceSession(str(narrowed / "components" / "prefill" / "model.onnx"))
    ids = torch.ones(8, 12, dtype=torch.long).numpy()
    assert session.run(["logits"], {"input_ids": ids, "attention_mask": ids,
                                    "position_ids": torch.arange(12).repeat(8, 1).numpy()})[0].shape == (8, 12, 96)


def test_a_component_hint_reaches_that_component_only(narrowed):
    decode, prefill = _own(narrowed, "decode"), _own(narrowed, "prefill")
    assert "dynamic_dims" in decode["atc"]["hints"] and "dynamic_dims" not in prefill["atc"]["hints"]
    assert "--dynamic_dims=" in (narrowed / "components" / "decode" / "atc" / "convert.sh").read_text()
    assert "--dynamic_dims" not in (narrowed / "components" / "prefill" / "atc" / "convert.sh").read_text()
    shapes = [r["shape"] for r in decode["parity"]["shapes"]]  # the gears, not the range's ends
    assert {s["past_sequence_length"] for s in shapes} == {4, 7, 10} and {s["batch_size"] for s in shapes} == {1, 2, 4}
    assert all(r["passed"] for r in decode["parity"]["shapes"])
    assert api.validate(narrowed)["passed"] is True


@pytest.mark.parametrize("dynamic, hints, words", [
    (["batch_size=8..1"], {}, "empty or inverted"),
    (["batch=1..8"], {}, "'batch' is not a dimension"),
    (["sequence_length:1..8"], {}, "does not name a dimension"),
    (["sequence_length=1-4"], {}, "is neither a range LO..HI nor gears"),
    (["sequence_length=1,2,x"], {}, "is not a list of gears"),
    (["batch_size=2,2"], {}, "1 distinct gear(s)"),
    (["batch_size=1,4"], {}, "must hold; add the gear 2"),
    (["batch_size=1,2,128"], {}, "ranges over 1..64 at most"),
    (["batch_size=1,2,4"], {"decode:dynamic_dims": "1"}, "both give component 'decode' its ATC dynamic form"),
    (["encoder:batch_size=1..8"], {}, "this bundle (decoder-with-past) has no component 'encoder'"),
    (["prefill:past_sequence_length=1..8"], {}, "has no dynamic dimension 'past_sequence_length'"),
    (["sequence_length=1..100"], {}, "ranges over 1..16 at most"),
    (["batch_size=4..8"], {}, "captured at batch_size 2"),
    ([], {"decoder:dynamic_batch_size": "1,2"}, "has no component 'decoder'"),
    ([], {"nope:dynamic_batch_size": "1,2"}, "'nope' is not a component"),
    ([], {"decode:no_such_hint": "1"}, "unknown ATC hint 'no_such_hint'"),
])
def test_bad_ranges_and_hints_are_refused_with_nothing_written(tmp_path, dynamic, hints, words):
    with pytest.raises(OptionsError) as e:
        api.export_multi(_gpt2(), tmp_path / "out", dynamic=dynamic, atc_hints=hints)
    assert words in str(e.value) and not (tmp_path / "out").exists()


def test_cli_refuses_a_bad_range_before_the_model_loads(tmp_path):
    """No model directory exists: the flag is refused first (exit 2), naming it."""
    res = CliRunner().invoke(cli, [str(tmp_path / "missing"), "--task", "text-generation-with-past", "-o",
                                   str(tmp_path / "out"), "--dynamic", "batch_size=9..2"])
    assert res.exit_code == 2 and "--dynamic 'batch_size=9..2'" in res.output and not (tmp_path / "out").exists()


def test_atc_ranges_follow_a_dim_the_exported_graph_fixed(tmp_path):
    """T5's decoder captured at one token (its example before it took two): torch.export fixes the length, and
    the ATC command says 1 there, not the module's declared 1~4096."""
    from cann_export.bundle import graph_shapes as gears
    from cann_export.hf.graph_plans import seq2seq_plan

    torch.manual_seed(2)
    cfg = transformers.T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2,
                                decoder_start_token_id=0, pad_token_id=0, eos_token_id=None)
    plan = seq2seq_plan(transformers.T5ForConditionalGeneration(cfg).eval(), with_past=False)
    comp = plan.components[1]
    comp.example_inputs["input_ids"] = comp.example_inputs["input_ids"][:, :1]
    hints = {"input_shape": comp.module.shape_ranges(comp.example_inputs, brackets=False)}
    assert hints["input_shape"].startswith("input_ids:1~64,1~")
    # the decoder alone (no encoder feeding its sets): the budget's cost as the standalone check below counts it
    solo = dataclasses.replace(plan, connections=[])
    comp.module.graph_shape_sets = gears.shape_sets(solo, comp, hints)
    result = api.export(comp.module, tmp_path / "dec", example_inputs=comp.example_inputs, atc_hints=hints,
                        num_random_inputs=1)
    own = json.loads((tmp_path / "dec" / "manifest.json").read_text())
    assert own["atc"]["hints"]["input_shape"].startswith("input_ids:1~64,1;")
    assert "input_ids:1~64,1;" in (tmp_path / "dec" / "atc" / "convert.sh").read_text()
    assert result.ok and api.validate(tmp_path / "dec")["passed"] is True
    from cann_export.bundle.graph_shape_check import component_shape_problems

    assert component_shape_problems("decoder", own) == []
    own["atc"]["hints"]["input_shape"] = hints["input_shape"]  # the declared range back on the fixed dim: refused
    assert "is fixed at 1 in the graph" in component_shape_problems("decoder", own)[0]
