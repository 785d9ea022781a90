"""Issue 19, dynamic shapes end to end on the gaps the first pass left: a multi-graph component's parity runs at
its dimensions' range ends and middle with inputs consistent across its graphs (decode's past is prefill's
output at that length, its mask one longer), reported per shape in its manifest; a user's ATC gear hint
(``dynamic_batch_size``, ``dynamic_dims``) moves parity to those gears; the fixed-length KV cache takes a fixed
batch above 1 (``--kv-cache static:N,batch=B``) and generates as transformers does with left padding."""
from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers
from click.testing import CliRunner
from safetensors.numpy import load_file

from cann_export import api
from cann_export.cli.main import cli
from cann_export.errors import OptionsError
from helpers.hf_models import tiny_decoder_gpt2

STEPS = 4


def _gpt2():
    return tiny_decoder_gpt2()


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("gears")


@pytest.fixture(scope="module")
def dynamic_bundle(root):
    """GPT-2 (positions 16) as prefill + decode with a growing cache: every dimension dynamic."""
    result = api.export_multi(_gpt2(), root / "gpt2", num_random_inputs=1)
    assert result.ok, result.to_dict()
    return root / "gpt2"


def _manifest(bundle, component):
    return json.loads((bundle / "components" / component / "manifest.json").read_text())


def test_component_parity_runs_at_each_dimensions_ends_and_middle(dynamic_bundle):
    prefill = [r["shape"] for r in _manifest(dynamic_bundle, "prefill")["parity"]["shapes"]]
    assert prefill == [{"batch_size": 2, "sequence_length": 7},  # the example's, then each dimension in turn
                       *({"batch_size": b, "sequence_length": 7} for b in (1, 32, 64)),
                       *({"batch_size": 2, "sequence_length": s} for s in (1, 8, 16))]
    rows = _manifest(dynamic_bundle, "decode")["parity"]["shapes"]
    assert [r["shape"] for r in rows][4:] == [{"batch_size": 2, "past_sequence_length": p} for p in (1, 8, 15)]
    assert all(r["fp32"] and r["device"] and r["passed"] for r in rows)
    assert api.validate(dynamic_bundle)["passed"] is True  # every shape re-derived from the stored sets


def test_a_component_range_widened_after_parity_is_refused(dynamic_bundle):
    from cann_export.bundle.graph_shape_check import component_shape_problems

    own = _manifest(dynamic_bundle, "decode")
    assert component_shape_problems("decode", own) == []
    hints = own["atc"]["hints"]
    hints["input_shape"] = hints["input_shape"].replace("1~15", "1~31").replace("2~16", "2~32")
    assert "a range changed after parity ran" in component_shape_problems("decode", own)[0]
    hints["input_shape"] = hints["input_shape"].replace("2~32", "2~16")  # the mask and the past disagree
    assert "another input's past_sequence_length has" in component_shape_problems("decode", own)[0]


def test_component_shape_sets_are_consistent_across_the_graphs(dynamic_bundle):
    """decode at past length P: a mask of P + 1, the past's sequence axis P, positions after it, and the past
    itself is prefill's cache at P tokens (the keys of a real prompt, not noise)."""
    decode = dynamic_bundle / "components" / "decode"
    labels = json.loads(json.dumps(_manifest(dynamic_bundle, "decode")["parity"]["shapes"]))
    sets = load_file(str(decode / "parity" / "inputs.safetensors"))
    for row in labels[1:]:
        b, p = row["shape"]["batch_size"], row["shape"]["past_sequence_length"]
        for s in row["input_sets"]:
            assert sets[f"{s}/attention_mask"].shape == (b, p + 1) and sets[f"{s}/attention_mask"].all()
            assert sets[f"{s}/past_key_values.1.value"].shape == (b, 2, p, 16)
            assert (sets[f"{s}/position_ids"] == p).all() and sets[f"{s}/input_ids"].shape == (b, 1)
    prefill = ort.InferenceSession(str(dynamic_bundle / "components" / "prefill" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    s = labels[-1]["input_sets"][0]  # past 15: its key is the prefill graph's on some 15-token prompt's ids
    key = sets[f"{s}/past_key_values.0.key"]
    assert np.abs(key).max() > 0.01 and prefill.get_inputs()[1].shape == ["batch_size", "sequence_length"]


def test_seq2seq_shapes_feed_each_graph_from_the_one_before():
    from cann_export.bundle import graph_shapes as gears
    from cann_export.hf.graph_plans import seq2seq_plan

    torch.manual_seed(2)
    cfg = transformers.T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                decoder_start_token_id=0, pad_token_id=0, eos_token_id=None)
    plan = seq2seq_plan(transformers.T5ForConditionalGeneration(cfg).eval())
    comp = plan.components[2]
    example, points, notes, _ = gears.points(comp.module, comp.example_inputs)
    assert example == {"batch_size": 2, "encoder_sequence_length": 7, "past_decoder_sequence_length": 2}
    assert {"batch_size": 2, "encoder_sequence_length": 1024, "past_decoder_sequence_length": 2} in points
    assert points[-1] == {"batch_size": 2, "encoder_sequence_length": 7, "past_decoder_sequence_length": 1024}
    assert any("4096" in n for n in notes)  # T5's relative positions range to 4096: parity stops at 1024, says so
    feed = gears.feed_at(plan, 2, {"batch_size": 3, "encoder_sequence_length": 5, "past_decoder_sequence_length": 4},
                         torch.Generator().manual_seed(0))
    assert feed["past_key_values.0.decoder.key"].shape == (3, 4, 4, 8)
    assert feed["past_key_values.1.encoder.value"].shape == (3, 4, 5, 8)
    assert feed["encoder_attention_mask"].shape == (3, 5) and feed["input_ids"].shape == (3, 1)
    with torch.no_grad():
        assert comp.module(**feed)["logits"].shape == (3, 1, 96)


def test_gear_hints_give_the_components_sizes():
    from cann_export.atc.hint_gears import hint_sizes
    from cann_export.bundle import graph_shapes as gears
    from cann_export.hf.graph_plans import decoder_plan

    plan = decoder_plan(_gpt2())
    decode = plan.components[1]
    _, points, _, _ = gears.points(decode.module, decode.example_inputs, {"dynamic_batch_size": "1,3"})
    assert [p["batch_size"] for p in points[:2]] == [1, 3] and all(p["batch_size"] == 2 for p in points[2:])
    _, points, notes, _ = gears.points(decode.module, decode.example_inputs,
                                       {"dynamic_batch_size": ",".join(map(str, range(1, 13)))})
    assert len(points) == gears.MAX_POINTS and points[0]["batch_size"] == 1 and "of the 14 shapes" in notes[0]
    assert points[-1] == {"batch_size": 2, "past_sequence_length": 15}  # the last range end kept
    # dynamic_dims: one value per -1 of --input_shape, in order; "past + 1" columns give the past length
    assert gears.slots(decode.module)[:4] == [("batch_size", 0), ("batch_size", 0), ("past_sequence_length", 1),
                                             ("batch_size", 0)]
    assert hint_sizes({"dynamic_dims": "1,4;3,12"}, [("batch", 0), ("seq", 1)]) == {"batch": [1, 3], "seq": [3, 11]}
    assert hint_sizes({"dynamic_dims": "1,4,9;3,12"}, [("batch", 0), ("seq", 0)]) == {}  # the lint names it


class Conv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return self.conv(x).mean((2, 3))


def test_a_batch_gear_hint_moves_single_graph_parity_to_its_gears(root):
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=1, max=16)
    program = torch.export.export(Conv().eval(), (torch.randn(2, 3, 8, 8),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(program, str(root / "conv.pt2"))
    out = root / "conv_hint"
    res = CliRunner().invoke(cli, [str(root / "conv.pt2"), "-o", str(out), "--no-sandbox", "--atc-hint",
                                   "dynamic_batch_size=1,3", "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    rows = manifest["parity"]["shapes"]
    assert [r["shape"] for r in rows] == [{"batch": 2}, {"batch": 1}, {"batch": 3}]  # not the range's 1, 8, 16
    assert all(r["fp32"] and r["device"] for r in rows)
    sets = load_file(str(out / "parity" / "inputs.safetensors"))
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    for row, size in zip(rows[1:], (1, 3), strict=True):
        feed = sets[f"{row['input_sets'][0]}/x"]
        assert feed.shape[0] == size and session.run(None, {"x": feed})[0].shape == (size, 4)
    assert "--dynamic_batch_size=1,3" in (out / "atc" / "convert.sh").read_text()
    assert api.validate(out)["passed"] is True  # validate re-derives the hint's gears as the parity shapes


def test_a_batch_gear_hint_on_a_static_source_makes_the_batch_dynamic(root):
    """A hint asks ATC for batch gears: a graph exported at the example's batch alone would not run at them."""
    out = root / "conv_static_hint"
    result = api.export(Conv(), out, input_shapes=["x:2,3,8,8"], atc_hints={"dynamic_batch_size": "1,3"})
    manifest = json.loads((out / "manifest.json").read_text())
    assert result.ok and [r["shape"] for r in manifest["parity"]["shapes"]] == [{"batch": 2}, {"batch": 1},
                                                                                {"batch": 3}]
    assert ort.InferenceSession(str(out / "model.onnx")).get_inputs()[0].shape == ["batch", 3, 8, 8]
    assert manifest["atc"]["dynamic"]["axes"][0]["source"] == "--atc-hint dynamic_batch_size"


@pytest.fixture(scope="module")
def static_batch(root):
    model = _gpt2()
    model.save_pretrained(root / "gpt2-dir")
    res = CliRunner().invoke(cli, [str(root / "gpt2-dir"), "-o", str(root / "static2"), "--kv-cache",
                                   "static:16,batch=2", "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return model, root / "static2"


def _run(session, feed):
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feed), strict=True))


def test_static_cache_with_batch_two_generates_left_padded_prompts_as_transformers(static_batch):
    model, bundle = static_batch
    top = json.loads((bundle / "manifest.json").read_text())
    assert top["run"]["cache"] == "static:16,batch=2" and top["run"]["batch"] == 2
    prefill, decode = (ort.InferenceSession(str(bundle / "components" / c / "model.onnx"),
                                            providers=["CPUExecutionProvider"]) for c in ("prefill", "decode"))
    assert [i.shape for i in decode.get_inputs()][:3] == [[2, 1], [2, 17], [2, 1]]
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(1, 96, (n,), generator=gen) for n in (5, 3)]
    lengths, slots = [5, 3], np.zeros((2, 16), np.int64)
    ids = np.zeros((2, 16), np.int64)
    for row, p in enumerate(prompts):
        slots[row, 16 - len(p):], ids[row, 16 - len(p):] = 1, p.numpy()
    out = _run(prefill, {"input_ids": ids, "attention_mask": slots, "position_ids": np.clip(slots.cumsum(-1) - 1, 0,
                                                                                              None)})
    tokens = []
    for step in range(STEPS):
        tokens.append(out["logits"][:, -1].argmax(-1))
        if step == STEPS - 1:
            break
        past = {k.replace("present.", "past_key_values.", 1): v for k, v in out.items() if k != "logits"}
        out = _run(decode, {"input_ids": tokens[-1][:, None].astype(np.int64),
                            "attention_mask": np.concatenate([slots, np.ones((2, 1), np.int64)], 1),
                            "position_ids": np.array([[n + step] for n in lengths], np.int64), **past})
        slots = np.concatenate([slots[:, 1:], np.ones((2, 1), np.int64)], 1)
    padded = torch.zeros(2, 5, dtype=torch.long)
    mask = torch.zeros(2, 5, dtype=torch.long)
    for row, p in enumerate(prompts):
        padded[row, 5 - len(p):], mask[row, 5 - len(p):] = p, 1
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        expected = model.generate(input_ids=padded, attention_mask=mask, max_new_tokens=STEPS, do_sample=False,
                                  pad_token_id=0)[:, -STEPS:]
    assert np.stack(tokens, 1).tolist() == expected.tolist()
    assert api.validate(bundle)["passed"] is True  # the run notes re-derived with the graphs' batch


@pytest.mark.parametrize("value", ["static:16,batch=0", "static:16,batch=x", "static:16,rows=2", "static:16,"])
def test_bad_static_batch_is_refused_naming_the_spelling(value, tmp_path):
    with pytest.raises(OptionsError, match=r"static:N\[,batch=B\]"):
        api.export_multi(_gpt2(), tmp_path / "x", kv_cache=value)
    res = CliRunner().invoke(cli, ["m.pt2", "--kv-cache", value])
    assert res.exit_code == 2 and "--kv-cache" in res.output


@pytest.mark.parametrize("edit", [
    lambda own: own["atc"].update(hints=["input_shape"]),
    lambda own: own["atc"].update(hints="input_ids:1~2"),
    lambda own: own["model"]["inputs"][0].update(shape=5),
    lambda own: own["model"]["inputs"][1].update(shape=["batch_size + x", "past_sequence_length + 1"]),
], ids=["hints-list", "hints-str", "shape-int", "dim-offset-not-int"])
def test_hostile_component_shapes_are_refused_not_a_crash(dynamic_bundle, tmp_path, edit):
    """A component manifest edited by hand (not what an export writes): exit 2 naming it, never an internal error."""
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(dynamic_bundle, copy)
    f = copy / "components" / "decode" / "manifest.json"
    own = json.loads(f.read_text())
    edit(own)
    f.write_text(json.dumps(own))
    r = CliRunner().invoke(cli, ["validate", str(copy)])
    assert r.exit_code == 2, r.output
    assert "components/decode/manifest.json" in r.output


def test_a_million_gear_hint_in_a_component_manifest_is_no_million_shapes(dynamic_bundle):
    """A hostile dynamic_batch_size of 200k gears (ATC takes 2..100) re-derives no shapes from it, at once."""
    import time

    from cann_export.bundle.graph_shape_check import component_shape_problems

    own = _manifest(dynamic_bundle, "decode")
    own["atc"]["hints"]["dynamic_batch_size"] = ",".join(map(str, range(1, 200_000)))
    start = time.perf_counter()
    problems = component_shape_problems("decode", own)
    assert time.perf_counter() - start < 5
    assert all(len(p) < 1000 for p in problems)  # the gears are not the hint ATC takes: the lint refuses it
